#include "xdit/backend/cpu/gemm_fp8.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "xdit/backend/cpu/gemm_core.h"
#include "xdit/core/strided.h"
#include "xdit/core/threading.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define XDIT_FP8_AVX512 1
#endif

namespace xdit::cpu {

namespace {

// The FP8 GEMM runs in tiles: a panel of weight rows (output columns) dequantized by one thread,
// times a block of x's rows. The panel is sized to stay in that core's cache while it is used for
// every row block, and the tile's output to stay there until it is copied out.
constexpr int64_t kPanelBytes = int64_t{3} << 19;  // 1.5 MiB: 256 bf16 rows of K = 3072
constexpr int64_t kPanelRowMultiple = 16;
constexpr int64_t kTileOutputBytes = int64_t{1} << 19;

bool is_e4m3(DType fp8) { return fp8 == DType::F8E4M3; }

#ifdef XDIT_FP8_AVX512

__mmask16 tail_mask(int64_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

// 16 fp8 codes, zero-extended to 16-bit lanes, times `scale` as f32. The codes become f16 bit
// patterns: an e5m2 code is the high byte of the f16 of the same value; an e4m3 code shifted
// into the f16 exponent and mantissa fields is its value times 2^-8, for normals and subnormals
// alike. Both steps before the scale multiply are exact, so each result is rounded once.
__m512 fp8x16_to_f32(__m256i codes, bool e4m3, __m512 scale) {
  if (!e4m3) return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_slli_epi16(codes, 8)), scale);
  const __m256i magnitude = _mm256_and_si256(codes, _mm256_set1_epi16(0x7f));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(codes, _mm256_set1_epi16(0x80)), 8);
  const __m256i half = _mm256_or_si256(_mm256_slli_epi16(magnitude, 7), sign);
  const __m512 value = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(magnitude, _mm256_set1_epi16(0x7f));
  return _mm512_mask_mov_ps(_mm512_mul_ps(value, scale), nan,
                            _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
}

// Round to nearest even, NaN quieted: the same bits as xdit::f32_to_bf16, denormals included
// (which is why this does not use _mm512_cvtneps_pbh).
__m256i f32x16_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet_nan));
}

// The encoder of a saturating fp8 format with `kManBits` mantissa bits and exponent bias `kBias`.
template <int kManBits, int kBias, uint32_t kMaxCode, uint32_t kNanCode>
__m128i f32x16_to_fp8(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  // Normal range: round the f32 mantissa to kManBits bits (nearest even) and rebias the
  // exponent; overflow and infinity clamp to the largest finite code.
  constexpr int kShift = 23 - kManBits;
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(magnitude, kShift), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32((1 << (kShift - 1)) - 1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(magnitude, bias), kShift);
  const __m512i normal = _mm512_min_epu32(_mm512_sub_epi32(rounded, _mm512_set1_epi32((127 - kBias) << kManBits)),
                                          _mm512_set1_epi32(kMaxCode));
  // Below the smallest normal the spacing is fixed: the code is |v| / smallest subnormal, rounded.
  const __m512 in_units = _mm512_mul_ps(_mm512_castsi512_ps(magnitude),
                                        _mm512_set1_ps(std::ldexp(1.0f, kBias - 1 + kManBits)));
  const __m512i subnormal = _mm512_cvt_roundps_epi32(in_units, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 is_subnormal = _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32((128 - kBias) << 23));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  __m512i code = _mm512_mask_mov_epi32(normal, is_subnormal, subnormal);
  code = _mm512_mask_mov_epi32(code, is_nan, _mm512_set1_epi32(kNanCode));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

__m128i f32x16_to_fp8(__m512 v, bool e4m3) {
  return e4m3 ? f32x16_to_fp8<3, 7, 0x7e, 0x7f>(v) : f32x16_to_fp8<2, 15, 0x7b, 0x7e>(v);
}

#else

float fp8_to_f32(uint8_t code, bool e4m3) { return e4m3 ? f8e4m3_to_f32(code) : f8e5m2_to_f32(code); }

#endif  // XDIT_FP8_AVX512

// max |src[i]|, with `finite` telling whether every value was finite.
float abs_max(const float* src, int64_t n, bool& finite) {
#ifdef XDIT_FP8_AVX512
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __m512 amax = _mm512_setzero_ps();
  __mmask16 non_finite = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? __mmask16{0xffff} : tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(mask, src + i);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    non_finite |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exponent), exponent);
  }
  finite = non_finite == 0;
  return _mm512_reduce_max_ps(amax);
#else
  float amax = 0.0f;
  finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(src[i]);
    amax = a > amax ? a : amax;
    finite &= a <= FLT_MAX;
  }
  return amax;
#endif
}

// `total` split into `count` parts of `size` (the last one possibly smaller), each at most about
// `target` and a multiple of `multiple`, as equal as those allow so no part is a sliver.
struct Split {
  int64_t size, count;
};
Split balanced_split(int64_t total, int64_t target, int64_t multiple) {
  const int64_t parts = (total + target - 1) / target;
  const int64_t even = (total + parts - 1) / parts;
  const int64_t size = std::min(total, (even + multiple - 1) / multiple * multiple);
  return {size, (total + size - 1) / size};
}

}  // namespace

void dequantize_fp8(const uint8_t* src, DType fp8, float scale, float* dst, int64_t n) {
  const bool e4m3 = is_e4m3(fp8);
#ifdef XDIT_FP8_AVX512
  const __m512 scale_v = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm512_storeu_ps(dst + i, fp8x16_to_f32(codes, e4m3, scale_v));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    const __m256i codes = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mask, src + i));
    _mm512_mask_storeu_ps(dst + i, mask, fp8x16_to_f32(codes, e4m3, scale_v));
  }
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = fp8_to_f32(src[i], e4m3) * scale;
#endif
}

void dequantize_fp8(const uint8_t* src, DType fp8, float scale, uint16_t* dst_bf16, int64_t n) {
  const bool e4m3 = is_e4m3(fp8);
#ifdef XDIT_FP8_AVX512
  const __m512 scale_v = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst_bf16 + i), f32x16_to_bf16(fp8x16_to_f32(codes, e4m3, scale_v)));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    const __m256i codes = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mask, src + i));
    _mm256_mask_storeu_epi16(dst_bf16 + i, mask, f32x16_to_bf16(fp8x16_to_f32(codes, e4m3, scale_v)));
  }
#else
  for (int64_t i = 0; i < n; ++i) dst_bf16[i] = f32_to_bf16(fp8_to_f32(src[i], e4m3) * scale);
#endif
}

void quantize_fp8(const float* src, float scale, DType fp8, uint8_t* dst, int64_t n) {
  const bool e4m3 = is_e4m3(fp8);
#ifdef XDIT_FP8_AVX512
  const __m512 scale_v = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 quotient = _mm512_div_ps(_mm512_loadu_ps(src + i), scale_v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), f32x16_to_fp8(quotient, e4m3));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    const __m512 quotient = _mm512_div_ps(_mm512_maskz_loadu_ps(mask, src + i), scale_v);
    _mm_mask_storeu_epi8(dst + i, mask, f32x16_to_fp8(quotient, e4m3));
  }
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = e4m3 ? f32_to_f8e4m3(src[i] / scale) : f32_to_f8e5m2(src[i] / scale);
#endif
}

void quantize_fp8_rows(const Tensor& weight, const Tensor& data, const Tensor& scale) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const DType fp8 = data.dtype();
  const float fp8_max = is_e4m3(fp8) ? kF8E4M3Max : kF8E5M2Max;
  const bool read_in_place = weight.dtype() == DType::F32 && weight.stride(1) == 1;
  const bool dense_bf16 = weight.dtype() == DType::BF16 && weight.stride(1) == 1;
  const auto* weight_bytes = static_cast<const char*>(weight.raw_data());
  const int64_t row_bytes = weight.stride(0) * static_cast<int64_t>(dtype_size(weight.dtype()));
  auto* codes = data.data<uint8_t>();
  auto* scales = scale.data<float>();
  std::atomic<int64_t> non_finite_row{-1};

  parallel_for(n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> converted(read_in_place ? 0 : static_cast<size_t>(k));
    for (int64_t r = begin; r < end; ++r) {
      const float* row = reinterpret_cast<const float*>(weight_bytes + r * row_bytes);
      if (dense_bf16) {
        const auto* bits = reinterpret_cast<const uint16_t*>(weight_bytes + r * row_bytes);
        for (int64_t i = 0; i < k; ++i) converted[i] = bf16_to_f32(bits[i]);
        row = converted.data();
      } else if (!read_in_place) {
        strided_copy(weight_bytes + r * row_bytes, weight.dtype(), {weight.stride(1)}, converted.data(), DType::F32,
                     {1}, {k});
        row = converted.data();
      }
      bool finite = true;
      const float amax = abs_max(row, k, finite);
      if (!finite) non_finite_row = r;
      // An all-zero row (or one so small that amax / fp8 max underflows) keeps scale 1.
      const float row_scale = amax / fp8_max > 0.0f ? amax / fp8_max : 1.0f;
      scales[r] = row_scale;
      quantize_fp8(row, row_scale, fp8, codes + r * k, k);
    }
  });
  XDIT_CHECK(non_finite_row < 0, "quantize_fp8_per_channel: row ", non_finite_row.load(), " of weight ",
             shape_str(weight.shape()), " holds a non-finite value");
}

void fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& bias, const Tensor& out) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const Tensor codes = weight.stride(1) == 1 ? weight : weight.contiguous();
  const Tensor dense_scale = scale.contiguous();
  const float* scales = dense_scale.data<float>();
  const DType fp8 = weight.dtype();
  const DType dtype = x.dtype();
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  Tensor x2 = x.reshape({-1, k});
  if (x2.stride(1) != 1) x2 = x2.contiguous();
  const int64_t m = x2.size(0);
  const auto* x_bytes = static_cast<const char*>(x2.raw_data());
  auto* out_bytes = static_cast<char*>(out.raw_data());  // a fresh contiguous [..., N]
  const auto* bias_bytes = bias.defined() ? static_cast<const char*>(bias.raw_data()) : nullptr;
  const int64_t bias_element = bias.defined() ? static_cast<int64_t>(dtype_size(bias.dtype())) : 0;

  const Split panels = balanced_split(n, std::max<int64_t>(1, kPanelBytes / (k * element)), kPanelRowMultiple);
  const Split tiles = balanced_split(m, std::max<int64_t>(1, kTileOutputBytes / (panels.size * element)), 1);
  const int64_t tile_count = panels.count * tiles.count;
  // Whole panels per scheduling chunk when there are enough to share, single tiles otherwise.
  const int64_t chunk = panels.count >= 2 * num_threads() ? tiles.count : 1;
  std::exception_ptr error;

#pragma omp parallel
  {
    // Each thread dequantizes into its own panel, which stays in its cache for all the tiles
    // it computes with it; oneDNN runs single-threaded inside this parallel region.
    const Tensor panel = Tensor::empty({panels.size, k}, dtype);
    const Tensor tile_out = Tensor::empty({tiles.size, panels.size}, dtype);
    int64_t panel_index = -1;
#pragma omp for schedule(dynamic, chunk)
    for (int64_t t = 0; t < tile_count; ++t) {
      try {
        const int64_t p = t / tiles.count, n0 = p * panels.size, rows = std::min(panels.size, n - n0);
        const int64_t m0 = (t % tiles.count) * tiles.size, tile_rows = std::min(tiles.size, m - m0);
        if (panel_index != p) {
          for (int64_t r = 0; r < rows; ++r) {
            const uint8_t* src = codes.data<uint8_t>() + (n0 + r) * codes.stride(0);
            if (dtype == DType::F32) {
              dequantize_fp8(src, fp8, scales[n0 + r], panel.data<float>() + r * k, k);
            } else {
              dequantize_fp8(src, fp8, scales[n0 + r], panel.data<uint16_t>() + r * k, k);
            }
          }
          panel_index = p;
        }
        // oneDNN's fast kernels write dense outputs only: compute the tile densely, then copy
        // its rows into the output columns.
        GemmProblem problem;
        problem.dtype = dtype;
        problem.a = {{tile_rows, k}, {x2.stride(0), 1}};
        problem.b = {{k, rows}, {1, k}};
        problem.dst = {{tile_rows, rows}, {rows, 1}};
        for (GemmLayout* layout : {&problem.a, &problem.b, &problem.dst}) normalize_unit_strides(*layout);
        problem.has_bias = bias.defined();
        if (problem.has_bias) problem.bias_dtype = bias.dtype();
        run_gemm(problem, {x_bytes + m0 * x2.stride(0) * element, panel.raw_data(),
                           bias_bytes != nullptr ? bias_bytes + n0 * bias_element : nullptr, tile_out.raw_data()});
        const auto* tile_bytes = static_cast<const char*>(tile_out.raw_data());
        for (int64_t i = 0; i < tile_rows; ++i) {
          std::memcpy(out_bytes + ((m0 + i) * n + n0) * element, tile_bytes + i * rows * element,
                      static_cast<size_t>(rows * element));
        }
      } catch (...) {
#pragma omp critical(xdit_fp8_linear_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace xdit::cpu
