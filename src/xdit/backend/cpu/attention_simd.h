// AVX-512 helpers of the CPU attention kernel: the softmax's 2^t and the exact bf16 rounding of
// its output. The softmax works in base 2 (scores are pre-multiplied by scale·log2(e)), so exp2
// is the only transcendental the inner loop needs.
#pragma once

// GCC 12 reports -W(maybe-)uninitialized inside the AVX-512 intrinsics that start from an
// undefined register (_mm512_max_ps, _mm512_roundscale_ps, ...; GCC bug 105593, fixed in GCC 13).
// The warning is reported at the intrinsic headers' lines, so it is silenced for those lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace xdit::cpu {

// 2^t for 16 floats, within 2 ulp of the exact value over the normal range. Results in the
// subnormal range are scaled with one rounding (no flush to zero), t <= -151 gives 0 (so -inf
// gives 0), t >= 129 gives +inf, NaN stays NaN.
inline __m512 exp2_ps(__m512 t) {
  // vmaxps/vminps return their second operand when either is NaN: t comes second so NaN survives.
  t = _mm512_max_ps(_mm512_set1_ps(-151.0f), t);
  t = _mm512_min_ps(_mm512_set1_ps(129.0f), t);
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

// 16 floats to bf16 with round-to-nearest-even, bit for bit xdit::f32_to_bf16: NaN is made quiet
// and subnormals are kept (vcvtneps2bf16 would flush them).
inline __m256i f32_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet_nan));
}

}  // namespace xdit::cpu
