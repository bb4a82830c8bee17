// RMSNorm, LayerNorm and GroupNorm against float64 references written here.
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

constexpr float kEps = 1e-6f;

// ---- references (rows over the last dim)

std::vector<double> reference_rms_norm(const std::vector<double>& x, int64_t width, const std::vector<double>& weight,
                                       double eps) {
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / width; ++row) {
    const double* in = &x[row * width];
    double square_sum = 0;
    for (int64_t i = 0; i < width; ++i) square_sum += in[i] * in[i];
    const double inv = 1.0 / std::sqrt(square_sum / width + eps);
    for (int64_t i = 0; i < width; ++i) y[row * width + i] = in[i] * inv * (weight.empty() ? 1.0 : weight[i]);
  }
  return y;
}

std::vector<double> reference_layer_norm(const std::vector<double>& x, int64_t width,
                                         const std::vector<double>& weight, const std::vector<double>& bias,
                                         double eps) {
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / width; ++row) {
    const double* in = &x[row * width];
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < width; ++i) mean += in[i];
    mean /= width;
    for (int64_t i = 0; i < width; ++i) variance += (in[i] - mean) * (in[i] - mean);
    variance /= width;
    const double inv = 1.0 / std::sqrt(variance + eps);
    for (int64_t i = 0; i < width; ++i) {
      y[row * width + i] =
          (in[i] - mean) * inv * (weight.empty() ? 1.0 : weight[i]) + (bias.empty() ? 0.0 : bias[i]);
    }
  }
  return y;
}

// x [N, C, spatial...] dense values.
std::vector<double> reference_group_norm(const std::vector<double>& x, const Shape& shape, int64_t groups,
                                         const std::vector<double>& weight, const std::vector<double>& bias,
                                         double eps) {
  const int64_t batch = shape[0], channels = shape[1];
  int64_t spatial = 1;
  for (size_t d = 2; d < shape.size(); ++d) spatial *= shape[d];
  const int64_t per_group = channels / groups * spatial;
  std::vector<double> y(x.size());
  for (int64_t g = 0; g < batch * groups; ++g) {
    const double* in = &x[g * per_group];
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < per_group; ++i) mean += in[i];
    mean /= per_group;
    for (int64_t i = 0; i < per_group; ++i) variance += (in[i] - mean) * (in[i] - mean);
    variance /= per_group;
    const double inv = 1.0 / std::sqrt(variance + eps);
    for (int64_t i = 0; i < per_group; ++i) {
      const int64_t c = (g % groups) * (channels / groups) + i / spatial;
      y[g * per_group + i] =
          (in[i] - mean) * inv * (weight.empty() ? 1.0 : weight[c]) + (bias.empty() ? 0.0 : bias[c]);
    }
  }
  return y;
}

// ---- rms_norm and layer_norm over shapes x dtypes, in every layout, with and without parameters

struct NormCase {
  Shape shape;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<NormCase>& info) {
  std::string name(dtype_name(info.param.dtype));
  for (int64_t s : info.param.shape) name += '_' + std::to_string(s);
  return name;
}

class RowNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RowNormTest, RmsNormMatchesReference) {
  const auto& [shape, dtype] = GetParam();
  const int64_t width = shape.back();
  const Tensor x = random_tensor(shape, dtype, 11, -2.0f, 2.0f);
  const Tensor weight = random_tensor({width}, dtype, 12, 0.5f, 1.5f);
  for (Layout layout : kAllLayouts) {
    SCOPED_TRACE(layout_name(layout));
    const Tensor input = in_layout(x, layout);
    const Tensor plain = ops::rms_norm(input, {}, kEps);
    EXPECT_EQ(plain.shape(), shape);
    EXPECT_EQ(plain.dtype(), dtype);
    EXPECT_TRUE(matches_reference(plain, reference_rms_norm(values(x), width, {}, kEps)));
    const Tensor scaled = ops::rms_norm(input, weight, kEps);
    EXPECT_TRUE(matches_reference(scaled, reference_rms_norm(values(x), width, values(weight), kEps)));
  }
}

TEST_P(RowNormTest, LayerNormMatchesReference) {
  const auto& [shape, dtype] = GetParam();
  const int64_t width = shape.back();
  const Tensor x = random_tensor(shape, dtype, 21, -2.0f, 2.0f);
  const Tensor weight = random_tensor({width}, dtype, 22, 0.5f, 1.5f);
  const Tensor bias = random_tensor({width}, dtype, 23, -0.5f, 0.5f);
  for (Layout layout : kAllLayouts) {
    SCOPED_TRACE(layout_name(layout));
    const Tensor input = in_layout(x, layout);
    const Tensor plain = ops::layer_norm(input, {}, {}, kEps);
    EXPECT_EQ(plain.shape(), shape);
    EXPECT_EQ(plain.dtype(), dtype);
    EXPECT_TRUE(matches_reference(plain, reference_layer_norm(values(x), width, {}, {}, kEps)));
    const Tensor affine = ops::layer_norm(input, weight, bias, kEps);
    EXPECT_TRUE(matches_reference(affine, reference_layer_norm(values(x), width, values(weight), values(bias), kEps)));
    const Tensor weight_only = ops::layer_norm(input, weight, {}, kEps);
    EXPECT_TRUE(matches_reference(weight_only, reference_layer_norm(values(x), width, values(weight), {}, kEps)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RowNormTest,
                         ::testing::Values(NormCase{{1}, DType::F32}, NormCase{{3}, DType::BF16},
                                           NormCase{{4, 17}, DType::F32}, NormCase{{4, 17}, DType::BF16},
                                           NormCase{{9, 127}, DType::F32}, NormCase{{9, 127}, DType::BF16},
                                           NormCase{{2, 3, 5, 33}, DType::F32}, NormCase{{2, 3, 5, 33}, DType::BF16},
                                           NormCase{{2, 7, 3072}, DType::F32}, NormCase{{2, 7, 3072}, DType::BF16}),
                         case_name);

TEST(RmsNorm, WeightMayDifferInDtypeFromX) {
  const Tensor x = random_tensor({6, 40}, DType::BF16, 31);
  const Tensor weight = random_tensor({40}, DType::F32, 32, 0.5f, 1.5f);
  EXPECT_TRUE(matches_reference(ops::rms_norm(x, weight, 1e-5f),
                                reference_rms_norm(values(x), 40, values(weight), 1e-5)));
}

TEST(RmsNorm, EpsDominatesTinyRows) {
  const Tensor x = random_tensor({3, 19}, DType::F32, 33, -1e-4f, 1e-4f);
  EXPECT_TRUE(matches_reference(ops::rms_norm(x, {}, 1e-2f), reference_rms_norm(values(x), 19, {}, 1e-2)));
}

// A naive E[x^2] - E[x]^2 in f32 loses everything here; the mean must be removed precisely.
TEST(LayerNorm, StableForLargeMeanOffsets) {
  for (float offset : {100.0f, 1e4f}) {
    SCOPED_TRACE(offset);
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(dtype_name(dtype));
      const Tensor x = random_tensor({5, 3072}, dtype, 41, offset - 1.0f, offset + 1.0f);
      const Tensor weight = random_tensor({3072}, DType::F32, 42, 0.5f, 1.5f);
      const Tensor bias = random_tensor({3072}, DType::F32, 43, -0.5f, 0.5f);
      EXPECT_TRUE(matches_reference(ops::layer_norm(x, {}, {}, kEps),
                                    reference_layer_norm(values(x), 3072, {}, {}, kEps)));
      EXPECT_TRUE(matches_reference(ops::layer_norm(x, weight, bias, kEps),
                                    reference_layer_norm(values(x), 3072, values(weight), values(bias), kEps)));
    }
  }
}

TEST(LayerNorm, ConstantRowsGiveTheBias) {
  const Tensor x = Tensor::full({2, 64}, 3.25f, DType::F32);
  const Tensor bias = random_tensor({64}, DType::F32, 44);
  EXPECT_TRUE(matches_reference(ops::layer_norm(x, {}, bias, kEps), reference_layer_norm(values(x), 64, {}, values(bias), kEps)));
}

// ---- group_norm

struct GroupCase {
  Shape shape;
  int64_t groups;
};

class GroupNormTest : public ::testing::TestWithParam<GroupCase> {};

TEST_P(GroupNormTest, MatchesReference) {
  const auto& [shape, groups] = GetParam();
  const int64_t channels = shape[1];
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = random_tensor(shape, dtype, 51, -3.0f, 1.0f);
    const Tensor weight = random_tensor({channels}, dtype, 52, 0.5f, 1.5f);
    const Tensor bias = random_tensor({channels}, dtype, 53, -0.5f, 0.5f);
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(layout_name(layout));
      const Tensor input = in_layout(x, layout);
      const Tensor plain = ops::group_norm(input, groups, {}, {}, kEps);
      EXPECT_EQ(plain.shape(), shape);
      EXPECT_EQ(plain.dtype(), dtype);
      EXPECT_TRUE(matches_reference(plain, reference_group_norm(values(x), shape, groups, {}, {}, kEps)));
      const Tensor affine = ops::group_norm(input, groups, weight, bias, kEps);
      EXPECT_TRUE(matches_reference(
          affine, reference_group_norm(values(x), shape, groups, values(weight), values(bias), kEps)));
    }
  }
}

std::string group_case_name(const ::testing::TestParamInfo<GroupCase>& info) {
  std::string name = "groups" + std::to_string(info.param.groups);
  for (int64_t s : info.param.shape) name += '_' + std::to_string(s);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupNormTest,
                         ::testing::Values(GroupCase{{2, 64}, 32},             // no spatial dims
                                           GroupCase{{2, 6}, 1},               //
                                           GroupCase{{2, 64, 5, 7}, 32},       // image
                                           GroupCase{{2, 12, 17, 3}, 1},       //
                                           GroupCase{{2, 3, 11, 13}, 3},       // one channel per group
                                           GroupCase{{2, 64, 3, 4, 5}, 32},    // video [N, C, T, H, W]
                                           GroupCase{{1, 4, 3, 130, 131}, 2}), // groups over many blocks
                         group_case_name);

// One group of ~200k elements far from zero: the per-block moments must merge exactly.
TEST(GroupNorm, LargeGroupsWithLargeMean) {
  const Shape shape{1, 8, 160, 160};
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = random_tensor(shape, dtype, 61, 99.0f, 101.0f);
    const Tensor weight = random_tensor({8}, DType::F32, 62, 0.5f, 1.5f);
    const Tensor bias = random_tensor({8}, DType::F32, 63, -0.5f, 0.5f);
    EXPECT_TRUE(matches_reference(ops::group_norm(x, 1, weight, bias, kEps),
                                  reference_group_norm(values(x), shape, 1, values(weight), values(bias), kEps)));
    EXPECT_TRUE(matches_reference(ops::group_norm(x, 4, {}, {}, kEps),
                                  reference_group_norm(values(x), shape, 4, {}, {}, kEps)));
  }
}

TEST(GroupNorm, EmptyBatchGivesEmptyResult) {
  const Tensor x = Tensor::empty({0, 8, 4}, DType::F32);
  EXPECT_EQ(ops::group_norm(x, 4, {}, {}, kEps).shape(), (Shape{0, 8, 4}));
}

// ---- argument validation

TEST(NormValidation, BadArgumentsThrowNamedErrors) {
  const Tensor x = random_tensor({4, 16}, DType::F32, 71);
  const Tensor w15 = random_tensor({15}, DType::F32, 72);
  const Tensor w16x1 = random_tensor({16, 1}, DType::F32, 73);
  const Tensor ints = Tensor::zeros({4, 16}, DType::I32);
  expect_error([&] { ops::rms_norm(x, w15, kEps); }, {"rms_norm"});
  expect_error([&] { ops::rms_norm(x, w16x1, kEps); }, {"rms_norm"});
  expect_error([&] { ops::rms_norm(ints, {}, kEps); }, {"rms_norm"});
  expect_error([&] { ops::rms_norm(x, {}, -1.0f); }, {"rms_norm"});
  expect_error([&] { ops::rms_norm(Tensor{}, {}, kEps); }, {"rms_norm"});
  expect_error([&] { ops::layer_norm(x, w15, {}, kEps); }, {"layer_norm"});
  expect_error([&] { ops::layer_norm(x, {}, w15, kEps); }, {"layer_norm"});
  expect_error([&] { ops::layer_norm(x, {}, Tensor::zeros({16}, DType::I64), kEps); }, {"layer_norm"});
  expect_error([&] { ops::layer_norm(x, {}, {}, NAN); }, {"layer_norm"});

  const Tensor image = random_tensor({2, 12, 3, 3}, DType::F32, 74);
  expect_error([&] { ops::group_norm(image, 5, {}, {}, kEps); }, {"group_norm"});
  expect_error([&] { ops::group_norm(image, 0, {}, {}, kEps); }, {"group_norm"});
  expect_error([&] { ops::group_norm(image, 4, random_tensor({11}, DType::F32, 75), {}, kEps); }, {"group_norm"});
  expect_error([&] { ops::group_norm(image, 4, {}, random_tensor({24}, DType::F32, 76), kEps); }, {"group_norm"});
  expect_error([&] { ops::group_norm(random_tensor({12}, DType::F32, 77), 4, {}, {}, kEps); }, {"group_norm"});
}

}  // namespace
}  // namespace xdit
