#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
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

// ---- float64 reference broadcasting, written from the numpy rules

// The values of a tensor (logical row-major `v` of `shape`) broadcast to `out_shape`.
std::vector<double> broadcast_ref(const std::vector<double>& v, const Shape& shape, const Shape& out_shape) {
  const size_t lead = out_shape.size() - shape.size();
  std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)));
  for (size_t flat = 0; flat < out.size(); ++flat) {
    size_t rest = flat, source = 0, source_stride = 1;
    for (size_t d = out_shape.size(); d-- > lead;) {
      const size_t i = rest % out_shape[d];
      rest /= out_shape[d];
      const size_t own = shape[d - lead];
      source += (own == 1 ? 0 : i) * source_stride;
      source_stride *= own;
    }
    out[flat] = v[source];
  }
  return out;
}

using Fn2 = std::function<double(double, double)>;
using Fn3 = std::function<double(double, double, double)>;

std::vector<double> zip_ref(const std::vector<double>& a, const std::vector<double>& b, const Fn2& f) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = f(a[i], b[i]);
  return out;
}

std::vector<double> zip_ref(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
                            const Fn3& f) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = f(a[i], b[i], c[i]);
  return out;
}

struct ShapePair {
  Shape a, b;
};

// Same shapes, a bias row, per-batch vectors, per-channel scalars, a one-element and a 0-dim
// operand, both sides broadcasting, and the broadcast operand on the left.
const std::vector<ShapePair> kBroadcasts = {
    {{1}, {1}},
    {{33}, {33}},
    {{2, 3, 17}, {2, 3, 17}},
    {{2, 5, 33}, {33}},
    {{3, 7, 19}, {3, 1, 19}},
    {{2, 3, 5, 7}, {1, 3, 1, 1}},
    {{3, 17}, {1}},
    {{4, 9}, {}},
    {{3, 1}, {1, 4}},
    {{5, 1, 7}, {1, 6, 1}},
    {{17}, {2, 3, 17}},
};

struct Case {
  DType a_dtype, b_dtype;
  Layout layout;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.a_dtype)) + "_" + std::string(dtype_name(info.param.b_dtype)) + "_" +
         layout_name(info.param.layout);
}

class ElementwiseTest : public ::testing::TestWithParam<Case> {};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (DType a : {DType::F32, DType::BF16}) {
    for (DType b : {DType::F32, DType::BF16}) {
      for (Layout layout : {Layout::Contiguous, Layout::PaddedRows, Layout::Transposed})
        cases.push_back({a, b, layout});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, ElementwiseTest, ::testing::ValuesIn(all_cases()), case_name);

TEST_P(ElementwiseTest, BinaryOpsBroadcastLikeNumpy) {
  const Case c = GetParam();
  uint64_t seed = 1;
  for (const ShapePair& shapes : kBroadcasts) {
    const Tensor a_dense = random_tensor(shapes.a, c.a_dtype, seed++, -3.0f, 3.0f);
    const Tensor b_dense = random_tensor(shapes.b, c.b_dtype, seed++, 0.5f, 2.0f);  // away from 0 for div
    const Tensor a = in_layout(a_dense, c.layout), b = in_layout(b_dense, c.layout);
    const Shape out_shape = broadcast_shapes(shapes.a, shapes.b);
    const std::vector<double> av = broadcast_ref(values(a_dense), shapes.a, out_shape);
    const std::vector<double> bv = broadcast_ref(values(b_dense), shapes.b, out_shape);
    SCOPED_TRACE(shape_str(shapes.a) + " with " + shape_str(shapes.b));
    const Tensor sum = ops::add(a, b);
    EXPECT_EQ(sum.shape(), out_shape);
    EXPECT_EQ(sum.dtype(), c.a_dtype);
    EXPECT_TRUE(sum.is_contiguous());
    EXPECT_FALSE(sum.shares_storage_with(a));
    EXPECT_TRUE(matches_reference(sum, zip_ref(av, bv, [](double x, double y) { return x + y; })));
    EXPECT_TRUE(matches_reference(ops::sub(a, b), zip_ref(av, bv, [](double x, double y) { return x - y; })));
    EXPECT_TRUE(matches_reference(ops::mul(a, b), zip_ref(av, bv, [](double x, double y) { return x * y; })));
    EXPECT_TRUE(matches_reference(ops::div(a, b), zip_ref(av, bv, [](double x, double y) { return x / y; })));
  }
}

TEST_P(ElementwiseTest, ModulateAndGatedResidual) {
  const Case c = GetParam();
  uint64_t seed = 50;
  // Modulation vectors over [B, S, D]: per batch [B, 1, D], shared [1, D] and [D], and one per token.
  const Shape x_shape = {2, 9, 35};
  for (const Shape& vector_shape : std::vector<Shape>{{2, 1, 35}, {1, 35}, {35}, {2, 9, 35}, {1, 1, 1}}) {
    const Tensor x_dense = random_tensor(x_shape, c.a_dtype, seed++, -2.0f, 2.0f);
    const Tensor y_dense = random_tensor(x_shape, c.b_dtype, seed++, -2.0f, 2.0f);
    const Tensor shift_dense = random_tensor(vector_shape, c.b_dtype, seed++, -1.0f, 1.0f);
    const Tensor scale_dense = random_tensor(vector_shape, c.a_dtype, seed++, -1.0f, 1.0f);
    const Tensor x = in_layout(x_dense, c.layout), y = in_layout(y_dense, c.layout);
    const Tensor shift = in_layout(shift_dense, c.layout), scale = in_layout(scale_dense, c.layout);
    const std::vector<double> xv = values(x_dense), yv = values(y_dense);
    const std::vector<double> shift_v = broadcast_ref(values(shift_dense), vector_shape, x_shape);
    const std::vector<double> scale_v = broadcast_ref(values(scale_dense), vector_shape, x_shape);
    SCOPED_TRACE(shape_str(vector_shape));

    const Tensor modulated = ops::modulate(x, shift, scale);
    EXPECT_EQ(modulated.shape(), x_shape);
    EXPECT_EQ(modulated.dtype(), c.a_dtype);
    EXPECT_TRUE(matches_reference(
        modulated, zip_ref(xv, shift_v, scale_v, [](double v, double sh, double sc) { return v * (1.0 + sc) + sh; })));

    const Tensor residual = ops::gated_residual(x, y, scale);
    EXPECT_EQ(residual.shape(), x_shape);
    EXPECT_EQ(residual.dtype(), c.a_dtype);
    EXPECT_FALSE(residual.shares_storage_with(x));
    EXPECT_TRUE(
        matches_reference(residual, zip_ref(xv, yv, scale_v, [](double v, double u, double g) { return v + g * u; })));
  }
}

TEST_P(ElementwiseTest, Scale) {
  const Case c = GetParam();
  for (const Shape& shape : std::vector<Shape>{{1}, {17}, {3, 33}, {2, 3, 4, 17}}) {
    const Tensor dense = random_tensor(shape, c.a_dtype, 70, -5.0f, 5.0f);
    const Tensor y = ops::scale(in_layout(dense, c.layout), -0.37f);
    EXPECT_EQ(y.dtype(), c.a_dtype);
    std::vector<double> expected = values(dense);
    for (double& v : expected) v *= static_cast<double>(-0.37f);
    EXPECT_TRUE(matches_reference(y, expected)) << shape_str(shape);
  }
}

TEST(Elementwise, ExpandedOperands) {
  // expand() gives stride-0 dims on the inputs themselves, including a fully broadcast x.
  const Tensor row = random_tensor({1, 23}, DType::BF16, 80, -1.0f, 1.0f);
  const Tensor column = random_tensor({6, 1}, DType::F32, 81, 0.5f, 2.0f);
  const Tensor a = row.expand({6, 23}), b = column.expand({6, 23});
  const std::vector<double> av = values(a), bv = values(b);
  EXPECT_TRUE(matches_reference(ops::div(a, b), zip_ref(av, bv, [](double x, double y) { return x / y; })));
  EXPECT_TRUE(matches_reference(ops::mul(b, a), zip_ref(bv, av, [](double x, double y) { return x * y; })));
  const Tensor scalar = random_tensor({1, 1}, DType::F32, 82).expand({6, 23});
  EXPECT_TRUE(
      matches_reference(ops::gated_residual(scalar, a, b),
                        zip_ref(values(scalar), av, bv, [](double v, double u, double g) { return v + g * u; })));
}

TEST(Elementwise, LargeTensorsSplitAmongThreads) {
  // Long enough to be split among threads, with splits falling inside rows and inside short runs.
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = random_tensor({3, 40001}, dtype, 90);
    const Tensor bias = random_tensor({40001}, DType::F32, 91);
    EXPECT_TRUE(
        matches_reference(ops::add(x, bias), zip_ref(values(x), broadcast_ref(values(bias), {40001}, {3, 40001}),
                                                     [](double u, double v) { return u + v; })));
    const Tensor y = random_tensor({7, 5001, 3}, dtype, 92);
    const Tensor per_row = random_tensor({5001, 1}, dtype, 93);
    EXPECT_TRUE(matches_reference(ops::mul(y, per_row),
                                  zip_ref(values(y), broadcast_ref(values(per_row), {5001, 1}, {7, 5001, 3}),
                                          [](double u, double v) { return u * v; })));
    const Tensor tokens = random_tensor({2, 4097, 24}, dtype, 94);
    const Tensor shift = random_tensor({2, 1, 24}, dtype, 95), scale = random_tensor({2, 1, 24}, dtype, 96);
    EXPECT_TRUE(matches_reference(ops::modulate(tokens, shift, scale),
                                  zip_ref(values(tokens), broadcast_ref(values(shift), {2, 1, 24}, {2, 4097, 24}),
                                          broadcast_ref(values(scale), {2, 1, 24}, {2, 4097, 24}),
                                          [](double v, double sh, double sc) { return v * (1.0 + sc) + sh; })));
  }
}

// The bf16 store rounds exactly like xdit::f32_to_bf16: nearest even, denormals kept, NaN quieted.
TEST(Elementwise, Bf16ResultsRoundLikeTheScalarConversion) {
  std::mt19937 engine(5);
  std::vector<float> inputs;
  for (int i = 0; i < 4000; ++i) inputs.push_back(bits_to_f32(static_cast<uint32_t>(engine())));
  for (uint32_t bits : {0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                        0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0x80000000u, 0x80008000u}) {
    inputs.push_back(bits_to_f32(bits));
  }
  const int64_t n = static_cast<int64_t>(inputs.size());
  const Tensor zero = Tensor::zeros({n}, DType::BF16);
  const Tensor sum = ops::add(zero, Tensor::from_floats(inputs, {n}));  // 0 + v is v (and +0 for -0)
  ASSERT_EQ(sum.dtype(), DType::BF16);
  const uint16_t* bits = sum.data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(bits[i], f32_to_bf16(0.0f + inputs[i])) << "input bits " << std::hex << f32_to_bits(inputs[i]);
  }
}

TEST(Elementwise, ValidationErrorsNameTheOpAndShapes) {
  const Tensor a = Tensor::zeros({3, 4}, DType::F32);
  expect_error([&] { ops::add(a, Tensor::zeros({5}, DType::F32)); }, {"add", "[3, 4]", "[5]", "broadcast"});
  expect_error(
      [&] {
        ops::div(Tensor::zeros({2, 3}, DType::BF16), Tensor::zeros({3, 2}, DType::BF16));
      },
      {"div", "[2, 3]", "[3, 2]"});
  expect_error([&] { ops::mul(a, Tensor::zeros({4}, DType::I32)); }, {"mul", "i32"});
  expect_error([&] { ops::sub(Tensor::zeros({4}, DType::I64), a); }, {"sub", "i64"});
  expect_error([&] { ops::scale(Tensor(), 2.0f); }, {"scale", "undefined"});

  const Tensor x = Tensor::zeros({2, 5, 8}, DType::BF16);
  const Tensor good = Tensor::zeros({2, 1, 8}, DType::F32);
  expect_error(
      [&] {
        ops::modulate(x, Tensor::zeros({2, 6, 8}, DType::F32), good);
      },
      {"modulate", "shift", "[2, 6, 8]", "[2, 5, 8]"});
  expect_error([&] { ops::modulate(x, good, Tensor::zeros({3, 8}, DType::F32)); }, {"modulate", "scale", "[3, 8]"});
  // Broadcasts with x, but to a larger shape than x's.
  expect_error(
      [&] {
        ops::modulate(x, Tensor::zeros({4, 1, 1, 8}, DType::F32), good);
      },
      {"modulate", "shift", "[4, 1, 1, 8]", "[2, 5, 8]"});
  expect_error([&] { ops::modulate(Tensor::zeros({1, 5, 8}, DType::F32), good, good); }, {"modulate", "[2, 1, 8]"});
  expect_error([&] { ops::modulate(x, Tensor::zeros({8}, DType::I32), good); }, {"modulate", "shift", "i32"});
  expect_error(
      [&] {
        ops::gated_residual(x, Tensor::zeros({2, 5, 7}, DType::BF16), good);
      },
      {"gated_residual", "y", "[2, 5, 7]", "[2, 5, 8]"});
  expect_error(
      [&] {
        ops::gated_residual(x, x, Tensor::zeros({2, 5, 1, 8}, DType::F32));
      },
      {"gated_residual", "gate", "[2, 5, 1, 8]"});
}

}  // namespace
}  // namespace xdit
