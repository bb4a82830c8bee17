#include "xdit/backend/cpu/gemm_core.h"

#include <optional>

#include "xdit/backend/cpu/dnnl_context.h"
#include "xdit/core/allocator.h"
#include "xdit/core/strided.h"

namespace xdit::cpu {

namespace {

// Below this many rows a per-call repack of the right operand is not worth its fixed cost, and
// oneDNN's own on-the-fly packing is used instead.
constexpr int64_t kPackRowsMin = 256;

struct GemmEntry {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, bias, dst, scratchpad;
  bool copy_a = false;  // the operand is copied densely before the call
  bool copy_b = false;
  bool reference = false;  // oneDNN's slow reference kernel
  // A row-major right operand is first reordered into the blocked layout the matmul runs on
  // (desc `b`): one pass over K·N elements instead of the matmul's own repacking of every panel.
  std::optional<dnnl::reorder> pack_b;
  dnnl::memory::desc plain_b, pack_scratchpad;
};

bool is_dense(const GemmLayout& layout) { return layout.strides == contiguous_strides(layout.shape); }

// The bias as a [1, ..., 1, N] tensor broadcast over the rows (an empty desc without bias).
dnnl::memory::desc bias_desc(const GemmProblem& p) {
  if (!p.has_bias) return {};
  Shape shape(p.dst.shape.size(), 1);
  shape.back() = p.dst.shape.back();
  return strided_desc(shape, contiguous_strides(shape), p.bias_dtype);
}

GemmEntry build_entry(const GemmProblem& p, bool copy_a, bool copy_b) {
  GemmEntry e;
  e.copy_a = copy_a;
  e.copy_b = copy_b;
  e.a = strided_desc(p.a.shape, copy_a ? contiguous_strides(p.a.shape) : p.a.strides, p.dtype);
  e.b = strided_desc(p.b.shape, copy_b ? contiguous_strides(p.b.shape) : p.b.strides, p.dtype);
  e.dst = strided_desc(p.dst.shape, p.dst.strides, p.dtype);
  e.bias = bias_desc(p);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.a, e.b, e.bias, e.dst), user_scratchpad_attr(),
                                      dnnl_engine());
  } catch (const dnnl::error& error) {
    fail("oneDNN has no matmul for a ", shape_str(p.a.shape), " x ", shape_str(p.b.shape), " ",
         dtype_name(p.dtype), " product: ", error.what());
  }
  e.scratchpad = pd.scratchpad_desc();
  e.reference = is_reference_impl(pd.impl_info_str());
  e.primitive = dnnl::matmul(pd);
  return e;
}

// Whether `b` is a row-major [K, N] matrix shared by the whole batch.
bool is_shared_row_major(const GemmLayout& b) {
  const size_t n = b.shape.size();
  for (size_t d = 0; d + 2 < n; ++d) {
    if (b.shape[d] != 1) return false;
  }
  return b.strides[n - 1] == 1 && b.strides[n - 2] >= b.shape[n - 1];
}

// A matmul on a right operand prepacked per call, when that is available and not the reference kernel.
std::optional<GemmEntry> build_packed_entry(const GemmProblem& p) {
  GemmEntry e;
  e.a = strided_desc(p.a.shape, p.a.strides, p.dtype);
  e.plain_b = strided_desc(p.b.shape, p.b.strides, p.dtype);
  e.dst = strided_desc(p.dst.shape, p.dst.strides, p.dtype);
  e.bias = bias_desc(p);
  const dnnl::memory::desc any_b(dnnl_dims(p.b.shape), dnnl_dtype(p.dtype), dnnl::memory::format_tag::any);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, any_b, e.bias, e.dst), user_scratchpad_attr(),
                                          dnnl_engine());
    // Nothing to gain where the matmul runs on the plain layout (batched operands, say).
    if (is_reference_impl(pd.impl_info_str()) || pd.weights_desc() == e.plain_b) return std::nullopt;
    e.b = pd.weights_desc();
    e.scratchpad = pd.scratchpad_desc();
    e.primitive = dnnl::matmul(pd);
    const dnnl::reorder::primitive_desc reorder_pd(dnnl_engine(), e.plain_b, dnnl_engine(), e.b,
                                                   user_scratchpad_attr());
    e.pack_scratchpad = reorder_pd.scratchpad_desc();
    e.pack_b.emplace(reorder_pd);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
  return e;
}

GemmEntry build_best_entry(const GemmProblem& p) {
  const int64_t rows = shape_numel(p.a.shape) / p.a.shape.back();
  if (rows >= kPackRowsMin && is_shared_row_major(p.b)) {
    if (std::optional<GemmEntry> packed = build_packed_entry(p)) return std::move(*packed);
  }
  GemmEntry entry = build_entry(p, false, false);
  if (!entry.reference) return entry;
  // oneDNN's fast kernels want one unit-stride dim per matrix; copying O(M·K) or O(K·N) data
  // costs far less than the reference kernel's O(M·N·K) scalar loop.
  return build_entry(p, !is_dense(p.a), !is_dense(p.b));
}

PrimitiveCache<GemmEntry>& gemm_cache() {
  static PrimitiveCache<GemmEntry> cache;
  return cache;
}

// A dense row-major copy of an operand.
std::shared_ptr<void> dense_copy(const void* data, const GemmLayout& layout, DType dtype) {
  auto buffer = allocate_host(static_cast<size_t>(shape_numel(layout.shape)) * dtype_size(dtype));
  strided_copy(data, dtype, layout.strides, buffer.get(), dtype, contiguous_strides(layout.shape), layout.shape);
  return buffer;
}

}  // namespace

void normalize_unit_strides(GemmLayout& layout) {
  const size_t n = layout.shape.size();
  for (size_t d = n; d-- > 0;) {
    if (layout.shape[d] != 1) continue;
    layout.strides[d] = d + 1 == n ? 1 : layout.shape[d + 1] * layout.strides[d + 1];
  }
}

void run_gemm(const GemmProblem& p, const GemmData& data) {
  PrimitiveKey key;
  key.add(static_cast<int64_t>(p.dtype))
      .add(p.a.shape)
      .add(p.a.strides)
      .add(p.b.shape)
      .add(p.b.strides)
      .add(p.dst.shape)
      .add(p.dst.strides)
      .add(p.has_bias ? 1 + static_cast<int64_t>(p.bias_dtype) : 0);
  const auto entry = gemm_cache().get(key, [&] { return build_best_entry(p); });

  std::shared_ptr<void> a_copy, b_copy;
  const void* a = data.a;
  const void* b = data.b;
  if (entry->copy_a) a = (a_copy = dense_copy(a, p.a, p.dtype)).get();
  if (entry->copy_b) b = (b_copy = dense_copy(b, p.b, p.dtype)).get();
  OwnedMemory packed_b;
  if (entry->pack_b) {
    packed_b = allocate_memory(entry->b);
    execute(*entry->pack_b, entry->pack_scratchpad,
            {{DNNL_ARG_FROM, wrap_memory(entry->plain_b, b)}, {DNNL_ARG_TO, packed_b.memory}});
    b = packed_b.owner.get();
  }

  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, wrap_memory(entry->a, a)},
      {DNNL_ARG_WEIGHTS, wrap_memory(entry->b, b)},
      {DNNL_ARG_DST, wrap_memory(entry->dst, data.dst)},
  };
  if (p.has_bias) args.emplace(DNNL_ARG_BIAS, wrap_memory(entry->bias, data.bias));
  execute(entry->primitive, entry->scratchpad, std::move(args));
}

GemmProblem linear_problem(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  // Rows of x (all dims but the last), merged where both x and out allow it.
  Shape rows(x.shape().begin(), x.shape().end() - 1);
  Shape x_rows(x.strides().begin(), x.strides().end() - 1);
  Shape out_rows(out.strides().begin(), out.strides().end() - 1);
  coalesce_dims(rows, {&x_rows, &out_rows});
  const size_t batch_dims = rows.size() - 1;
  const int64_t k = x.size(-1), n = out.size(-1);

  GemmProblem p;
  p.dtype = x.dtype();
  p.a = {rows, x_rows};
  p.a.shape.push_back(k);
  p.a.strides.push_back(x.stride(-1));
  p.dst = {rows, out_rows};
  p.dst.shape.push_back(n);
  p.dst.strides.push_back(out.stride(-1));
  p.b.shape.assign(batch_dims, 1);
  p.b.strides.assign(batch_dims, 0);
  p.b.shape.insert(p.b.shape.end(), {k, n});
  p.b.strides.insert(p.b.strides.end(), {weight.stride(1), weight.stride(0)});
  for (GemmLayout* layout : {&p.a, &p.b, &p.dst}) normalize_unit_strides(*layout);
  if (bias.defined()) {
    p.has_bias = true;
    p.bias_dtype = bias.dtype();
  }
  return p;
}

}  // namespace xdit::cpu
