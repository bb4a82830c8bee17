// Linear algebra ops: argument checks, then the backend of the inputs' device.
#include <sstream>

#include "xdit/backend/cpu/gemm_fp8.h"
#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

namespace {

bool is_fp8(DType dtype) { return dtype == DType::F8E4M3 || dtype == DType::F8E5M2; }

bool batch_dims_broadcast(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    const int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_float("matmul", "a", a);
  check_float("matmul", "b", b);
  XDIT_CHECK(a.dtype() == b.dtype(), "matmul: a is ", dtype_name(a.dtype()), " but b is ", dtype_name(b.dtype()));
  XDIT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: both operands need at least 2 dims, got a ",
             shape_str(a.shape()), " and b ", shape_str(b.shape()));
  XDIT_CHECK(a.size(-1) == b.size(-2), "matmul: inner dims differ: a ", shape_str(a.shape()), " and b ",
             shape_str(b.shape()));
  XDIT_CHECK(batch_dims_broadcast(Shape(a.shape().begin(), a.shape().end() - 2),
                                  Shape(b.shape().begin(), b.shape().end() - 2)),
             "matmul: batch dims of a ", shape_str(a.shape()), " and b ", shape_str(b.shape()), " do not broadcast");
  return backend_of("matmul", {&a, &b}).matmul(a, b);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale) {
  check_float("linear", "x", x);
  XDIT_CHECK(x.dim() >= 1, "linear: x must have at least 1 dim, got a scalar");
  XDIT_CHECK(weight.defined(), "linear: weight is undefined");
  XDIT_CHECK(weight.dim() == 2, "linear: weight must be [N, K], got ", shape_str(weight.shape()));
  XDIT_CHECK(weight.size(1) == x.size(-1), "linear: x ", shape_str(x.shape()), " has K = ", x.size(-1),
             " but weight ", shape_str(weight.shape()), " has K = ", weight.size(1));
  const int64_t n = weight.size(0);
  if (is_fp8(weight.dtype())) {
    XDIT_CHECK(weight_scale.defined(), "linear: the ", dtype_name(weight.dtype()),
               " weight needs weight_scale [", n, "] f32");
    check_dtype("linear", "weight_scale", weight_scale, {DType::F32});
    XDIT_CHECK(weight_scale.dim() == 1 && weight_scale.size(0) == n, "linear: weight_scale ",
               shape_str(weight_scale.shape()), " does not match weight ", shape_str(weight.shape()),
               " (expected [", n, "])");
  } else {
    XDIT_CHECK(weight.dtype() == x.dtype(), "linear: weight is ", dtype_name(weight.dtype()), " but x is ",
               dtype_name(x.dtype()), " (weights must match x or be f8e4m3/f8e5m2)");
    XDIT_CHECK(!weight_scale.defined(), "linear: weight_scale is only for fp8 weights, weight is ",
               dtype_name(weight.dtype()));
  }
  if (bias.defined()) {
    XDIT_CHECK(bias.dtype() == DType::F32 || bias.dtype() == x.dtype(), "linear: bias is ",
               dtype_name(bias.dtype()), ", expected f32 or x's ", dtype_name(x.dtype()));
    XDIT_CHECK(bias.dim() == 1 && bias.size(0) == n, "linear: bias ", shape_str(bias.shape()),
               " does not match weight ", shape_str(weight.shape()), " (expected [", n, "])");
  }
  return backend_of("linear", {&x, &weight, &bias, &weight_scale}).linear(x, weight, bias, weight_scale);
}

Fp8Weight quantize_fp8_per_channel(const Tensor& weight, DType fp8_dtype) {
  XDIT_CHECK(is_fp8(fp8_dtype), "quantize_fp8_per_channel: target dtype ", dtype_name(fp8_dtype),
             " is not f8e4m3 or f8e5m2");
  check_dtype("quantize_fp8_per_channel", "weight", weight, {DType::F32, DType::BF16, DType::F16});
  XDIT_CHECK(weight.dim() == 2, "quantize_fp8_per_channel: weight must be [N, K], got ", shape_str(weight.shape()));
  if (weight.device().type != DeviceType::CPU) {
    throw NotSupported("quantize_fp8_per_channel on " + device_str(weight.device()) + " (quantize on the host)");
  }
  Fp8Weight result{Tensor::empty(weight.shape(), fp8_dtype), Tensor::empty({weight.size(0)}, DType::F32)};
  cpu::quantize_fp8_rows(weight, result.data, result.scale);
  return result;
}

}  // namespace xdit::ops
