// Test helpers: seeded random inputs, awkward layouts, and comparison of a result with a float64
// reference, reporting the max abs error, the relative L2 error and the worst index.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace xdit::testing

#define EXPECT_MATCHES_REFERENCE(actual, expected) EXPECT_TRUE(::xdit::testing::matches_reference(actual, expected))
