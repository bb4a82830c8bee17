#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/reference.h"
#include "xdit/core/tensor.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::in_layout;
using testing::Layout;
using testing::layout_name;
using testing::matches_reference;
using testing::random_tensor;
using testing::values;

// ---- float64 references

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double gelu_erf_ref(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
// 0.5·x·(1 + tanh(u)) written as x / (1 + e^(-2u)), the same function without the cancellation
// that makes 1 + tanh(u) lose all digits in double for u < -19.
double gelu_tanh_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

std::vector<double> map_ref(const std::vector<double>& x, const std::function<double(double)>& f) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i]);
  return out;
}

// Softmax over the last dim of logical values with rows of n.
std::vector<double> softmax_ref(const std::vector<double>& x, int64_t n) {
  std::vector<double> out(x.size());
  for (size_t row = 0; row < x.size() / n; ++row) {
    const double* in = x.data() + row * n;
    double max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, in[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(in[i] - max);
    for (int64_t i = 0; i < n; ++i) out[row * n + i] = std::exp(in[i] - max) / sum;
  }
  return out;
}

std::vector<double> swiglu_ref(const std::vector<double>& x, int64_t two_f) {
  const int64_t f = two_f / 2;
  std::vector<double> out;
  for (size_t row = 0; row < x.size() / two_f; ++row) {
    for (int64_t i = 0; i < f; ++i) out.push_back(silu_ref(x[row * two_f + i]) * x[row * two_f + f + i]);
  }
  return out;
}

const std::vector<Shape> kShapes = {{1}, {17}, {3, 33}, {2, 5, 127}, {2, 3, 4, 17}};

struct Case {
  DType dtype;
  Layout layout;
};

class ActivationTest : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_" + layout_name(info.param.layout);
}

INSTANTIATE_TEST_SUITE_P(All, ActivationTest,
                         ::testing::Values(Case{DType::F32, Layout::Contiguous}, Case{DType::F32, Layout::PaddedRows},
                                           Case{DType::F32, Layout::Transposed}, Case{DType::BF16, Layout::Contiguous},
                                           Case{DType::BF16, Layout::PaddedRows},
                                           Case{DType::BF16, Layout::Transposed}),
                         case_name);

TEST_P(ActivationTest, UnaryActivationsMatchReference) {
  uint64_t seed = 1;
  for (const Shape& shape : kShapes) {
    const Tensor dense = random_tensor(shape, GetParam().dtype, seed++, -8.0f, 8.0f);
    const Tensor x = in_layout(dense, GetParam().layout);
    const std::vector<double> xv = values(dense);
    SCOPED_TRACE(shape_str(shape));
    const Tensor s = ops::silu(x);
    EXPECT_EQ(s.shape(), shape);
    EXPECT_EQ(s.dtype(), GetParam().dtype);
    EXPECT_TRUE(s.is_contiguous());
    EXPECT_FALSE(s.shares_storage_with(x));
    EXPECT_TRUE(matches_reference(s, map_ref(xv, silu_ref)));
    EXPECT_TRUE(matches_reference(ops::gelu(x), map_ref(xv, gelu_erf_ref)));
    EXPECT_TRUE(matches_reference(ops::gelu(x, GeluApproximation::Tanh), map_ref(xv, gelu_tanh_ref)));
  }
}

TEST_P(ActivationTest, SoftmaxMatchesReference) {
  uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    const Tensor dense = random_tensor(shape, GetParam().dtype, seed++, -6.0f, 6.0f);
    const Tensor y = ops::softmax(in_layout(dense, GetParam().layout));
    SCOPED_TRACE(shape_str(shape));
    EXPECT_EQ(y.shape(), shape);
    EXPECT_TRUE(matches_reference(y, softmax_ref(values(dense), shape.back())));
  }
}

TEST_P(ActivationTest, SwigluMatchesReference) {
  uint64_t seed = 200;
  for (Shape shape : std::vector<Shape>{{2}, {6}, {3, 34}, {2, 5, 128}, {2, 3, 4, 66}}) {
    const Tensor dense = random_tensor(shape, GetParam().dtype, seed++, -5.0f, 5.0f);
    const Tensor y = ops::swiglu(in_layout(dense, GetParam().layout));
    SCOPED_TRACE(shape_str(shape));
    Shape expected_shape = shape;
    expected_shape.back() /= 2;
    EXPECT_EQ(y.shape(), expected_shape);
    EXPECT_TRUE(matches_reference(y, swiglu_ref(values(dense), shape.back())));
  }
}

// Inputs from -80 to 80 in steps of 1/64, in every dtype and layout.
TEST_P(ActivationTest, UnaryActivationsOnWideGrid) {
  std::vector<float> grid;
  for (int i = -80 * 64; i <= 80 * 64; ++i) grid.push_back(static_cast<float>(i) / 64.0f);
  const Tensor dense =
      Tensor::from_floats(grid, {static_cast<int64_t>(grid.size()) / 7, 7}, GetParam().dtype);  // 10241 = 1463 x 7
  const Tensor x = in_layout(dense, GetParam().layout);
  const std::vector<double> xv = values(dense);
  EXPECT_TRUE(matches_reference(ops::silu(x), map_ref(xv, silu_ref)));
  EXPECT_TRUE(matches_reference(ops::gelu(x), map_ref(xv, gelu_erf_ref)));
  EXPECT_TRUE(matches_reference(ops::gelu(x, GeluApproximation::Tanh), map_ref(xv, gelu_tanh_ref)));
}

// Each element on its own, not just normwise: the f32 kernels are accurate to a few ulp, also in
// the tails where the results are tiny (no cancellation, no overflow of intermediate values).
TEST(Activation, F32ElementsAreAccurateToAFewUlp) {
  std::vector<float> grid;
  for (int i = -80 * 256; i <= 80 * 256; ++i) grid.push_back(static_cast<float>(i) / 256.0f + 1.0f / 1024.0f);
  const Tensor x = Tensor::from_floats(grid, {static_cast<int64_t>(grid.size())});
  const std::vector<double> silu = values(ops::silu(x));
  const std::vector<double> gelu = values(ops::gelu(x));
  const std::vector<double> gelu_tanh = values(ops::gelu(x, GeluApproximation::Tanh));
  constexpr double kUlp = 1.0 / (1 << 23);
  constexpr double kSmallestNormal = std::numeric_limits<float>::min();
  for (size_t i = 0; i < grid.size(); ++i) {
    const double v = grid[i];
    const double silu_expected = silu_ref(v), gelu_expected = gelu_erf_ref(v), tanh_expected = gelu_tanh_ref(v);
    if (std::fabs(silu_expected) > kSmallestNormal) {
      EXPECT_LE(std::fabs(silu[i] - silu_expected), 4 * kUlp * std::fabs(silu_expected)) << "silu(" << v << ")";
    }
    if (std::fabs(gelu_expected) > kSmallestNormal) {
      EXPECT_LE(std::fabs(gelu[i] - gelu_expected), 10 * kUlp * std::fabs(gelu_expected)) << "gelu(" << v << ")";
    }
    if (std::fabs(tanh_expected) > kSmallestNormal) {
      // The tanh form's argument 2u is itself rounded, which moves a tail value by ~|2u| ulp.
      const double two_u = 2.0 * std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
      EXPECT_LE(std::fabs(gelu_tanh[i] - tanh_expected), (4 + std::fabs(two_u)) * kUlp * std::fabs(tanh_expected))
          << "gelu_tanh(" << v << ")";
    }
  }
}

TEST(Activation, ExtremeInputsStayFinite) {
  const std::vector<float> inputs = {-1e30f, -100.0f, -89.0f, -50.0f, -0.0f, 0.0f, 50.0f, 89.0f, 100.0f, 1e30f};
  const Tensor x = Tensor::from_floats(inputs, {static_cast<int64_t>(inputs.size())});
  const std::vector<std::pair<Tensor, double (*)(double)>> results = {
      {ops::silu(x), silu_ref}, {ops::gelu(x), gelu_erf_ref}, {ops::gelu(x, GeluApproximation::Tanh), gelu_tanh_ref}};
  for (const auto& [y, reference] : results) {
    const std::vector<double> v = values(y);
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_TRUE(std::isfinite(v[i])) << "input " << inputs[i];
      // Large negative inputs give a tiny negative value or -0, large positive ones x itself.
      const double expected = reference(inputs[i]);
      EXPECT_NEAR(v[i], expected, 1e-6 * std::max(1.0, std::fabs(expected))) << "input " << inputs[i];
    }
  }
}

TEST(Activation, SoftmaxHandlesLargeAndInfiniteLogits) {
  // Rows of 4: a huge gap, huge values, large negatives with -inf, a single finite entry.
  const std::vector<float> logits = {1000.0f, 0.0f,      -1000.0f, 999.0f, 3e38f,     3e38f,     -3e38f, 0.0f,
                                     -1e30f,  -INFINITY, -5.0f,    -1e30f, -INFINITY, -INFINITY, 7.0f,   -INFINITY};
  const std::vector<double> expected = {1.0 / (1.0 + std::exp(-1.0)),
                                        0.0,
                                        0.0,
                                        std::exp(-1.0) / (1.0 + std::exp(-1.0)),
                                        0.5,
                                        0.5,
                                        0.0,
                                        0.0,
                                        0.0,
                                        0.0,
                                        1.0,
                                        0.0,
                                        0.0,
                                        0.0,
                                        1.0,
                                        0.0};
  EXPECT_TRUE(matches_reference(ops::softmax(Tensor::from_floats(logits, {4, 4})), expected));
  // In bf16, 999 rounds to 1000: the reference takes the rounded logits.
  const Tensor x = Tensor::from_floats(logits, {4, 4}, DType::BF16);
  EXPECT_TRUE(matches_reference(ops::softmax(x), softmax_ref(values(x), 4)));
}

TEST(Activation, SoftmaxOfLongRowsAndManyRows) {
  // Rows long enough for several vector blocks, and enough rows to be split among threads.
  for (const Shape& shape : std::vector<Shape>{{3, 4099}, {1000, 7}, {2, 513, 33}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Tensor x = random_tensor(shape, dtype, 7, -30.0f, 30.0f);
      EXPECT_TRUE(matches_reference(ops::softmax(x), softmax_ref(values(x), shape.back())))
          << shape_str(shape) << " " << dtype_name(dtype);
    }
  }
}

TEST(Activation, SoftmaxOfNarrowedAndExpandedViews) {
  const Tensor base = random_tensor({5, 40}, DType::F32, 11, -4.0f, 4.0f);
  const Tensor narrowed = base.narrow(1, 3, 29);
  EXPECT_TRUE(matches_reference(ops::softmax(narrowed), softmax_ref(values(narrowed), 29)));
  const Tensor row = random_tensor({1, 19}, DType::BF16, 12, -4.0f, 4.0f);
  const Tensor expanded = row.expand({6, 19});
  EXPECT_TRUE(matches_reference(ops::softmax(expanded), softmax_ref(values(expanded), 19)));
}

TEST(Activation, SwigluOfASplitView) {
  // As in FLUX.2's single block: swiglu takes the MLP part of a fused projection, a narrowed view.
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor fused = random_tensor({2, 9, 3 * 17 + 2 * 40}, dtype, 21, -6.0f, 6.0f);
    const Tensor mlp = ops::split(fused, {3 * 17, 2 * 40}, -1)[1];
    const Tensor y = ops::swiglu(mlp);
    EXPECT_EQ(y.shape(), (Shape{2, 9, 40}));
    EXPECT_TRUE(matches_reference(y, swiglu_ref(values(mlp), 80))) << dtype_name(dtype);
  }
}

TEST(Activation, LargeTensorsSplitAmongThreads) {
  const Shape shape = {3, 40001};
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = random_tensor(shape, dtype, 31, -10.0f, 10.0f);
    const std::vector<double> xv = values(x);
    EXPECT_TRUE(matches_reference(ops::silu(x), map_ref(xv, silu_ref)));
    EXPECT_TRUE(matches_reference(ops::gelu(x), map_ref(xv, gelu_erf_ref)));
    const Tensor wide = random_tensor({5, 2 * 20001}, dtype, 32, -6.0f, 6.0f);
    EXPECT_TRUE(matches_reference(ops::swiglu(wide), swiglu_ref(values(wide), 2 * 20001)));
  }
}

TEST(Activation, ZeroDimAndEmptyTensors) {
  const Tensor scalar = Tensor::from_floats(std::vector<float>{-1.5f}, {});
  const Tensor s = ops::silu(scalar);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_TRUE(matches_reference(s, {silu_ref(-1.5)}));
  const Tensor empty = Tensor::empty({3, 0}, DType::F32);
  EXPECT_EQ(ops::gelu(empty).shape(), (Shape{3, 0}));
  EXPECT_EQ(ops::softmax(empty).shape(), (Shape{3, 0}));
  EXPECT_EQ(ops::swiglu(empty).shape(), (Shape{3, 0}));
}

TEST(Activation, ValidationErrorsNameTheOp) {
  const Tensor ints = Tensor::zeros({4}, DType::I32);
  expect_error([&] { ops::silu(ints); }, {"silu", "i32"});
  expect_error([&] { ops::gelu(ints); }, {"gelu", "i32"});
  expect_error([&] { ops::softmax(ints); }, {"softmax", "i32"});
  expect_error([&] { ops::swiglu(Tensor::zeros({2, 7}, DType::F32)); }, {"swiglu", "[2, 7]", "even"});
  expect_error([&] { ops::swiglu(Tensor()); }, {"swiglu", "undefined"});
  expect_error([&] { ops::softmax(Tensor::from_floats(std::vector<float>{1.0f}, {})); }, {"softmax", "[]"});
  expect_error([&] { ops::gelu(Tensor::zeros({3}, DType::F32), static_cast<GeluApproximation>(7)); },
               {"gelu", "approximation"});
}

}  // namespace
}  // namespace xdit
