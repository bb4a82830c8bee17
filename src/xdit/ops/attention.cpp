// ops::attention: argument validation, then dispatch to the device backend.
#include <cmath>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

namespace {

// The largest head dim the kernels take: 512 covers the VAE mid-block attention (one head over
// all 512 channels) as well as every transformer (64 or 128).
constexpr int64_t kMaxHeadDim = 512;

// The backends read rows with unit stride in the head dim; other layouts are copied first.
Tensor with_unit_head_stride(const Tensor& x) { return x.size(3) > 1 && x.stride(3) != 1 ? x.contiguous() : x; }

}  // namespace

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params) {
  constexpr const char* op = "attention";
  check_float(op, "q", q);
  check_float(op, "k", k);
  check_float(op, "v", v);
  XDIT_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op, ": q, k and v must share a dtype, got q ",
             dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()));
  XDIT_CHECK(q.dim() == 4, op, ": q must be [B, Sq, H, D], got ", shape_str(q.shape()));
  XDIT_CHECK(k.dim() == 4, op, ": k must be [B, Skv, Hkv, D], got ", shape_str(k.shape()));
  XDIT_CHECK(k.shape() == v.shape(), op, ": k ", shape_str(k.shape()), " and v ", shape_str(v.shape()),
             " must have the same shape");
  XDIT_CHECK(k.size(0) == q.size(0), op, ": batch of q ", shape_str(q.shape()), " and k ", shape_str(k.shape()),
             " differ");
  XDIT_CHECK(k.size(3) == q.size(3), op, ": head dim of q ", shape_str(q.shape()), " and k ", shape_str(k.shape()),
             " differ");
  const int64_t head_dim = q.size(3);
  XDIT_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim, op, ": head dim ", head_dim, " of q ", shape_str(q.shape()),
             " is not supported (1 to ", kMaxHeadDim, ")");
  XDIT_CHECK(k.size(2) >= 1 && q.size(2) % k.size(2) == 0, op, ": query heads ", q.size(2),
             " must be a multiple of kv heads ", k.size(2), " (q ", shape_str(q.shape()), ", k ", shape_str(k.shape()),
             ")");
  XDIT_CHECK(std::isfinite(params.scale), op, ": scale must be finite, got ", params.scale);
  const Tensor& mask = params.key_padding_mask;
  if (mask.defined()) {
    check_dtype(op, "key_padding_mask", mask, {DType::I32});
    XDIT_CHECK(mask.dim() == 2 && mask.size(0) == k.size(0) && mask.size(1) == k.size(1), op,
               ": key_padding_mask must be [B, Skv] = [", k.size(0), ", ", k.size(1), "], got ",
               shape_str(mask.shape()));
  }
  Backend& backend = backend_of(op, {&q, &k, &v, &mask});
  return backend.attention(with_unit_head_stride(q), with_unit_head_stride(k), with_unit_head_stride(v), params);
}

}  // namespace xdit::ops
