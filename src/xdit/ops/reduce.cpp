// Reduction ops: argument checks (dims wrapped, range-checked, duplicates rejected), then dispatch.
#include <algorithm>
#include <string_view>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {
namespace {

void check_input(std::string_view op, const Tensor& x) {
  check_dtype(op, "x", x, {DType::F32, DType::BF16, DType::F16});
}

// The dims as indices in [0, x.dim()), in increasing order.
std::vector<int64_t> normalized_dims(std::string_view op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  out.reserve(dims.size());
  for (int64_t d : dims) {
    XDIT_CHECK(d >= -x.dim() && d < x.dim(), op, ": dim ", d, " out of range for x of shape ", shape_str(x.shape()));
    const int64_t wrapped = d < 0 ? d + x.dim() : d;
    XDIT_CHECK(std::find(out.begin(), out.end(), wrapped) == out.end(), op, ": dim ", d,
               " is given twice for x of shape ", shape_str(x.shape()));
    out.push_back(wrapped);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tensor reduce(std::string_view op, ReduceOp kind, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_input(op, x);
  const std::vector<int64_t> wrapped = normalized_dims(op, x, dims);
  return backend_of(op, {&x}).reduce(kind, x, wrapped, keepdim);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("sum", ReduceOp::Sum, x, dims, keepdim);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("mean", ReduceOp::Mean, x, dims, keepdim);
}

Tensor l1_norm(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("l1_norm", ReduceOp::AbsSum, x, dims, keepdim);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  check_input("var", x);
  XDIT_CHECK(correction >= 0, "var: correction must be >= 0, got ", correction);
  const std::vector<int64_t> wrapped = normalized_dims("var", x, dims);
  return backend_of("var", {&x}).var(x, wrapped, correction, keepdim);
}

}  // namespace xdit::ops
