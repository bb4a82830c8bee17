// Reductions (sum, mean, l1_norm, var) against float64 references written here.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/reference.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::in_layout;
using testing::kAllLayouts;
using testing::Layout;
using testing::layout_name;
using testing::matches_reference;
using testing::random_tensor;
using testing::values;

enum class Kind { Sum, Mean, AbsSum, Var };

// Groups the dense values by output element: for each output, the values reduced into it.
std::vector<std::vector<double>> group_by_output(const std::vector<double>& x, const Shape& shape,
                                                 const std::vector<int64_t>& dims) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) reduced[d < 0 ? d + ndim : d] = true;
  int64_t outputs = 1;
  for (int64_t d = 0; d < ndim; ++d) outputs *= reduced[d] ? 1 : shape[d];
  std::vector<std::vector<double>> groups(static_cast<size_t>(outputs));
  std::vector<int64_t> index(static_cast<size_t>(ndim), 0);
  for (double v : x) {
    int64_t out = 0;
    for (int64_t d = 0; d < ndim; ++d) {
      if (!reduced[d]) out = out * shape[d] + index[d];
    }
    groups[out].push_back(v);
    for (int64_t d = ndim - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return groups;
}

std::vector<double> reference(Kind kind, const std::vector<double>& x, const Shape& shape,
                              const std::vector<int64_t>& dims, int64_t correction = 1) {
  std::vector<double> out;
  for (const std::vector<double>& group : group_by_output(x, shape, dims)) {
    double sum = 0, abs_sum = 0;
    for (double v : group) {
      sum += v;
      abs_sum += std::fabs(v);
    }
    const double n = static_cast<double>(group.size());
    double squares = 0;
    for (double v : group) squares += (v - sum / n) * (v - sum / n);
    switch (kind) {
      case Kind::Sum: out.push_back(sum); break;
      case Kind::Mean: out.push_back(sum / n); break;
      case Kind::AbsSum: out.push_back(abs_sum); break;
      case Kind::Var: out.push_back(squares / (n - static_cast<double>(correction))); break;
    }
  }
  return out;
}

Shape reference_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) reduced[d < 0 ? d + ndim : d] = true;
  Shape out;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

struct ReduceCase {
  Shape shape;
  std::vector<std::vector<int64_t>> dim_sets;
};

std::string reduce_case_name(const ::testing::TestParamInfo<ReduceCase>& info) {
  std::string name = "shape";
  for (int64_t s : info.param.shape) name += '_' + std::to_string(s);
  return name;
}

class ReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceTest, AllOpsMatchReferenceOverDimSetsLayoutsAndDtypes) {
  const auto& [shape, dim_sets] = GetParam();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Offset from zero so that sum, |x| and var all see cancellation-prone data.
    const Tensor x = random_tensor(shape, dtype, 101, -1.0f, 3.0f);
    const std::vector<double> xs = values(x);
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(layout_name(layout));
      const Tensor input = in_layout(x, layout);
      for (const std::vector<int64_t>& dims : dim_sets) {
        SCOPED_TRACE(::testing::PrintToString(dims));
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(keepdim ? "keepdim" : "no keepdim");
          const Shape out_shape = reference_shape(shape, dims, keepdim);
          const Tensor sum = ops::sum(input, dims, keepdim);
          EXPECT_EQ(sum.shape(), out_shape);
          EXPECT_EQ(sum.dtype(), DType::F32);
          EXPECT_TRUE(matches_reference(sum, reference(Kind::Sum, xs, shape, dims)));
          const Tensor mean = ops::mean(input, dims, keepdim);
          EXPECT_EQ(mean.shape(), out_shape);
          EXPECT_TRUE(matches_reference(mean, reference(Kind::Mean, xs, shape, dims)));
          const Tensor l1 = ops::l1_norm(input, dims, keepdim);
          EXPECT_EQ(l1.shape(), out_shape);
          EXPECT_TRUE(matches_reference(l1, reference(Kind::AbsSum, xs, shape, dims)));
        }
        for (int64_t correction : {0, 1}) {
          SCOPED_TRACE(correction);
          const Tensor var = ops::var(input, dims, correction, false);
          EXPECT_EQ(var.shape(), reference_shape(shape, dims, false));
          const std::vector<double> expected = reference(Kind::Var, xs, shape, dims, correction);
          if (std::isnan(expected[0])) {  // one element per output with Bessel's correction: 0 / 0
            for (double v : var.to_doubles()) EXPECT_TRUE(std::isnan(v));
          } else {
            EXPECT_TRUE(matches_reference(var, expected));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReduceTest,
    ::testing::Values(ReduceCase{{1}, {{}, {0}}},  //
                      ReduceCase{{3}, {{}, {-1}}},
                      ReduceCase{{17}, {{}, {0}}},
                      ReduceCase{{5, 127}, {{}, {-1}, {0}, {0, 1}}},
                      ReduceCase{{3, 3072}, {{}, {1}, {0}}},
                      ReduceCase{{2, 3, 5, 7}, {{}, {-1}, {1, 2}, {0, 2}, {0, -1}, {3, 1}, {0, 1, 2, 3}}},
                      ReduceCase{{4, 1, 33}, {{}, {1}, {0, 1}, {2}}}),  // size-1 dims kept and reduced
    reduce_case_name);

// Reductions long enough to be split into several parallel chunks.
TEST(Reduce, LongReductionsSplitAcrossChunks) {
  const Shape shape{3, 70001};
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = random_tensor(shape, dtype, 111, -1.0f, 2.0f);
    const std::vector<double> xs = values(x);
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{}, std::vector<int64_t>{1}}) {
      SCOPED_TRACE(::testing::PrintToString(dims));
      EXPECT_TRUE(matches_reference(ops::sum(x, dims), reference(Kind::Sum, xs, shape, dims)));
      EXPECT_TRUE(matches_reference(ops::l1_norm(x, dims), reference(Kind::AbsSum, xs, shape, dims)));
      EXPECT_TRUE(matches_reference(ops::var(x, dims, 1), reference(Kind::Var, xs, shape, dims, 1)));
      EXPECT_TRUE(
          matches_reference(ops::mean(testing::transposed_storage(x), dims), reference(Kind::Mean, xs, shape, dims)));
    }
  }
}

// The step cache's residual check: relative L1 of two activations, |a - b|_1 / |a|_1, in f64.
TEST(Reduce, RelativeL1OfTwoActivations) {
  const Shape shape{1, 256, 3072};
  const Tensor a = random_tensor(shape, DType::BF16, 121);
  const std::vector<double> av = values(a), bv = values(random_tensor(shape, DType::BF16, 122));
  std::vector<double> difference(av.size());
  double diff_l1 = 0, a_l1 = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    difference[i] = av[i] - bv[i];
    diff_l1 += std::fabs(difference[i]);
    a_l1 += std::fabs(av[i]);
  }
  const Tensor l1_a = ops::l1_norm(a);
  const Tensor l1_diff = ops::l1_norm(Tensor::from_doubles(difference, shape, DType::F32));
  EXPECT_EQ(l1_a.dim(), 0);
  EXPECT_TRUE(matches_reference(l1_a, {a_l1}));
  EXPECT_TRUE(matches_reference(l1_diff, {diff_l1}));
  const double ratio = l1_diff.to_doubles()[0] / l1_a.to_doubles()[0];
  EXPECT_NEAR(ratio, diff_l1 / a_l1, 1e-6 * (diff_l1 / a_l1));
}

TEST(Var, ExactForLargeMeans) {
  const Shape shape{4, 5000};
  const Tensor x = random_tensor(shape, DType::F32, 131, 1e4f - 1.0f, 1e4f + 1.0f);
  const std::vector<double> xs = values(x);
  EXPECT_TRUE(matches_reference(ops::var(x, {1}, 1), reference(Kind::Var, xs, shape, {1}, 1)));
  EXPECT_TRUE(matches_reference(ops::var(x, {}, 0, true), reference(Kind::Var, xs, shape, {}, 0)));
  EXPECT_EQ(ops::var(x, {}, 0, true).shape(), (Shape{1, 1}));
}

TEST(Reduce, EmptyReductionsFollowTorch) {
  const Tensor x = Tensor::zeros({0, 3}, DType::F32);
  EXPECT_EQ(ops::sum(x, {0}).to_doubles(), (std::vector<double>{0, 0, 0}));
  for (double v : ops::mean(x, {0}).to_doubles()) EXPECT_TRUE(std::isnan(v));
  for (double v : ops::var(x, {0}).to_doubles()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(ops::sum(x, {1}).shape(), (Shape{0}));
  // One element with Bessel's correction: 0 / 0.
  EXPECT_TRUE(std::isnan(ops::var(Tensor::full({1}, 2.0f, DType::F32)).to_doubles()[0]));
}

TEST(ReduceValidation, BadArgumentsThrowNamedErrors) {
  const Tensor x = random_tensor({2, 3, 4}, DType::F32, 141);
  expect_error([&] { ops::sum(x, {3}); }, {"sum"});
  expect_error([&] { ops::mean(x, {-4}); }, {"mean"});
  expect_error([&] { ops::l1_norm(x, {1, -2}); }, {"l1_norm"});  // the same dim twice
  expect_error([&] { ops::sum(x, {0, 0}); }, {"sum"});
  expect_error([&] { ops::var(x, {0}, -1); }, {"var"});
  expect_error([&] { ops::var(x, {5}); }, {"var"});
  expect_error([&] { ops::sum(Tensor::zeros({2, 3}, DType::I64)); }, {"sum"});
  expect_error([&] { ops::mean(Tensor{}); }, {"mean"});
}

}  // namespace
}  // namespace xdit
