// RoPE angle tables and their application against float64 references written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/reference.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::matches_reference;
using testing::random_tensor;
using testing::values;

// Rotated pair k of a token, straight from the definition: axis a (in order) owns axes_dim[a]/2
// consecutive pairs, and pair i of it turns by pos[a] * theta^(-2i/axes_dim[a]).
struct AngleParts {
  double position;
  double frequency;
  double angle() const { return position * frequency; }
};

AngleParts angle_parts(const std::vector<double>& token_positions, const std::vector<int64_t>& axes_dim, double theta,
                       int64_t k) {
  for (size_t a = 0; a < axes_dim.size(); ++a) {
    const int64_t pairs = axes_dim[a] / 2;
    if (k < pairs) {
      return {token_positions[a],
              1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(axes_dim[a]))};
    }
    k -= pairs;
  }
  ADD_FAILURE() << "pair index beyond the axes";
  return {0, 0};
}

double reference_angle(const std::vector<double>& token_positions, const std::vector<int64_t>& axes_dim,
                       double theta, int64_t k) {
  return angle_parts(token_positions, axes_dim, theta, k).angle();
}

// Checks the table equals the f64 cos/sin rounded to f32, exactly, and returns the largest error
// an f32 evaluation of the same angles would have had.
double expect_table_is_f64_rounded(const ops::RopeTable& table, const std::vector<std::vector<double>>& positions,
                                   const std::vector<int64_t>& axes_dim, double theta) {
  int64_t half = 0;
  for (int64_t d : axes_dim) half += d / 2;
  const int64_t seq = static_cast<int64_t>(positions.size());
  EXPECT_EQ(table.cos.shape(), (Shape{seq, half}));
  EXPECT_EQ(table.sin.shape(), (Shape{seq, half}));
  EXPECT_EQ(table.cos.dtype(), DType::F32);
  const std::vector<float> cos = table.cos.to_floats(), sin = table.sin.to_floats();
  double f32_error = 0;
  int64_t mismatches = 0;
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t k = 0; k < half; ++k) {
      const AngleParts parts = angle_parts(positions[s], axes_dim, theta, k);
      const double angle = parts.angle();
      const size_t i = static_cast<size_t>(s * half + k);
      mismatches += cos[i] != static_cast<float>(std::cos(angle)) || sin[i] != static_cast<float>(std::sin(angle));
      const float angle_f32 = static_cast<float>(parts.position) * static_cast<float>(parts.frequency);
      f32_error = std::max(f32_error, std::fabs(static_cast<double>(std::cos(angle_f32)) - std::cos(angle)));
    }
  }
  EXPECT_EQ(mismatches, 0) << "entries that differ from the f64 result rounded to f32";
  return f32_error;
}

Tensor positions_tensor(const std::vector<std::vector<double>>& positions, DType dtype) {
  std::vector<double> flat;
  for (const auto& row : positions) flat.insert(flat.end(), row.begin(), row.end());
  const Shape shape{static_cast<int64_t>(positions.size()), static_cast<int64_t>(positions[0].size())};
  if (dtype == DType::F32) return Tensor::from_doubles(flat, shape, DType::F32);
  std::vector<int64_t> ints(flat.begin(), flat.end());
  return Tensor::from_ints(ints, shape, dtype);
}

// FLUX.2: axes (T, H, W, L) of width 32, theta 2000; image ids (0, h, w, 0), text ids (0, 0, 0, l),
// here on a grid that reaches position 4096.
TEST(RopeTable, Flux2FourAxesMatchF64Formula) {
  std::vector<std::vector<double>> ids;
  for (double h : {0.0, 1.0, 7.0, 63.0, 127.0, 2047.0, 4095.0, 4096.0}) {
    for (double w : {0.0, 3.0, 64.0, 1000.0, 4096.0}) ids.push_back({0, h, w, 0});
  }
  for (double l : {0.0, 1.0, 2.0, 511.0}) ids.push_back({0, 0, 0, l});
  ids.push_back({10, 5, 6, 0});  // a reference image at T = 10
  const std::vector<int64_t> axes{32, 32, 32, 32};
  for (DType dtype : {DType::I64, DType::I32, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ops::RopeTable table = ops::rope_table(positions_tensor(ids, dtype), axes, 2000.0);
    const double f32_error = expect_table_is_f64_rounded(table, ids, axes, 2000.0);
    // What the f64 angle buys: an f32 angle would already miss the project's f32 tolerance.
    EXPECT_GT(f32_error, 1e-5);
  }
}

// Z-Image: 3 axes [32, 48, 48], theta 256; caption token i at (1 + i, 0, 0), image at (Lc + 1, h, w).
TEST(RopeTable, ZImageThreeAxesMatchF64Formula) {
  std::vector<std::vector<double>> ids;
  for (int i = 0; i < 9; ++i) ids.push_back({1.0 + i, 0, 0});
  for (int h = 0; h < 5; ++h) {
    for (int w = 0; w < 6; ++w) ids.push_back({10, static_cast<double>(h * 17), static_cast<double>(w * 31)});
  }
  const std::vector<int64_t> axes{32, 48, 48};
  expect_table_is_f64_rounded(ops::rope_table(positions_tensor(ids, DType::I32), axes, 256.0), ids, axes, 256.0);
}

// RoundedToF32: the f64 angle rounded to f32, then cos/sin in f32, as diffusers' Z-Image and
// Qwen-Image build their tables (torch.polar on float32 angles).
TEST(RopeTable, RoundedToF32AnglesMatchTorchPolarOnF32) {
  std::vector<std::vector<double>> ids;
  for (int i = 0; i < 9; ++i) ids.push_back({1.0 + i, 0, 0});
  for (int h = 0; h < 5; ++h) {
    for (int w = 0; w < 6; ++w) ids.push_back({1500, static_cast<double>(h * 97), static_cast<double>(w * 83)});
  }
  const std::vector<int64_t> axes{32, 48, 48};
  const ops::RopeTable table =
      ops::rope_table(positions_tensor(ids, DType::I64), axes, 256.0, ops::RopeAngle::RoundedToF32);
  const std::vector<float> cos = table.cos.to_floats(), sin = table.sin.to_floats();
  const int64_t half = 64;
  int64_t mismatches = 0, differs_from_f64 = 0;
  for (size_t s = 0; s < ids.size(); ++s) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle = reference_angle(ids[s], axes, 256.0, k);
      const float rounded = static_cast<float>(angle);
      const size_t i = s * static_cast<size_t>(half) + static_cast<size_t>(k);
      mismatches += cos[i] != std::cos(rounded) || sin[i] != std::sin(rounded);
      differs_from_f64 += cos[i] != static_cast<float>(std::cos(angle));
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(differs_from_f64, 0) << "the two precisions must be distinguishable at these positions";
}

// Qwen-Image style centred (negative) positions as F32, axes (16, 56, 56), theta 1e4.
TEST(RopeTable, NegativeFloatPositions) {
  std::vector<std::vector<double>> ids;
  for (int h = -4; h < 4; ++h) {
    for (int w = -3; w < 3; ++w) ids.push_back({0, static_cast<double>(h), static_cast<double>(w)});
  }
  const std::vector<int64_t> axes{16, 56, 56};
  expect_table_is_f64_rounded(ops::rope_table(positions_tensor(ids, DType::F32), axes, 1e4), ids, axes, 1e4);
}

// The LLM text encoders: one axis over the full head dim, theta 1e6, long positions.
TEST(RopeTable, SingleAxisLongSequence) {
  std::vector<std::vector<double>> ids;
  for (int s = 0; s < 4100; s += 37) ids.push_back({static_cast<double>(s)});
  const std::vector<int64_t> axes{128};
  expect_table_is_f64_rounded(ops::rope_table(positions_tensor(ids, DType::I64), axes, 1e6), ids, axes, 1e6);
}

// ---- apply_rope

struct RopeCase {
  Shape shape;  // [B, S, H, D]
  DType dtype;
  RopeStyle style;
};

std::string rope_case_name(const ::testing::TestParamInfo<RopeCase>& info) {
  std::string name = std::string(info.param.style == RopeStyle::Interleaved ? "interleaved_" : "rotate_half_") +
                     std::string(dtype_name(info.param.dtype));
  for (int64_t s : info.param.shape) name += '_' + std::to_string(s);
  return name;
}

// Angles in [-pi, pi) with their exact-to-f32 cos and sin.
ops::RopeTable random_table(int64_t seq, int64_t half, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> angle(-M_PI, M_PI);
  std::vector<double> cos(static_cast<size_t>(seq * half)), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    const double a = angle(engine);
    cos[i] = std::cos(a);
    sin[i] = std::sin(a);
  }
  return {Tensor::from_doubles(cos, {seq, half}), Tensor::from_doubles(sin, {seq, half})};
}

std::vector<double> reference_rope(const std::vector<double>& x, const Shape& shape, const std::vector<double>& cos,
                                   const std::vector<double>& sin, RopeStyle style) {
  const int64_t batch = shape[0], seq = shape[1], heads = shape[2], dim = shape[3], half = dim / 2;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        const size_t row = static_cast<size_t>(((b * seq + s) * heads + h) * dim);
        for (int64_t k = 0; k < half; ++k) {
          const double c = cos[s * half + k], n = sin[s * half + k];
          // Rotated pair: (2k, 2k+1) interleaved, (k, k + D/2) for rotate-half.
          const size_t i = row + (style == RopeStyle::Interleaved ? 2 * k : k);
          const size_t j = row + (style == RopeStyle::Interleaved ? 2 * k + 1 : k + half);
          y[i] = x[i] * c - x[j] * n;
          y[j] = x[j] * c + x[i] * n;
        }
      }
    }
  }
  return y;
}

// x as the q third of a fused [B, S, 3, H, D] projection: unit stride in D, gaps elsewhere.
Tensor as_qkv_slice(const Tensor& x) {
  Shape fused = x.shape();
  fused.insert(fused.begin() + 2, 3);
  Tensor qkv = random_tensor(fused, x.dtype(), 99);
  Tensor q = qkv.select(2, 0);
  q.copy_from(x);
  return q;
}

class ApplyRopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(ApplyRopeTest, MatchesReferenceInEveryLayout) {
  const auto& [shape, dtype, style] = GetParam();
  const Tensor x = random_tensor(shape, dtype, 81, -2.0f, 2.0f);
  const ops::RopeTable table = random_table(shape[1], shape[3] / 2, 82);
  const std::vector<double> expected = reference_rope(values(x), shape, values(table.cos), values(table.sin), style);
  const std::vector<std::pair<std::string, Tensor>> layouts{{"dense", x},
                                                            {"qkv slice", as_qkv_slice(x)},
                                                            {"padded rows", testing::padded_rows(x)},
                                                            {"transposed storage", testing::transposed_storage(x)}};
  for (const auto& [name, input] : layouts) {
    SCOPED_TRACE(name);
    const Tensor y = ops::apply_rope(input, table, style);
    EXPECT_EQ(y.shape(), shape);
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_TRUE(matches_reference(y, expected));
  }
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> cases;
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::RotateHalf}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (const Shape& shape : {Shape{1, 1, 1, 2}, Shape{2, 5, 3, 6}, Shape{1, 7, 2, 34}, Shape{2, 17, 3, 64},
                                 Shape{1, 33, 4, 128}}) {
        cases.push_back({shape, dtype, style});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ApplyRopeTest, ::testing::ValuesIn(rope_cases()), rope_case_name);

// Table and rotation together: FLUX.2 ids on a 128-wide head, checked against angles computed here.
TEST(ApplyRope, FluxTableRotatesInterleavedPairsByAxisAngles) {
  std::vector<std::vector<double>> ids;
  for (int l = 0; l < 3; ++l) ids.push_back({0, 0, 0, static_cast<double>(l)});
  for (int h = 0; h < 3; ++h) {
    for (int w = 0; w < 4; ++w) ids.push_back({0, static_cast<double>(h), static_cast<double>(w), 0});
  }
  const std::vector<int64_t> axes{32, 32, 32, 32};
  const int64_t seq = static_cast<int64_t>(ids.size());
  const Shape shape{1, seq, 2, 128};
  const Tensor x = random_tensor(shape, DType::F32, 91);
  std::vector<double> cos, sin;
  for (int64_t s = 0; s < seq; ++s) {
    for (int64_t k = 0; k < 64; ++k) {
      const double angle = reference_angle(ids[s], axes, 2000.0, k);
      cos.push_back(std::cos(angle));
      sin.push_back(std::sin(angle));
    }
  }
  const ops::RopeTable table = ops::rope_table(positions_tensor(ids, DType::I64), axes, 2000.0);
  EXPECT_TRUE(matches_reference(ops::apply_rope(x, table, RopeStyle::Interleaved),
                                reference_rope(values(x), shape, cos, sin, RopeStyle::Interleaved)));
}

// ---- argument validation

TEST(RopeValidation, BadTablesThrowNamedErrors) {
  const Tensor ids = Tensor::from_ints(std::vector<int64_t>(12, 1), {4, 3});
  expect_error([&] { ops::rope_table(ids, {32, 48, 47}, 256.0); }, {"rope_table"});  // odd width
  expect_error([&] { ops::rope_table(ids, {32, 48, 0}, 256.0); }, {"rope_table"});
  expect_error([&] { ops::rope_table(ids, {32, 48}, 256.0); }, {"rope_table"});  // axes count
  expect_error([&] { ops::rope_table(ids, {32, 48, 48}, 0.0); }, {"rope_table"});
  expect_error([&] { ops::rope_table(ids, {32, 48, 48}, NAN); }, {"rope_table"});
  expect_error([&] { ops::rope_table(ids.reshape({12}), {32}, 256.0); }, {"rope_table"});
  expect_error([&] { ops::rope_table(Tensor::zeros({4, 3}, DType::BF16), {32, 48, 48}, 256.0); }, {"rope_table"});
}

TEST(RopeValidation, BadRotationsThrowNamedErrors) {
  const Tensor x = random_tensor({1, 4, 2, 128}, DType::F32, 92);
  const ops::RopeTable good = random_table(4, 64, 93);
  // axes summing to 120 instead of the head's 128
  const ops::RopeTable narrow = ops::rope_table(Tensor::from_ints(std::vector<int64_t>(12, 2), {4, 3}), {40, 40, 40},
                                                1e4);
  expect_error([&] { ops::apply_rope(x, narrow, RopeStyle::Interleaved); }, {"apply_rope"});
  expect_error([&] { ops::apply_rope(x, random_table(5, 64, 94), RopeStyle::Interleaved); }, {"apply_rope"});
  expect_error([&] { ops::apply_rope(x, {good.cos, random_table(4, 63, 95).sin}, RopeStyle::RotateHalf); },
               {"apply_rope"});
  expect_error([&] { ops::apply_rope(x, {good.cos.to(DType::BF16), good.sin}, RopeStyle::Interleaved); },
               {"apply_rope"});
  expect_error([&] { ops::apply_rope(x, {good.cos, Tensor{}}, RopeStyle::Interleaved); }, {"apply_rope"});
  expect_error([&] { ops::apply_rope(x.select(0, 0), good, RopeStyle::Interleaved); }, {"apply_rope"});  // 3-D
  expect_error([&] { ops::apply_rope(random_tensor({1, 4, 2, 127}, DType::F32, 96), good, RopeStyle::Interleaved); },
               {"apply_rope"});
  expect_error([&] { ops::apply_rope(Tensor::zeros({1, 4, 2, 128}, DType::I32), good, RopeStyle::Interleaved); },
               {"apply_rope"});
}

}  // namespace
}  // namespace xdit
