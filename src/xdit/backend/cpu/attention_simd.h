// The softmax's 2^t for the CPU attention kernel (AVX-512). The softmax works in base 2 (scores
// are pre-multiplied by scale·log2(e)), so exp2 is the only transcendental its inner loop needs.
#pragma once

#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

namespace xdit::cpu {

// 2^t for 16 floats, within 2 ulp of the exact value over the normal range. Results in the
// subnormal range are scaled with one rounding (no flush to zero), t <= -151 gives 0 (so -inf
// gives 0), t >= 129 gives +inf, NaN stays NaN.
inline __m512 exp2_ps(__m512 t) {
  t = clamp_ps(t, -151.0f, 129.0f);
  // t = n + f with integer n and |f| <= 1/2 (the subtraction is exact), 2^t = 2^f · 2^n.
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  // 2^f on [-1/2, 1/2]: the degree-6 minimax polynomial of Cephes' exp2f (relative error 1.7e-7).
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace xdit::cpu
