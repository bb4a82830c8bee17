#include "support/reference.h"

#include <cmath>
#include <random>
#include <sstream>

namespace xdit::testing {

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> data(static_cast<size_t>(shape_numel(shape)));
  for (float& v : data) v = dist(engine);
  return Tensor::from_floats(data, shape, dtype);
}

Tensor padded_rows(const Tensor& dense) {
  if (dense.dim() == 0) return dense;
  Shape padded = dense.shape();
  padded.back() += 3;
  Tensor storage = Tensor::zeros(padded, dense.dtype(), dense.device());
  Tensor view = storage.narrow(-1, 1, dense.size(-1));
  view.copy_from(dense);
  return view;
}

Tensor transposed_storage(const Tensor& dense) {
  if (dense.dim() < 2) return padded_rows(dense);
  std::vector<int64_t> order(dense.dim());
  for (int64_t i = 0; i < dense.dim(); ++i) order[i] = dense.dim() - 1 - i;
  // Store the reversed-dims tensor densely, then view it back in the original dim order.
  Tensor reversed = dense.permute(order).clone();
  return reversed.permute(order);
}

Tensor in_layout(const Tensor& dense, Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return dense;
    case Layout::PaddedRows:
      return padded_rows(dense);
    case Layout::Transposed:
      return transposed_storage(dense);
    case Layout::NarrowedView: {
      if (dense.dim() == 0) return dense;
      Shape bigger = dense.shape();
      bigger[0] += 2;
      Tensor storage = Tensor::zeros(bigger, dense.dtype());
      Tensor view = storage.narrow(0, 1, dense.size(0));
      view.copy_from(dense);
      return view;
    }
  }
  return dense;
}

std::string layout_name(Layout layout) {
  switch (layout) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::PaddedRows:
      return "padded_rows";
    case Layout::Transposed:
      return "transposed";
    case Layout::NarrowedView:
      return "narrowed_view";
  }
  return "?";
}

std::vector<double> values(const Tensor& t) { return t.to_doubles(); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Comparison compare(const std::vector<double>& actual, const std::vector<double>& expected) {
  Comparison c;
  if (actual.size() != expected.size()) {
    c.non_finite = true;
    c.worst_index = -2;
    return c;
  }
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (!std::isfinite(a) && std::isfinite(e)) c.non_finite = true;
    const double d = std::isfinite(e) ? std::fabs(a - e) : (a == e ? 0.0 : INFINITY);
    if (!(d <= c.max_abs)) {
      c.max_abs = d;
      c.worst_index = static_cast<int64_t>(i);
      c.worst_actual = a;
      c.worst_expected = e;
    }
    if (std::isfinite(e)) {
      c.max_expected = std::max(c.max_expected, std::fabs(e));
      ref2 += e * e;
      err2 += std::isfinite(d) ? d * d : 0.0;
    }
  }
  c.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return c;
}

Comparison compare(const Tensor& actual, const std::vector<double>& expected) {
  return compare(actual.to_doubles(), expected);
}

std::string Comparison::describe() const {
  std::ostringstream out;
  if (worst_index == -2) return "size mismatch";
  out << "max_abs=" << max_abs << " (max |expected|=" << max_expected << ") rel_l2=" << rel_l2
      << " worst index " << worst_index << ": actual " << worst_actual << " expected " << worst_expected
      << (non_finite ? " [non-finite values]" : "");
  return out.str();
}

::testing::AssertionResult matches_reference(const Tensor& actual, const std::vector<double>& expected) {
  if (static_cast<size_t>(actual.numel()) != expected.size()) {
    return ::testing::AssertionFailure() << "result has " << actual.numel() << " elements, reference "
                                         << expected.size();
  }
  const Comparison c = compare(actual, expected);
  if (c.non_finite) return ::testing::AssertionFailure() << c.describe();
  if (actual.dtype() == DType::F32) {
    const double bound = 1e-5 * std::max(1.0, c.max_expected);
    if (c.max_abs <= bound) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "f32 error above " << bound << ": " << c.describe();
  }
  if (c.rel_l2 <= 1e-2) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << dtype_name(actual.dtype()) << " rel_l2 above 1e-2: " << c.describe();
}

}  // namespace xdit::testing
