// Activations: computed in f32 lanes from f32 or bf16 storage, rounded once on the store.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

namespace xdit {

namespace {

using cpu::for_each_run;
using cpu::map_run;
using cpu::StridedRun;
using cpu::visit_float;

constexpr int64_t kGrain = 1 << 14;  // elements per thread at least: below that, threads cost more

// out = f(x) elementwise, x of any layout.
template <typename F>
Tensor map_unary(const Tensor& x, F f) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out_data = out.data<T>();
    const T* x_data = x.data<T>();
    for_each_run<2>(x.shape(), {out.strides(), x.strides()}, kGrain,
                    [&](const auto& offset, const auto& stride, int64_t n) {
                      map_run(out_data + offset[0], n, f, StridedRun<T>{x_data + offset[1], stride[1]});
                    });
  });
  return out;
}

__m512 silu_ps(__m512 x) { return _mm512_mul_ps(x, cpu::sigmoid_ps(x)); }

}  // namespace

Tensor CpuBackend::silu(const Tensor& x) {
  return map_unary(x, [](__m512 v) { return silu_ps(v); });
}

Tensor CpuBackend::gelu(const Tensor& x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Erf) {
    return map_unary(x, [](__m512 v) { return _mm512_mul_ps(v, cpu::normal_cdf_ps(v)); });
  }
  // 0.5·(1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi)·(x + 0.044715·x³): no cancellation for x < 0.
  return map_unary(x, [](__m512 v) {
    const __m512 c1 = _mm512_set1_ps(2.0f * 0.797884560802865356f);
    const __m512 c3 = _mm512_set1_ps(2.0f * 0.797884560802865356f * 0.044715f);
    const __m512 two_u = _mm512_mul_ps(v, _mm512_fmadd_ps(c3, _mm512_mul_ps(v, v), c1));
    return _mm512_mul_ps(v, cpu::sigmoid_ps(two_u));
  });
}

Tensor CpuBackend::swiglu(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  const Tensor gate = x.narrow(-1, 0, half);
  const Tensor value = x.narrow(-1, half, half);
  Tensor out = Tensor::empty(gate.shape(), x.dtype());
  const auto silu_gate = [](__m512 g, __m512 v) { return _mm512_mul_ps(silu_ps(g), v); };
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out_data = out.data<T>();
    const T* gate_data = gate.data<T>();
    const T* value_data = value.data<T>();
    for_each_run<3>(out.shape(), {out.strides(), gate.strides(), value.strides()}, kGrain,
                    [&](const auto& offset, const auto& stride, int64_t n) {
                      map_run(out_data + offset[0], n, silu_gate, StridedRun<T>{gate_data + offset[1], stride[1]},
                              StridedRun<T>{value_data + offset[2], stride[2]});
                    });
  });
  return out;
}

namespace {

// Softmax of one row of n elements: max, then e^(x - max) summed in f32, then scaled by 1/sum.
// `exps` holds the unnormalised values: the output row itself for f32, a scratch row for bf16
// so that the result is rounded once.
template <typename T>
void softmax_row(const T* x, int64_t x_stride, T* out, int64_t n, float* exps) {
  __m512 max_lanes = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += cpu::kLanes) {
    const __mmask16 lanes = cpu::first_lanes(n - i);
    max_lanes = _mm512_mask_max_ps(max_lanes, lanes, max_lanes, cpu::load16_strided(x + i * x_stride, x_stride, lanes));
  }
  const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(max_lanes));
  __m512 sum_lanes = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += cpu::kLanes) {
    const __mmask16 lanes = cpu::first_lanes(n - i);
    const __m512 e = cpu::exp_ps(_mm512_sub_ps(cpu::load16_strided(x + i * x_stride, x_stride, lanes), row_max));
    sum_lanes = _mm512_mask_add_ps(sum_lanes, lanes, sum_lanes, e);
    cpu::store16(exps + i, e, lanes);
  }
  const __m512 inverse_sum = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum_lanes));
  for (int64_t i = 0; i < n; i += cpu::kLanes) {
    const __mmask16 lanes = cpu::first_lanes(n - i);
    cpu::store16(out + i, _mm512_mul_ps(cpu::load16(exps + i, lanes), inverse_sum), lanes);
  }
}

}  // namespace

Tensor CpuBackend::softmax(const Tensor& x) {
  const int64_t n = x.size(-1);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (out.numel() == 0) return out;
  const Shape row_shape(x.shape().begin(), x.shape().end() - 1);
  const Shape x_row_strides(x.strides().begin(), x.strides().end() - 1);
  const Shape out_row_strides(out.strides().begin(), out.strides().end() - 1);
  const int64_t x_stride = x.stride(-1);
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out_data = out.data<T>();
    const T* x_data = x.data<T>();
    const int64_t rows_per_thread = std::max<int64_t>(1, kGrain / n);
    for_each_run<2>(row_shape, {out_row_strides, x_row_strides}, rows_per_thread,
                    [&](const auto& offset, const auto& stride, int64_t rows) {
                      std::vector<float> scratch;
                      if constexpr (!std::is_same_v<T, float>) scratch.resize(static_cast<size_t>(n));
                      for (int64_t r = 0; r < rows; ++r) {
                        T* out_row = out_data + offset[0] + r * stride[0];
                        float* exps;
                        if constexpr (std::is_same_v<T, float>) {
                          exps = out_row;
                        } else {
                          exps = scratch.data();
                        }
                        softmax_row(x_data + offset[1] + r * stride[1], x_stride, out_row, n, exps);
                      }
                    });
  });
  return out;
}

}  // namespace xdit
