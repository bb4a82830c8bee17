// Elementwise arithmetic with numpy broadcasting: every operand is viewed expanded to the result
// shape (stride 0 along broadcast dims) and the dims are coalesced, so the common patterns run as
// long vector loops: same-shape dense operands as one run, a bias row [D] or a per-batch vector
// [B, 1, D] over [B, S, D] as runs of D against a dense row, a per-channel [C, 1, 1] as runs of a
// broadcast scalar. Computed in f32 lanes, rounded once into the first operand's dtype.
#include <array>
#include <tuple>
#include <utility>

#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/backend/cpu/vec.h"  // first: it includes <immintrin.h>

namespace xdit {

namespace {

using cpu::StridedRun;

constexpr int64_t kGrain = 1 << 14;  // elements per thread at least: below that, threads cost more

// fn(tag...) with one float / bf16_t tag per dtype, so kernels are instantiated per dtype combination.
template <size_t I, size_t N, typename Fn, typename... Tags>
void visit_floats(const std::array<DType, N>& dtypes, Fn& fn, Tags... tags) {
  if constexpr (I == N) {
    fn(tags...);
  } else {
    cpu::visit_float(dtypes[I], [&](auto tag) { visit_floats<I + 1>(dtypes, fn, tags..., tag); });
  }
}

// One run of map_broadcast, the inputs stored as Ts...: operand K + 1 of the walk is input K.
template <typename... Ts, typename TOut, typename F, size_t N, size_t... K>
void map_typed_run(TOut* out, int64_t n, F& f, const std::array<const void*, N>& data,
                   const std::array<int64_t, N + 1>& offset, const std::array<int64_t, N + 1>& stride,
                   std::index_sequence<K...>) {
  cpu::map_run(out + offset[0], n, f,
               StridedRun<Ts>{static_cast<const Ts*>(data[K]) + offset[K + 1], stride[K + 1]}...);
}

// A new contiguous tensor of `shape` in inputs[0]'s dtype with out[i] = f(inputs[i]...), each
// input broadcast to `shape` (the caller has checked that it broadcasts) and read in its own dtype.
template <size_t N, typename F>
Tensor map_broadcast(const Shape& shape, const std::array<Tensor, N>& inputs, F f) {
  Tensor out = Tensor::empty(shape, inputs[0].dtype());
  std::array<Shape, N + 1> strides;
  std::array<const void*, N> data;
  std::array<DType, N> dtypes;
  strides[0] = out.strides();
  for (size_t k = 0; k < N; ++k) {
    strides[k + 1] = inputs[k].expand(shape).strides();
    data[k] = inputs[k].raw_data();
    dtypes[k] = inputs[k].dtype();
  }
  auto kernel = [&](auto... tags) {
    using TOut = std::tuple_element_t<0, std::tuple<decltype(tags)...>>;
    TOut* out_data = out.data<TOut>();
    cpu::for_each_run<N + 1>(shape, strides, kGrain, [&](const auto& offset, const auto& stride, int64_t n) {
      map_typed_run<decltype(tags)...>(out_data, n, f, data, offset, stride, std::make_index_sequence<N>{});
    });
  };
  visit_floats<0>(dtypes, kernel);
  return out;
}

}  // namespace

Tensor CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  switch (op) {
    case BinaryOp::Add:
      return map_broadcast<2>(shape, {a, b}, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
    case BinaryOp::Sub:
      return map_broadcast<2>(shape, {a, b}, [](__m512 x, __m512 y) { return _mm512_sub_ps(x, y); });
    case BinaryOp::Mul:
      return map_broadcast<2>(shape, {a, b}, [](__m512 x, __m512 y) { return _mm512_mul_ps(x, y); });
    case BinaryOp::Div:
      return map_broadcast<2>(shape, {a, b}, [](__m512 x, __m512 y) { return _mm512_div_ps(x, y); });
  }
  fail("cpu binary: invalid op ", static_cast<int>(op));
}

Tensor CpuBackend::scale(const Tensor& x, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  return map_broadcast<1>(x.shape(), {x}, [f](__m512 v) { return _mm512_mul_ps(v, f); });
}

Tensor CpuBackend::modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return map_broadcast<3>(x.shape(), {x, shift, scale}, [](__m512 v, __m512 sh, __m512 sc) {
    return _mm512_fmadd_ps(v, _mm512_add_ps(sc, _mm512_set1_ps(1.0f)), sh);
  });
}

Tensor CpuBackend::gated_residual(const Tensor& x, const Tensor& y, const Tensor& gate) {
  return map_broadcast<3>(x.shape(), {x, y, gate},
                          [](__m512 v, __m512 update, __m512 g) { return _mm512_fmadd_ps(g, update, v); });
}

}  // namespace xdit
