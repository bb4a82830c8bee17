// Activation ops: argument checks (float dtypes, swiglu's even last dim), then dispatch.
#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

Tensor silu(const Tensor& x) {
  check_float("silu", "x", x);
  return backend_of("silu", {&x}).silu(x);
}

Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  check_float("gelu", "x", x);
  XDIT_CHECK(approximation == GeluApproximation::Erf || approximation == GeluApproximation::Tanh,
             "gelu: invalid approximation ", static_cast<int>(approximation));
  return backend_of("gelu", {&x}).gelu(x, approximation);
}

Tensor swiglu(const Tensor& x) {
  check_float("swiglu", "x", x);
  XDIT_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "swiglu: the last dim of x ", shape_str(x.shape()),
             " must be even (gate half, then value half)");
  return backend_of("swiglu", {&x}).swiglu(x);
}

Tensor softmax(const Tensor& x) {
  check_float("softmax", "x", x);
  XDIT_CHECK(x.dim() >= 1, "softmax: x must have at least one dim, got shape ", shape_str(x.shape()));
  return backend_of("softmax", {&x}).softmax(x);
}

}  // namespace xdit::ops
