// Convolution ops: argument checks, then the backend of the inputs' device.
#include <algorithm>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

namespace {

void check_bias(std::string_view op, const Tensor& bias, const Tensor& x, int64_t out_channels) {
  if (!bias.defined()) return;
  XDIT_CHECK(bias.dtype() == DType::F32 || bias.dtype() == x.dtype(), op, ": bias is ", dtype_name(bias.dtype()),
             ", expected f32 or x's ", dtype_name(x.dtype()));
  XDIT_CHECK(bias.dim() == 1 && bias.size(0) == out_channels, op, ": bias ", shape_str(bias.shape()),
             " does not match ", out_channels, " output channels");
}

// Checks a spatial dim's parameters and returns its output size, which must be at least 1.
int64_t checked_output_size(std::string_view op, const char* dim, int64_t in, int64_t kernel, int64_t stride,
                            int64_t dilation, int64_t total_padding) {
  XDIT_CHECK(stride >= 1, op, ": stride ", stride, " along ", dim, " must be at least 1");
  XDIT_CHECK(dilation >= 1, op, ": dilation ", dilation, " along ", dim, " must be at least 1");
  XDIT_CHECK(total_padding >= 0, op, ": negative padding along ", dim);
  const int64_t span = dilation * (kernel - 1) + 1;
  XDIT_CHECK(in + total_padding >= span, op, ": kernel of extent ", span, " along ", dim,
             " does not fit the padded input of size ", in + total_padding);
  return (in + total_padding - span) / stride + 1;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  check_float("conv2d", "x", x);
  XDIT_CHECK(x.dim() == 4, "conv2d: x must be [N, C, H, W], got ", shape_str(x.shape()));
  XDIT_CHECK(weight.defined() && weight.dim() == 4, "conv2d: weight must be [O, C/groups, kh, kw], got ",
             weight.defined() ? shape_str(weight.shape()) : "undefined");
  XDIT_CHECK(weight.dtype() == x.dtype(), "conv2d: weight is ", dtype_name(weight.dtype()), " but x is ",
             dtype_name(x.dtype()));
  const int64_t groups = params.groups;
  XDIT_CHECK(groups >= 1, "conv2d: groups must be at least 1, got ", groups);
  XDIT_CHECK(weight.size(0) % groups == 0, "conv2d: ", weight.size(0), " output channels are not divisible by ",
             groups, " groups");
  XDIT_CHECK(x.size(1) == weight.size(1) * groups, "conv2d: x ", shape_str(x.shape()), " has ", x.size(1),
             " channels but weight ", shape_str(weight.shape()), " with ", groups, " groups expects ",
             weight.size(1) * groups);
  XDIT_CHECK(weight.size(2) >= 1 && weight.size(3) >= 1, "conv2d: empty kernel in weight ",
             shape_str(weight.shape()));
  for (int d = 0; d < 2; ++d) {
    checked_output_size("conv2d", d == 0 ? "height" : "width", x.size(2 + d), weight.size(2 + d), params.stride[d],
                        params.dilation[d], 2 * params.padding[d]);
  }
  check_bias("conv2d", bias, x, weight.size(0));
  return backend_of("conv2d", {&x, &weight, &bias}).conv2d(x, weight, bias, params);
}

Tensor causal_conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& cache,
                     const CausalConv3dParams& params) {
  check_float("causal_conv3d", "x", x);
  XDIT_CHECK(x.dim() == 5, "causal_conv3d: x must be [N, C, T, H, W], got ", shape_str(x.shape()));
  XDIT_CHECK(weight.defined() && weight.dim() == 5, "causal_conv3d: weight must be [O, C, kt, kh, kw], got ",
             weight.defined() ? shape_str(weight.shape()) : "undefined");
  XDIT_CHECK(weight.dtype() == x.dtype(), "causal_conv3d: weight is ", dtype_name(weight.dtype()), " but x is ",
             dtype_name(x.dtype()));
  XDIT_CHECK(x.size(1) == weight.size(1), "causal_conv3d: x ", shape_str(x.shape()), " has ", x.size(1),
             " channels but weight ", shape_str(weight.shape()), " expects ", weight.size(1));
  XDIT_CHECK(weight.size(2) >= 1 && weight.size(3) >= 1 && weight.size(4) >= 1, "causal_conv3d: empty kernel in weight ",
             shape_str(weight.shape()));
  int64_t cached = 0;
  if (cache.defined()) {
    XDIT_CHECK(cache.dtype() == x.dtype(), "causal_conv3d: cache is ", dtype_name(cache.dtype()), " but x is ",
               dtype_name(x.dtype()));
    XDIT_CHECK(cache.dim() == 5 && cache.size(0) == x.size(0) && cache.size(1) == x.size(1) &&
                   cache.size(3) == x.size(3) && cache.size(4) == x.size(4),
               "causal_conv3d: cache ", shape_str(cache.shape()), " does not match x ", shape_str(x.shape()),
               " (expected [N, C, Tc, H, W])");
    cached = std::min(cache.size(2), 2 * params.padding[0]);
  }
  const char* names[3] = {"time", "height", "width"};
  for (int d = 0; d < 3; ++d) {
    const int64_t padding = params.padding[d];
    XDIT_CHECK(padding >= 0, "causal_conv3d: negative padding ", padding, " along ", names[d]);
    // Time: 2*padding frames in front (cached ones included); space: padding on both sides.
    const int64_t in = x.size(2 + d) + (d == 0 ? cached : 0);
    const int64_t total_padding = d == 0 ? 2 * padding - cached : 2 * padding;
    checked_output_size("causal_conv3d", names[d], in, weight.size(2 + d), params.stride[d], 1, total_padding);
  }
  check_bias("causal_conv3d", bias, x, weight.size(0));
  return backend_of("causal_conv3d", {&x, &weight, &bias, &cache}).causal_conv3d(x, weight, bias, cache, params);
}

}  // namespace xdit::ops
