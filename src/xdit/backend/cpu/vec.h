// Building blocks for the CPU elementwise kernels (AVX-512F/BW/VL/DQ/BF16, which -march=native gives
// on the target machines):
//  - 16-lane loads from f32 or bf16 storage into f32 registers and stores back, with masked tails,
//    and convert_row built on them; the bf16 store rounds to nearest even exactly like
//    xdit::f32_to_bf16 (denormals kept, NaN quieted);
//  - exp, sigmoid and the standard normal CDF in f32 (within 2, 3 and 8 ulp), never overflowing;
//  - for_each_run, which walks several equally-shaped strided operands in runs along the innermost
//    dim and splits the work among threads, and map_run, which applies a vector function over a run.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512DQ__) || \
    !defined(__AVX512BF16__)
#error "the CPU kernels need AVX-512 (F, BW, VL, DQ, BF16): build with XDIT_NATIVE=ON on such a machine"
#endif

// GCC 12 reports -W(maybe-)uninitialized inside the AVX-512 intrinsics that start from an undefined
// register (GCC bug 105593, fixed in GCC 13), at the intrinsic headers' lines: silenced for those
// lines only. Include this header first so that this is where <immintrin.h> is first read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/error.h"
#include "xdit/core/strided.h"
#include "xdit/core/tensor.h"
#include "xdit/core/threading.h"

namespace xdit::cpu {

inline constexpr int64_t kLanes = 16;
inline constexpr __mmask16 kAllLanes = 0xffff;

// The first min(n, 16) lanes (n >= 0).
inline __mmask16 first_lanes(int64_t n) { return n >= kLanes ? kAllLanes : static_cast<__mmask16>((1u << n) - 1u); }

// ---- Loads and stores. With kAllLanes the plain (unmasked) instructions are used.

inline __m512 load16(const float* p, __mmask16 lanes = kAllLanes) {
  return lanes == kAllLanes ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(lanes, p);
}

inline __m512 load16(const bf16_t* p, __mmask16 lanes = kAllLanes) {
  const __m256i half =
      lanes == kAllLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(lanes, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline void store16(float* p, __m512 v, __mmask16 lanes = kAllLanes) {
  if (lanes == kAllLanes) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, lanes, v);
  }
}

// f32 -> bf16 bits, exactly as xdit::f32_to_bf16: round to nearest even, NaN quieted, denormals
// kept. vcvtneps2bf16 does the same except that it flushes denormal inputs to zero, so it is used
// unless a lane is denormal (then the integer rounding below runs).
inline __m256i f32_to_bf16_bits(__m512 v) {
  if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(v);
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i quiet_nan = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet_nan), 16));
}

inline void store16(bf16_t* p, __m512 v, __mmask16 lanes = kAllLanes) {
  const __m256i bits = f32_to_bf16_bits(v);
  if (lanes == kAllLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  } else {
    _mm256_mask_storeu_epi16(p, lanes, bits);
  }
}

// dst[i] = src[i] for i < n, between f32 and bf16 storage (either way, or f32 to f32), 16 lanes
// at a time; bf16 results are rounded as by xdit::f32_to_bf16.
template <typename TIn, typename TOut>
void convert_row(const TIn* src, int64_t n, TOut* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store16(dst + i, load16(src + i));
  if (i < n) {
    const __mmask16 lanes = first_lanes(n - i);
    store16(dst + i, load16(src + i, lanes), lanes);
  }
}

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bf16_to_f32(v.bits); }

// 16 elements p[0], p[stride], ..., of which the masked-off lanes read as 0. Stride 1 is a vector
// load, stride 0 a broadcast (an expanded operand), anything else a gather.
template <typename T>
__m512 load16_strided(const T* p, int64_t stride, __mmask16 lanes = kAllLanes) {
  if (stride == 1) return load16(p, lanes);
  if (stride == 0) return _mm512_set1_ps(to_f32(*p));
  alignas(64) float gathered[kLanes] = {};
  for (int64_t i = 0; i < kLanes; ++i) {
    if ((lanes >> i) & 1u) gathered[i] = to_f32(p[i * stride]);
  }
  return _mm512_load_ps(gathered);
}

// ---- Math, all in f32 lanes; NaN inputs give NaN.

// min(max(x, lo), hi) keeping NaN: vmaxps/vminps return their second operand when either is NaN.
inline __m512 clamp_ps(__m512 x, float lo, float hi) {
  return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x));
}

// e^(hi + lo) for |lo| <= 4: lo carries the low part of an argument that does not fit one float
// (normal_cdf passes -x²/2 split exactly). Cody-Waite reduction hi + lo = n·ln2 + r, |r| <= ln2/2,
// then Cephes' expf polynomial (relative error 1.4e-7) and an exact scaling by 2^n, which rounds
// subnormal results once and gives +inf past 88.72 and 0 below -103.97.
inline __m512 exp_of_sum_ps(__m512 hi, __m512 lo) {
  hi = clamp_ps(hi, -120.0f, 89.0f);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_add_ps(hi, lo), _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 = 0.693359375 - 2.12194440e-4; the first part has 9 significant bits, so n·part is exact.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), hi);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  r = _mm512_add_ps(r, lo);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// e^x within 2 ulp for normal results; -inf gives 0, +inf gives +inf.
inline __m512 exp_ps(__m512 x) { return exp_of_sum_ps(x, _mm512_setzero_ps()); }

// 1 / (1 + e^-x), computed from e^-|x| so that neither side overflows and tiny results keep their
// relative accuracy (within 3 ulp).
inline __m512 sigmoid_ps(__m512 x) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __mmask16 non_negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 numerator = _mm512_mask_blend_ps(non_negative, e, _mm512_set1_ps(1.0f));
  return _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// Φ(x) = P(N(0,1) <= x) = erfc(-x/√2)/2, with relative accuracy in the lower tail (where
// (1 + erf(x/√2))/2 would cancel). erfc(z) = t·exp(-z² + P(t)), t = 1/(1 + z/2), with the
// Chebyshev fit P of Numerical Recipes' erfcc (fractional error < 1.2e-7 for all z >= 0);
// -z² = -x²/2 is formed exactly as a float pair so its rounding does not reach the result.
// Measured within 8 ulp (relative error < 1e-6) wherever the result is a normal float.
inline __m512 normal_cdf_ps(__m512 x) {
  // Φ(-20) < 1e-88: beyond |x| = 20 the float result is 0 or 1.
  const __m512 a = _mm512_min_ps(_mm512_set1_ps(20.0f), _mm512_abs_ps(x));
  const __m512 z = _mm512_mul_ps(a, _mm512_set1_ps(0.707106781186547524f));
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(z, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
  __m512 p = _mm512_set1_ps(0.17087277f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
  const __m512 square = _mm512_mul_ps(a, a);
  const __m512 square_error = _mm512_fmsub_ps(a, a, square);  // a² = square + square_error exactly
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 lo = _mm512_fnmadd_ps(half, square_error, p);
  const __m512 half_erfc =
      _mm512_mul_ps(half, _mm512_mul_ps(t, exp_of_sum_ps(_mm512_mul_ps(_mm512_set1_ps(-0.5f), square), lo)));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc);
}

// ---- Loops over strided operands.

// An operand of an elementwise loop: element i of the run is p[i * stride].
template <typename T>
struct StridedRun {
  const T* p;
  int64_t stride;
  __m512 load(int64_t i, __mmask16 lanes) const { return load16_strided(p + i * stride, stride, lanes); }
};

// out[i] = f(inputs[i]...) for i < n, with out dense and f mapping one __m512 per input to one.
template <typename TOut, typename F, typename... In>
void map_run(TOut* out, int64_t n, F&& f, const In&... inputs) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store16(out + i, f(inputs.load(i, kAllLanes)...));
  if (i < n) {
    const __mmask16 lanes = first_lanes(n - i);
    store16(out + i, f(inputs.load(i, lanes)...), lanes);
  }
}

// Visits the elements of `shape` in row-major order as runs along the innermost dim, the range of
// elements split among threads (at least `grain` elements each). For each run, fn(offset, stride,
// length) gets every operand's element offset of the run's first element and its stride along the
// run. Dims are coalesced first (and size-1 dims dropped), so dense operands give long runs.
template <size_t N, typename Fn>
void for_each_run(Shape shape, std::array<Shape, N> strides, int64_t grain, Fn&& fn) {
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  std::vector<Shape*> stride_sets;
  for (Shape& s : strides) stride_sets.push_back(&s);
  coalesce_dims(shape, stride_sets);
  const int64_t outer_dims = static_cast<int64_t>(shape.size()) - 1;
  const int64_t inner = shape.back();
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = strides[k].back();

  parallel_for(total, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(static_cast<size_t>(outer_dims));
    std::array<int64_t, N> row_offset{};
    int64_t row = begin / inner;
    int64_t column = begin % inner;
    for (int64_t d = outer_dims - 1; d >= 0; --d) {
      index[d] = row % shape[d];
      row /= shape[d];
      for (size_t k = 0; k < N; ++k) row_offset[k] += index[d] * strides[k][d];
    }
    for (int64_t position = begin; position < end;) {
      const int64_t length = std::min(inner - column, end - position);
      std::array<int64_t, N> offset;
      for (size_t k = 0; k < N; ++k) offset[k] = row_offset[k] + column * inner_stride[k];
      fn(offset, inner_stride, length);
      position += length;
      column = 0;
      for (int64_t d = outer_dims - 1; d >= 0; --d) {
        for (size_t k = 0; k < N; ++k) row_offset[k] += strides[k][d];
        if (++index[d] < shape[d]) break;
        for (size_t k = 0; k < N; ++k) row_offset[k] -= shape[d] * strides[k][d];
        index[d] = 0;
      }
    }
  });
}

// fn(float{}) or fn(bf16_t{}) for an F32 or BF16 dtype: lets a kernel template name its storage type.
template <typename Fn>
decltype(auto) visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32:
      return fn(float{});
    case DType::BF16:
      return fn(bf16_t{});
    default:
      fail("cpu kernel: dtype ", dtype_name(dtype), " is not f32 or bf16");
  }
}

}  // namespace xdit::cpu
