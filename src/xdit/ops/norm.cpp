// Norm ops: argument checks, then dispatch to the backend of the inputs' device.
#include <cmath>
#include <string_view>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {
namespace {

// An optional per-channel parameter: undefined, or a float vector of `length` elements.
void check_parameter(std::string_view op, std::string_view arg, const Tensor& p, int64_t length, const Tensor& x) {
  if (!p.defined()) return;
  check_float(op, arg, p);
  XDIT_CHECK(p.dim() == 1 && p.size(0) == length, op, ": ", arg, " has shape ", shape_str(p.shape()), ", expected [",
             length, "] for x of shape ", shape_str(x.shape()));
}

void check_eps(std::string_view op, float eps) {
  XDIT_CHECK(std::isfinite(eps) && eps >= 0.0f, op, ": eps must be finite and >= 0, got ", eps);
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  check_float("rms_norm", "x", x);
  XDIT_CHECK(x.dim() >= 1, "rms_norm: x must have at least one dim, got shape ", shape_str(x.shape()));
  check_parameter("rms_norm", "weight", weight, x.size(-1), x);
  check_eps("rms_norm", eps);
  return backend_of("rms_norm", {&x, &weight}).rms_norm(x, weight, eps);
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  check_float("layer_norm", "x", x);
  XDIT_CHECK(x.dim() >= 1, "layer_norm: x must have at least one dim, got shape ", shape_str(x.shape()));
  check_parameter("layer_norm", "weight", weight, x.size(-1), x);
  check_parameter("layer_norm", "bias", bias, x.size(-1), x);
  check_eps("layer_norm", eps);
  return backend_of("layer_norm", {&x, &weight, &bias}).layer_norm(x, weight, bias, eps);
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, float eps) {
  check_float("group_norm", "x", x);
  XDIT_CHECK(x.dim() >= 2, "group_norm: x must be [N, C, *spatial], got shape ", shape_str(x.shape()));
  const int64_t channels = x.size(1);
  XDIT_CHECK(groups >= 1 && channels % groups == 0, "group_norm: ", groups, " groups do not divide the ", channels,
             " channels of x with shape ", shape_str(x.shape()));
  check_parameter("group_norm", "weight", weight, channels, x);
  check_parameter("group_norm", "bias", bias, channels, x);
  check_eps("group_norm", eps);
  return backend_of("group_norm", {&x, &weight, &bias}).group_norm(x, groups, weight, bias, eps);
}

}  // namespace xdit::ops
