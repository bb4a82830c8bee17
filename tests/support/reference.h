// Test helpers: seeded random inputs, awkward layouts, comparison of a result with a float64
// reference (reporting the max abs error, the relative L2 error and the worst index), and checks
// of the errors an op throws.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "xdit/core/error.h"
#include "xdit/core/tensor.h"

namespace xdit::testing {

// Uniform values in [lo, hi), deterministic for a seed, rounded to `dtype`.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// The same values in a non-contiguous layout: a view into a buffer with a padded innermost dim,
// so the innermost dim is still unit-stride but rows are not adjacent.
Tensor padded_rows(const Tensor& dense);
// The same values in a transposed storage order: a permuted view whose strides are not row-major
// (the innermost dim is not unit-stride unless the tensor has a single dim).
Tensor transposed_storage(const Tensor& dense);

// The layouts an op's inputs are tried in: the dense tensor itself, padded_rows,
// transposed_storage, and a view into a tensor one row larger at each end of dim 0 (an offset
// and gaps between blocks).
enum class Layout { Contiguous, PaddedRows, Transposed, NarrowedView };
inline constexpr Layout kAllLayouts[] = {Layout::Contiguous, Layout::PaddedRows, Layout::Transposed,
                                         Layout::NarrowedView};

// The same values as `dense` in `layout`.
Tensor in_layout(const Tensor& dense, Layout layout);
// "contiguous", "padded_rows", "transposed", "narrowed_view": usable in test names.
std::string layout_name(Layout layout);

struct Comparison {
  double max_abs = 0;       // max |actual - expected|
  double max_expected = 0;  // max |expected|
  double rel_l2 = 0;        // ||actual - expected|| / ||expected||
  int64_t worst_index = -1;
  double worst_actual = 0, worst_expected = 0;
  bool non_finite = false;  // actual has NaN/Inf where expected is finite
  std::string describe() const;
};

Comparison compare(const Tensor& actual, const std::vector<double>& expected);
Comparison compare(const std::vector<double>& actual, const std::vector<double>& expected);

// The project's op tolerances: F32 max abs error ≤ 1e-5 × max(|expected|) (at least 1e-5 × 1);
// BF16/F16 relative L2 ≤ 1e-2.
::testing::AssertionResult matches_reference(const Tensor& actual, const std::vector<double>& expected);

// Values of a tensor as float64 in logical (row-major) order.
std::vector<double> values(const Tensor& t);

// The message of the xdit::Error that `fn` throws, or "(no error)" when it returns.
std::string error_of(const std::function<void()>& fn);

// Expects `fn` to throw an E (xdit::Error by default, or a subclass of it) whose message contains
// every one of `fragments`; no exception, or one of another type, is a failure.
template <typename E = Error>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace xdit::testing

#define EXPECT_MATCHES_REFERENCE(actual, expected) EXPECT_TRUE(::xdit::testing::matches_reference(actual, expected))
