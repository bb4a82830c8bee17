// CPU rotary embedding. Each head row is rotated in f32 and rounded once to x's dtype; bf16 rows
// are staged through small f32 buffers so one kernel per style serves f32 and bf16.
#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

#include <algorithm>
#include <vector>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/threading.h"

namespace xdit {
namespace {

// Pairs (2k, 2k+1) rotated by angle k.
void rotate_interleaved(const float* __restrict x, const float* __restrict cos, const float* __restrict sin,
                        int64_t half, float* __restrict y) {
#pragma omp simd
  for (int64_t k = 0; k < half; ++k) {
    const float even = x[2 * k], odd = x[2 * k + 1];
    y[2 * k] = even * cos[k] - odd * sin[k];
    y[2 * k + 1] = odd * cos[k] + even * sin[k];
  }
}

// Pairs (k, k + D/2) rotated by angle k.
void rotate_half(const float* __restrict x, const float* __restrict cos, const float* __restrict sin, int64_t half,
                 float* __restrict y) {
#pragma omp simd
  for (int64_t k = 0; k < half; ++k) {
    const float first = x[k], second = x[k + half];
    y[k] = first * cos[k] - second * sin[k];
    y[k + half] = second * cos[k] + first * sin[k];
  }
}

}  // namespace

Tensor CpuBackend::apply_rope(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in, RopeStyle style) {
  const Tensor x = x_in.stride(-1) == 1 ? x_in : x_in.contiguous();
  const Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  if (y.numel() == 0) return y;
  const int64_t batch = x.size(0), seq = x.size(1), heads = x.size(2), head_dim = x.size(3);
  const int64_t half = head_dim / 2;
  const bool staged = x.dtype() == DType::BF16;
  const auto rotate = style == RopeStyle::Interleaved ? rotate_interleaved : rotate_half;
  const float* cos_base = cos.data<float>();
  const float* sin_base = sin.data<float>();
  const size_t elem = dtype_size(x.dtype());
  const char* x_base = static_cast<const char*>(x.raw_data());
  char* y_base = static_cast<char*>(y.raw_data());
  const int64_t token_elements = heads * head_dim;
  const int64_t batch_stride = x.stride(0), seq_stride = x.stride(1), head_stride = x.stride(2);

  // One task item is one token (b, s): its angles are shared by all its heads.
  parallel_for(batch * seq, std::max<int64_t>(1, (int64_t{1} << 14) / token_elements), [&](int64_t begin, int64_t end) {
    std::vector<float> in(staged ? head_dim : 0), out(staged ? head_dim : 0);
    for (int64_t token = begin; token < end; ++token) {
      const int64_t b = token / seq, s = token % seq;
      const float* cos_row = cos_base + s * half;
      const float* sin_row = sin_base + s * half;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t x_offset = b * batch_stride + s * seq_stride + h * head_stride;
        const char* x_row = x_base + x_offset * static_cast<int64_t>(elem);
        char* y_row = y_base + (token * token_elements + h * head_dim) * static_cast<int64_t>(elem);
        if (!staged) {
          rotate(reinterpret_cast<const float*>(x_row), cos_row, sin_row, half, reinterpret_cast<float*>(y_row));
          continue;
        }
        cpu::convert_row(reinterpret_cast<const bf16_t*>(x_row), head_dim, in.data());
        rotate(in.data(), cos_row, sin_row, half, out.data());
        cpu::convert_row(out.data(), head_dim, reinterpret_cast<bf16_t*>(y_row));
      }
    }
  });
  return y;
}

}  // namespace xdit
