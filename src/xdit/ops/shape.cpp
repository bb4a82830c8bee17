// Shape ops: argument checks naming the part, dim or pad at fault, then dispatch; split is a view.
#include <string_view>
#include <vector>

#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {

namespace {

// d in [-rank, rank), wrapped to [0, rank).
int64_t wrap_dim(std::string_view op, int64_t d, const Tensor& x) {
  XDIT_CHECK(d >= -x.dim() && d < x.dim(), op, ": dim ", d, " out of range for shape ", shape_str(x.shape()));
  return d < 0 ? d + x.dim() : d;
}

}  // namespace

Tensor concat(const std::vector<Tensor>& parts, int64_t dim) {
  XDIT_CHECK(!parts.empty(), "concat: no parts");
  const Tensor& first = parts.front();
  XDIT_CHECK(first.defined(), "concat: part 0 is undefined");
  XDIT_CHECK(first.dim() >= 1, "concat: part 0 is a 0-dim tensor");
  const int64_t d = wrap_dim("concat", dim, first);
  for (size_t i = 1; i < parts.size(); ++i) {
    const Tensor& part = parts[i];
    XDIT_CHECK(part.defined(), "concat: part ", i, " is undefined");
    XDIT_CHECK(part.device() == first.device(), "concat: part ", i, " is on ", device_str(part.device()),
               " but part 0 is on ", device_str(first.device()));
    bool compatible = part.dim() == first.dim();
    for (int64_t k = 0; compatible && k < first.dim(); ++k) compatible = k == d || part.size(k) == first.size(k);
    XDIT_CHECK(compatible, "concat: part ", i, " has shape ", shape_str(part.shape()),
               ", which does not match part 0's ", shape_str(first.shape()), " outside dim ", dim);
  }
  return backend_of("concat", {&first}).concat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  XDIT_CHECK(x.defined(), "split: x is undefined");
  const int64_t d = wrap_dim("split", dim, x);
  int64_t total = 0;
  for (int64_t s : sizes) {
    XDIT_CHECK(s >= 0, "split: negative size in ", shape_str(sizes));
    total += s;
  }
  XDIT_CHECK(total == x.size(d), "split: sizes ", shape_str(sizes), " sum to ", total, " but dim ", dim, " of x ",
             shape_str(x.shape()), " has ", x.size(d));
  return x.split(sizes, d);
}

Tensor permute_copy(const Tensor& x, const std::vector<int64_t>& order) {
  XDIT_CHECK(x.defined(), "permute_copy: x is undefined");
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  bool is_permutation = static_cast<int64_t>(order.size()) == x.dim();
  for (size_t i = 0; is_permutation && i < order.size(); ++i) {
    const int64_t d = order[i] < 0 ? order[i] + x.dim() : order[i];
    is_permutation = d >= 0 && d < x.dim() && !seen[d];
    if (is_permutation) seen[d] = true;
  }
  XDIT_CHECK(is_permutation, "permute_copy: order ", shape_str(order), " is not a permutation of the dims of x ",
             shape_str(x.shape()));
  const Tensor permuted = x.permute(order);
  Tensor out = Tensor::empty(permuted.shape(), x.dtype(), x.device());
  backend_of("permute_copy", {&x}).copy(permuted, out);
  return out;
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, float value) {
  XDIT_CHECK(x.defined(), "pad: x is undefined");
  XDIT_CHECK(pads.size() % 2 == 0, "pad: pads ", shape_str(pads), " must have an even length (left, right per dim)");
  XDIT_CHECK(static_cast<int64_t>(pads.size()) <= 2 * x.dim(), "pad: pads ", shape_str(pads), " cover ",
             pads.size() / 2, " dims but x ", shape_str(x.shape()), " has ", x.dim());
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int64_t d = x.dim() - 1 - static_cast<int64_t>(i);
    XDIT_CHECK(x.size(d) + pads[2 * i] + pads[2 * i + 1] >= 0, "pad: pads (", pads[2 * i], ", ", pads[2 * i + 1],
               ") of dim ", d, " crop more than its size ", x.size(d), " (x ", shape_str(x.shape()), ")");
  }
  return backend_of("pad", {&x}).pad(x, pads, value);
}

Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& factors) {
  XDIT_CHECK(x.defined(), "upsample_nearest: x is undefined");
  XDIT_CHECK(!factors.empty() && static_cast<int64_t>(factors.size()) <= x.dim(), "upsample_nearest: ", factors.size(),
             " factors for x ", shape_str(x.shape()), " (expected 1 to ", x.dim(), ")");
  for (int64_t f : factors) {
    XDIT_CHECK(f >= 1, "upsample_nearest: factors ", shape_str(factors), " must all be >= 1");
  }
  return backend_of("upsample_nearest", {&x}).upsample_nearest(x, factors);
}

}  // namespace xdit::ops
