// Elementwise ops: argument checks (float dtypes, numpy broadcasting, modulation operands that
// broadcast to x's shape), then dispatch.
#include <algorithm>
#include <string_view>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

namespace {

// True when `shape` broadcasts against `other` (numpy rules).
bool broadcasts(const Shape& shape, const Shape& other) {
  const size_t n = std::max(shape.size(), other.size());
  for (size_t i = 1; i <= n; ++i) {
    const int64_t a = i <= shape.size() ? shape[shape.size() - i] : 1;
    const int64_t b = i <= other.size() ? other[other.size() - i] : 1;
    if (a != b && a != 1 && b != 1) return false;
  }
  return true;
}

// True when `shape` broadcasts to exactly `target` (each of its dims, aligned from the right, is 1
// or equal), so an op whose result has target's shape can take it.
bool broadcasts_to(const Shape& shape, const Shape& target) {
  if (shape.size() > target.size()) return false;
  for (size_t i = 1; i <= shape.size(); ++i) {
    const int64_t d = shape[shape.size() - i];
    if (d != 1 && d != target[target.size() - i]) return false;
  }
  return true;
}

void check_broadcasts_to(std::string_view op, std::string_view name, const Tensor& operand, const Tensor& x) {
  XDIT_CHECK(broadcasts_to(operand.shape(), x.shape()), op, ": ", name, " of shape ", shape_str(operand.shape()),
             " does not broadcast to x's shape ", shape_str(x.shape()));
}

Tensor binary_op(std::string_view op, BinaryOp kind, const Tensor& a, const Tensor& b) {
  check_float(op, "a", a);
  check_float(op, "b", b);
  XDIT_CHECK(broadcasts(a.shape(), b.shape()), op, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " do not broadcast");
  return backend_of(op, {&a, &b}).binary(kind, a, b);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op("add", BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op("sub", BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", BinaryOp::Div, a, b); }

Tensor scale(const Tensor& x, float factor) {
  check_float("scale", "x", x);
  return backend_of("scale", {&x}).scale(x, factor);
}

Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  check_float("modulate", "x", x);
  check_float("modulate", "shift", shift);
  check_float("modulate", "scale", scale);
  check_broadcasts_to("modulate", "shift", shift, x);
  check_broadcasts_to("modulate", "scale", scale, x);
  return backend_of("modulate", {&x, &shift, &scale}).modulate(x, shift, scale);
}

Tensor gated_residual(const Tensor& x, const Tensor& y, const Tensor& gate) {
  check_float("gated_residual", "x", x);
  check_float("gated_residual", "y", y);
  check_float("gated_residual", "gate", gate);
  XDIT_CHECK(y.shape() == x.shape(), "gated_residual: y has shape ", shape_str(y.shape()), " but x has shape ",
             shape_str(x.shape()));
  check_broadcasts_to("gated_residual", "gate", gate, x);
  return backend_of("gated_residual", {&x, &y, &gate}).gated_residual(x, y, gate);
}

}  // namespace xdit::ops
