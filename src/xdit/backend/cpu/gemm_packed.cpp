#include "xdit/backend/cpu/gemm_packed.h"

#include <optional>

#include "xdit/backend/cpu/dnnl_context.h"
#include "xdit/core/allocator.h"

namespace xdit::cpu {

namespace {

using dnnl::memory;

struct PackedEntry {
  // Absent when no fast kernel takes the packed layout at this row count; the weight is then
  // unpacked for the call.
  std::optional<dnnl::matmul> matmul;
  memory::desc src, bias, dst, scratchpad;
};

PrimitiveCache<PackedEntry>& packed_cache() {
  static PrimitiveCache<PackedEntry> cache;
  return cache;
}

memory::desc bias_desc(const Tensor& bias, int64_t n) {
  return bias.defined() ? strided_desc({1, n}, {n, 1}, bias.dtype()) : memory::desc();
}

PackedEntry build_packed(const Tensor& x2, const PackedLinearWeight& w, const Tensor& bias) {
  PackedEntry e;
  const int64_t m = x2.size(0);
  e.src = strided_desc(x2.shape(), x2.strides(), w.dtype);
  e.dst = strided_desc({m, w.n}, {w.n, 1}, w.dtype);
  e.bias = bias_desc(bias, w.n);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.src, w.layout, e.bias, e.dst), user_scratchpad_attr(),
                                          dnnl_engine());
    if (!is_reference_impl(pd.impl_info_str())) {
      e.scratchpad = pd.scratchpad_desc();
      e.matmul.emplace(pd);
    }
  } catch (const dnnl::error&) {
    // No implementation accepts this layout at this shape: handled by unpacking.
  }
  return e;
}

void reorder(const memory::desc& from, const void* from_data, const memory::desc& to, void* to_data) {
  const dnnl::reorder::primitive_desc pd(dnnl_engine(), from, dnnl_engine(), to, user_scratchpad_attr());
  execute(dnnl::reorder(pd), pd.scratchpad_desc(),
          {{DNNL_ARG_FROM, wrap_memory(from, from_data)}, {DNNL_ARG_TO, wrap_memory(to, to_data)}});
}

}  // namespace

PackedLinearWeight pack_linear_weight(const Tensor& weight, int64_t typical_m) {
  XDIT_CHECK(weight.defined() && weight.dim() == 2, "pack_linear_weight: weight must be [N, K], got ",
             weight.defined() ? shape_str(weight.shape()) : "undefined");
  XDIT_CHECK(weight.dtype() == DType::F32 || weight.dtype() == DType::BF16, "pack_linear_weight: weight is ",
             dtype_name(weight.dtype()), ", expected f32 or bf16");
  XDIT_CHECK(weight.device().type == DeviceType::CPU, "pack_linear_weight: weight is on ",
             device_str(weight.device()));
  XDIT_CHECK(typical_m >= 1, "pack_linear_weight: typical_m must be at least 1, got ", typical_m);
  XDIT_CHECK(weight.numel() > 0, "pack_linear_weight: empty weight ", shape_str(weight.shape()));

  PackedLinearWeight w;
  w.n = weight.size(0);
  w.k = weight.size(1);
  w.dtype = weight.dtype();
  w.typical_m = typical_m;
  const memory::data_type dt = dnnl_dtype(w.dtype);
  const dnnl::matmul::desc desc(memory::desc({typical_m, w.k}, dt, memory::format_tag::ab),
                                memory::desc({w.k, w.n}, dt, memory::format_tag::any),
                                memory::desc({typical_m, w.n}, dt, memory::format_tag::ab));
  w.layout = dnnl::matmul::primitive_desc(desc, dnnl_engine()).weights_desc();
  w.packed = allocate_host(w.layout.get_size());
  // The stored [N, K] weight read as [K, N] through its strides.
  reorder(strided_desc({w.k, w.n}, {weight.stride(1), weight.stride(0)}, w.dtype), weight.raw_data(), w.layout,
          w.packed.get());
  return w;
}

Tensor linear_packed(const Tensor& x, const PackedLinearWeight& w, const Tensor& bias) {
  XDIT_CHECK(w.packed != nullptr, "linear_packed: the weight is not packed");
  XDIT_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == w.k, "linear_packed: x ",
             x.defined() ? shape_str(x.shape()) : "undefined", " does not end in K = ", w.k);
  XDIT_CHECK(x.dtype() == w.dtype, "linear_packed: x is ", dtype_name(x.dtype()), " but the weight is ",
             dtype_name(w.dtype));
  XDIT_CHECK(x.device().type == DeviceType::CPU, "linear_packed: x is on ", device_str(x.device()));
  if (bias.defined()) {
    XDIT_CHECK(bias.dim() == 1 && bias.size(0) == w.n, "linear_packed: bias ", shape_str(bias.shape()),
               " does not match N = ", w.n);
    XDIT_CHECK(bias.dtype() == DType::F32 || bias.dtype() == x.dtype(), "linear_packed: bias is ",
               dtype_name(bias.dtype()), ", expected f32 or ", dtype_name(x.dtype()));
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(w.n);
  Tensor out = Tensor::empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;
  const Tensor x2 = x.reshape({-1, w.k});
  const Tensor dense_bias = bias.defined() ? bias.contiguous() : Tensor();

  PrimitiveKey key;
  key.add(static_cast<int64_t>(w.dtype))
      .add(x2.shape())
      .add(x2.strides())
      .add(w.n)
      .add(w.typical_m)
      .add(bias.defined() ? 1 + static_cast<int64_t>(bias.dtype()) : 0);
  const auto e = packed_cache().get(key, [&] { return build_packed(x2, w, dense_bias); });

  std::shared_ptr<void> unpacked;
  dnnl::memory weights;
  std::optional<dnnl::matmul> fallback;
  memory::desc scratchpad = e->scratchpad;
  if (e->matmul) {
    weights = wrap_memory(w.layout, w.packed.get());
  } else {
    const memory::desc plain = strided_desc({w.k, w.n}, {w.n, 1}, w.dtype);
    unpacked = allocate_host(plain.get_size());
    reorder(w.layout, w.packed.get(), plain, unpacked.get());
    weights = wrap_memory(plain, unpacked.get());
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->src, plain, e->bias, e->dst), user_scratchpad_attr(),
                                          dnnl_engine());
    scratchpad = pd.scratchpad_desc();
    fallback.emplace(pd);
  }
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, wrap_memory(e->src, x2.raw_data())},
                                             {DNNL_ARG_WEIGHTS, weights},
                                             {DNNL_ARG_DST, wrap_memory(e->dst, out.raw_data())}};
  if (dense_bias.defined()) args.emplace(DNNL_ARG_BIAS, wrap_memory(e->bias, dense_bias.raw_data()));
  execute(e->matmul ? *e->matmul : *fallback, scratchpad, std::move(args));
  return out;
}

}  // namespace xdit::cpu
