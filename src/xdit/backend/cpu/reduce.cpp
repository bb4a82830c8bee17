// CPU reductions (sum, mean, sum of |x|, variance) over any set of dims, accumulated in f64.
//
// The input is seen as [outputs, count]: the kept dims index the outputs, the reduced dims (sorted
// by stride and merged where contiguous) are walked with the unit-stride one innermost, so the
// all-dims and last-dim reductions of dense tensors are one long vectorised run per output. Each
// output's run is cut into fixed-size chunks that are summed in parallel and then added in a
// fixed order, so a single huge reduction uses every core and results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include <immintrin.h>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/threading.h"

namespace xdit {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;  // elements per parallel work item

enum class Accumulate { Value, Abs, SquaredDeviation };

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bits_to_f32(static_cast<uint32_t>(v.bits) << 16); }
inline float to_f32(f16_t v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.bits);  // exact, like xdit::f16_to_f32
#else
  return f16_to_f32(v.bits);
#endif
}

template <Accumulate kind>
inline double term(float v, double center) {
  if constexpr (kind == Accumulate::Value) {
    return static_cast<double>(v);
  } else if constexpr (kind == Accumulate::Abs) {
    return static_cast<double>(std::fabs(v));
  } else {
    const double d = static_cast<double>(v) - center;
    return d * d;
  }
}

// Sum of term(x[i * stride]) over n elements; the dense case is one vectorised loop.
template <typename T, Accumulate kind>
double accumulate_run(const T* __restrict x, int64_t stride, int64_t n, double center) {
  double sum = 0;
  if (stride == 1) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += term<kind>(to_f32(x[i]), center);
  } else {
    for (int64_t i = 0; i < n; ++i) sum += term<kind>(to_f32(x[i * stride]), center);
  }
  return sum;
}

// How the input maps onto [outputs, count].
struct ReductionPlan {
  Shape kept_sizes, kept_strides;        // output order, merged where contiguous
  Shape reduced_sizes, reduced_strides;  // decreasing stride, merged where contiguous; never empty
  int64_t outputs = 1;
  int64_t count = 1;
  Shape out_shape;
};

// Appends a dim of `size` and `stride` after sizes/strides, merged into the last dim there when
// that one's stride is this dim's extent (the two are contiguous).
void append_merged(Shape& sizes, Shape& strides, int64_t size, int64_t stride) {
  if (!sizes.empty() && strides.back() == stride * size) {
    sizes.back() *= size;
    strides.back() = stride;
  } else {
    sizes.push_back(size);
    strides.push_back(stride);
  }
}

ReductionPlan make_plan(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t ndim = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) reduced[d] = true;

  ReductionPlan plan;
  std::vector<int64_t> reduced_dims;
  for (int64_t d = 0; d < ndim; ++d) {
    if (reduced[d]) {
      plan.count *= x.size(d);
      if (keepdim) plan.out_shape.push_back(1);
      if (x.size(d) != 1) reduced_dims.push_back(d);
      continue;
    }
    plan.outputs *= x.size(d);
    plan.out_shape.push_back(x.size(d));
    if (x.size(d) != 1) append_merged(plan.kept_sizes, plan.kept_strides, x.size(d), x.stride(d));
  }
  // The summation order is free, so walk the reduced dims in memory order.
  std::stable_sort(reduced_dims.begin(), reduced_dims.end(),
                   [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  for (int64_t d : reduced_dims) append_merged(plan.reduced_sizes, plan.reduced_strides, x.size(d), x.stride(d));
  if (plan.reduced_sizes.empty()) {
    plan.reduced_sizes.push_back(1);
    plan.reduced_strides.push_back(1);
  }
  return plan;
}

int64_t output_offset(const ReductionPlan& plan, int64_t m) {
  int64_t offset = 0;
  for (size_t d = plan.kept_sizes.size(); d-- > 0;) {
    offset += (m % plan.kept_sizes[d]) * plan.kept_strides[d];
    m /= plan.kept_sizes[d];
  }
  return offset;
}

// Sum of term<kind>(x) over the reduced elements [begin, end) (in walk order) of one output.
template <typename T, Accumulate kind>
double accumulate_range(const T* base, const ReductionPlan& plan, int64_t begin, int64_t end, double center) {
  const size_t inner_dim = plan.reduced_sizes.size() - 1;
  const int64_t inner_size = plan.reduced_sizes[inner_dim];
  const int64_t inner_stride = plan.reduced_strides[inner_dim];
  double sum = 0;
  int64_t position = begin;
  while (position < end) {
    // Offset of the run that holds `position`.
    int64_t outer = position / inner_size;
    int64_t offset = (position % inner_size) * inner_stride;
    for (size_t d = inner_dim; d-- > 0;) {
      offset += (outer % plan.reduced_sizes[d]) * plan.reduced_strides[d];
      outer /= plan.reduced_sizes[d];
    }
    const int64_t run = std::min(inner_size - position % inner_size, end - position);
    sum += accumulate_run<T, kind>(base + offset, inner_stride, run, center);
    position += run;
  }
  return sum;
}

// Per output m: the sum of term<kind>(x) over its reduced elements, centred on center[m].
template <typename T, Accumulate kind>
std::vector<double> reduce_outputs(const Tensor& x, const ReductionPlan& plan, const std::vector<double>& center) {
  std::vector<double> totals(static_cast<size_t>(plan.outputs), 0.0);
  if (plan.count == 0) return totals;
  const int64_t chunks = (plan.count + kChunk - 1) / kChunk;
  const int64_t chunk_len = std::min(plan.count, kChunk);
  std::vector<double> partial(static_cast<size_t>(plan.outputs * chunks));
  const T* base = x.data<T>();
  parallel_for(plan.outputs * chunks, std::max<int64_t>(1, kChunk / chunk_len), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t m = item / chunks, from = (item % chunks) * kChunk;
      partial[item] = accumulate_range<T, kind>(base + output_offset(plan, m), plan, from,
                                                std::min(plan.count, from + kChunk), center.empty() ? 0.0 : center[m]);
    }
  });
  for (int64_t m = 0; m < plan.outputs; ++m) {
    for (int64_t chunk = 0; chunk < chunks; ++chunk) totals[m] += partial[m * chunks + chunk];
  }
  return totals;
}

template <Accumulate kind>
std::vector<double> reduce_outputs(const Tensor& x, const ReductionPlan& plan, const std::vector<double>& center = {}) {
  switch (x.dtype()) {
    case DType::F32: return reduce_outputs<float, kind>(x, plan, center);
    case DType::BF16: return reduce_outputs<bf16_t, kind>(x, plan, center);
    default: return reduce_outputs<f16_t, kind>(x, plan, center);
  }
}

Tensor to_output(const ReductionPlan& plan, const std::vector<double>& values) {
  Tensor out = Tensor::empty(plan.out_shape, DType::F32);
  float* data = out.data<float>();
  for (size_t i = 0; i < values.size(); ++i) data[i] = static_cast<float>(values[i]);
  return out;
}

}  // namespace

Tensor CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const ReductionPlan plan = make_plan(x, dims, keepdim);
  std::vector<double> totals = op == ReduceOp::AbsSum ? reduce_outputs<Accumulate::Abs>(x, plan)
                                                      : reduce_outputs<Accumulate::Value>(x, plan);
  if (op == ReduceOp::Mean) {
    for (double& t : totals) t /= static_cast<double>(plan.count);  // 0/0 = NaN for an empty reduction
  }
  return to_output(plan, totals);
}

// Two passes (mean, then squared deviations from it): exact in f64 whatever the mean's size.
Tensor CpuBackend::var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const ReductionPlan plan = make_plan(x, dims, keepdim);
  std::vector<double> mean = reduce_outputs<Accumulate::Value>(x, plan);
  for (double& t : mean) t /= static_cast<double>(plan.count);
  std::vector<double> variance = reduce_outputs<Accumulate::SquaredDeviation>(x, plan, mean);
  const double divisor = std::max<double>(0.0, static_cast<double>(plan.count - correction));
  for (double& v : variance) v /= divisor;  // like torch: NaN or inf when count <= correction
  return to_output(plan, variance);
}

}  // namespace xdit
