// CPU normalisations: RMSNorm and LayerNorm over the last dim, GroupNorm over channel groups.
// Statistics are computed in f32 (sums of raw values in f64), each output is rounded once to the
// input dtype. Rows are staged through small f32 buffers so one f32 kernel serves f32 and bf16.
#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/strided.h"
#include "xdit/core/threading.h"

namespace xdit {
namespace {

// Elements one task should at least cover, so threads are not woken for tiny tensors.
constexpr int64_t kTaskElements = int64_t{1} << 15;

// x as f32: the memory itself for f32 data, else `buffer` filled with the converted bf16 values.
const float* as_f32(const void* x, DType dtype, int64_t n, float* buffer) {
  if (dtype == DType::F32) return static_cast<const float*>(x);
  cpu::convert_row(static_cast<const bf16_t*>(x), n, buffer);
  return buffer;
}

// An optional per-channel parameter as a dense f32 vector; `fill` (1 for a scale, 0 for a
// shift, both exact no-ops) when it is undefined, so the kernels need no branches.
std::vector<float> dense_f32(const Tensor& t, int64_t n, float fill) {
  if (!t.defined()) return std::vector<float>(static_cast<size_t>(n), fill);
  return t.to_floats();
}

// A mean as an unevaluated sum hi + lo of two floats: x - hi is exact for x near the mean, so
// centring keeps full precision even when |mean| is much larger than the spread (x = 100 ± 1).
struct SplitMean {
  float hi;
  float lo;
  explicit SplitMean(double mean) : hi(static_cast<float>(mean)), lo(static_cast<float>(mean - hi)) {}
};

double sum_f64(const float* __restrict x, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

float centered_square_sum(const float* __restrict x, int64_t n, SplitMean mean) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float d = (x[i] - mean.hi) - mean.lo;
    sum += d * d;
  }
  return sum;
}

// The rows of x viewed as [rows, D]: unit stride in D, any strides over the leading dims.
class RowLayout {
 public:
  explicit RowLayout(const Tensor& x) {
    sizes_.assign(x.shape().begin(), x.shape().end() - 1);
    strides_.assign(x.strides().begin(), x.strides().end() - 1);
    coalesce_dims(sizes_, {&strides_});
  }
  int64_t offset(int64_t row) const {
    int64_t offset = 0;
    for (size_t d = sizes_.size(); d-- > 0;) {
      offset += (row % sizes_[d]) * strides_[d];
      row /= sizes_[d];
    }
    return offset;
  }

 private:
  Shape sizes_, strides_;
};

// Runs row_fn(x_row, y_row) over every row of the last dim, with x_row/y_row f32 buffers (or the
// tensors' own memory for f32), and writes y in x's dtype to a new contiguous tensor.
template <typename RowFn>
Tensor map_rows(const Tensor& x_in, RowFn row_fn) {
  const Tensor x = x_in.stride(-1) == 1 ? x_in : x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const int64_t width = x.size(-1);
  if (y.numel() == 0) return y;
  const int64_t rows = x.numel() / width;
  const RowLayout layout(x);
  const DType dtype = x.dtype();
  const size_t elem = dtype_size(dtype);
  const char* x_base = static_cast<const char*>(x.raw_data());
  char* y_base = static_cast<char*>(y.raw_data());
  parallel_for(rows, std::max<int64_t>(1, kTaskElements / width), [&](int64_t begin, int64_t end) {
    const bool staged = dtype != DType::F32;
    std::vector<float> x_buffer(staged ? width : 0), y_buffer(staged ? width : 0);
    for (int64_t r = begin; r < end; ++r) {
      const char* x_row = x_base + layout.offset(r) * static_cast<int64_t>(elem);
      char* y_row = y_base + r * width * static_cast<int64_t>(elem);
      float* out = staged ? y_buffer.data() : reinterpret_cast<float*>(y_row);
      row_fn(as_f32(x_row, dtype, width, x_buffer.data()), out, width);
      if (staged) cpu::convert_row(out, width, reinterpret_cast<bf16_t*>(y_row));
    }
  });
  return y;
}

struct Moments {
  double count = 0;
  double mean = 0;
  double m2 = 0;  // sum of squared deviations from the mean
};

// Chan et al.'s pairwise update: exact merging of two partial moments.
Moments merge(const Moments& a, const Moments& b) {
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  Moments m;
  m.count = a.count + b.count;
  const double delta = b.mean - a.mean;
  m.mean = a.mean + delta * (b.count / m.count);
  m.m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / m.count);
  return m;
}

// Two-pass moments of a block small enough to stay in cache.
Moments block_moments(const float* x, int64_t n) {
  Moments m;
  m.count = static_cast<double>(n);
  m.mean = sum_f64(x, n) / m.count;
  m.m2 = centered_square_sum(x, n, SplitMean(m.mean));
  return m;
}

}  // namespace

// HF differs slightly in bf16: transformers' Qwen3RMSNorm rounds x * rsqrt(var + eps) to bf16
// before multiplying by the weight, and diffusers' RMSNorm multiplies in the weight dtype. Here
// the whole row is computed in f32 and rounded once, which is at least as accurate.
Tensor CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  const std::vector<float> w = dense_f32(weight, x.size(-1), 1.0f);
  const float* __restrict w_data = w.data();
  return map_rows(x, [&](const float* __restrict in, float* __restrict out, int64_t n) {
    float square_sum = 0;
#pragma omp simd reduction(+ : square_sum)
    for (int64_t i = 0; i < n; ++i) square_sum += in[i] * in[i];
    const float inv_rms = 1.0f / std::sqrt(square_sum / static_cast<float>(n) + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * inv_rms * w_data[i];
  });
}

Tensor CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const std::vector<float> w = dense_f32(weight, x.size(-1), 1.0f), b = dense_f32(bias, x.size(-1), 0.0f);
  const float* __restrict w_data = w.data();
  const float* __restrict b_data = b.data();
  return map_rows(x, [&](const float* __restrict in, float* __restrict out, int64_t n) {
    const SplitMean mean(sum_f64(in, n) / static_cast<double>(n));
    const float variance = centered_square_sum(in, n, mean) / static_cast<float>(n);
    const float inv_std = 1.0f / std::sqrt(variance + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = ((in[i] - mean.hi) - mean.lo) * inv_std * w_data[i] + b_data[i];
  });
}

// Two sweeps over x: per-block moments (in parallel over all blocks of all groups, so N=1 with 32
// huge groups still uses every core), merged per group in f64; then the normalisation, in
// parallel over the flat element range.
Tensor CpuBackend::group_norm(const Tensor& x_in, int64_t groups, const Tensor& weight, const Tensor& bias,
                              float eps) {
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  if (y.numel() == 0) return y;
  const int64_t batch = x.size(0), channels = x.size(1);
  const int64_t spatial = x.numel() / (batch * channels);
  const int64_t channels_per_group = channels / groups;
  const int64_t group_size = channels_per_group * spatial;
  const DType dtype = x.dtype();
  const size_t elem = dtype_size(dtype);
  const char* x_base = static_cast<const char*>(x.raw_data());
  char* y_base = static_cast<char*>(y.raw_data());
  constexpr int64_t kBlock = int64_t{1} << 14;

  const int64_t blocks_per_group = (group_size + kBlock - 1) / kBlock;
  const int64_t group_count = batch * groups;
  std::vector<Moments> block_stats(static_cast<size_t>(group_count * blocks_per_group));
  parallel_for(group_count * blocks_per_group, std::max<int64_t>(1, kTaskElements / kBlock),
               [&](int64_t begin, int64_t end) {
                 std::vector<float> buffer(dtype == DType::F32 ? 0 : static_cast<size_t>(std::min(kBlock, group_size)));
                 for (int64_t item = begin; item < end; ++item) {
                   const int64_t group = item / blocks_per_group;
                   const int64_t start = (item % blocks_per_group) * kBlock;
                   const int64_t n = std::min(kBlock, group_size - start);
                   const char* block = x_base + (group * group_size + start) * static_cast<int64_t>(elem);
                   block_stats[item] = block_moments(as_f32(block, dtype, n, buffer.data()), n);
                 }
               });

  std::vector<SplitMean> group_mean;
  std::vector<float> group_inv_std;
  group_mean.reserve(group_count);
  group_inv_std.reserve(group_count);
  for (int64_t g = 0; g < group_count; ++g) {
    Moments m;
    for (int64_t k = 0; k < blocks_per_group; ++k) m = merge(m, block_stats[g * blocks_per_group + k]);
    group_mean.emplace_back(m.mean);
    group_inv_std.push_back(static_cast<float>(1.0 / std::sqrt(m.m2 / m.count + static_cast<double>(eps))));
  }

  const std::vector<float> w = dense_f32(weight, channels, 1.0f), b = dense_f32(bias, channels, 0.0f);
  parallel_for(x.numel(), kTaskElements, [&](int64_t begin, int64_t end) {
    const bool staged = dtype != DType::F32;
    std::vector<float> in(staged ? static_cast<size_t>(std::min(kBlock, end - begin)) : 0);
    std::vector<float> out(in.size());
    for (int64_t p = begin; p < end;) {
      const int64_t row = p / spatial;  // n * channels + c
      const int64_t n = std::min({spatial - (p - row * spatial), end - p, kBlock});
      const int64_t c = row % channels;
      const int64_t group = (row / channels) * groups + c / channels_per_group;
      const SplitMean mean = group_mean[group];
      const float scale = group_inv_std[group] * w[c];
      const float shift = b[c];
      const float* __restrict src = as_f32(x_base + p * static_cast<int64_t>(elem), dtype, n, in.data());
      char* y_at = y_base + p * static_cast<int64_t>(elem);
      float* __restrict dst = staged ? out.data() : reinterpret_cast<float*>(y_at);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = ((src[i] - mean.hi) - mean.lo) * scale + shift;
      if (staged) cpu::convert_row(dst, n, reinterpret_cast<bf16_t*>(y_at));
      p += n;
    }
  });
  return y;
}

}  // namespace xdit
