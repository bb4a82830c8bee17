#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "support/reference.h"
#include "xdit/backend/cpu/cpu_backend.h"
#include "xdit/core/tensor.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::in_layout;
using testing::Layout;
using testing::random_tensor;
using testing::values;

// Data movement is exact: results are compared value for value.

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

// Distinct values 0, 1, 2, ... (exact in bf16 up to 256, in f32 far beyond), in any dtype.
Tensor iota(const Shape& shape, DType dtype) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_floats(v, shape, dtype);
}

const std::vector<Layout> kLayouts = {Layout::Contiguous, Layout::PaddedRows, Layout::Transposed};

// ---- copy

TEST(Copy, BetweenStridedLayoutsConvertingDtypes) {
  for (const Shape& shape : std::vector<Shape>{{17}, {3, 33}, {2, 5, 7}, {2, 3, 4, 17}, {37, 65}}) {
    for (DType from : {DType::F32, DType::BF16}) {
      for (DType to : {DType::F32, DType::BF16}) {
        const Tensor src_dense = random_tensor(shape, from, 3, -100.0f, 100.0f);
        // The expected values: the source values rounded to the destination dtype.
        const std::vector<double> expected = values(src_dense.to(to));
        for (Layout src_layout : kLayouts) {
          for (Layout dst_layout : kLayouts) {
            const Tensor src = in_layout(src_dense, src_layout);
            const Tensor dst = in_layout(Tensor::zeros(shape, to), dst_layout);
            cpu_backend().copy(src, dst);
            EXPECT_EQ(values(dst), expected)
                << shape_str(shape) << " " << dtype_name(from) << " -> " << dtype_name(to) << " layouts "
                << static_cast<int>(src_layout) << " -> " << static_cast<int>(dst_layout);
          }
        }
      }
    }
  }
}

TEST(Copy, IntegerAndFp8ElementsThroughTheTransposingPath) {
  for (DType dtype : {DType::I64, DType::I32, DType::F8E4M3}) {
    const Tensor dense = random_tensor({3, 40, 35}, dtype, 4, -400.0f, 400.0f);
    const Tensor dst = Tensor::zeros({3, 40, 35}, dtype);
    cpu_backend().copy(testing::transposed_storage(dense), dst);
    EXPECT_EQ(values(dst), values(dense)) << dtype_name(dtype);
  }
}

// ---- permute_copy

TEST(PermuteCopy, MatchesIndexMapping) {
  struct Case {
    Shape shape;
    std::vector<int64_t> order;
  };
  const std::vector<Case> cases = {
      {{2, 17, 3, 33}, {0, 2, 1, 3}},  // [B, S, H, D] -> [B, H, S, D]
      {{2, 3, 17, 33}, {0, 2, 1, 3}},  // and back
      {{37, 65}, {1, 0}},              // a plain transposition, partial tiles
      {{3, 5, 7, 9}, {3, 2, 1, 0}},
      {{4, 1, 6}, {2, 0, 1}},
      {{5, 70, 3}, {0, 2, 1}},
      {{6}, {0}},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16, DType::I64}) {
      const Tensor dense = random_tensor(c.shape, DType::F32, 9, -50.0f, 50.0f).to(dtype);
      const std::vector<double> source = values(dense);
      for (Layout layout : kLayouts) {
        const Tensor y = ops::permute_copy(in_layout(dense, layout), c.order);
        ASSERT_TRUE(y.is_contiguous());
        ASSERT_EQ(y.dtype(), dtype);
        const std::vector<double> got = values(y);
        for (int64_t flat = 0; flat < y.numel(); ++flat) {
          const std::vector<int64_t> out_index = unravel(flat, y.shape());
          std::vector<int64_t> in_index(c.shape.size());
          for (size_t d = 0; d < c.order.size(); ++d) in_index[c.order[d]] = out_index[d];
          ASSERT_EQ(got[flat], source[ravel(in_index, c.shape)])
              << shape_str(c.shape) << " order " << shape_str(c.order) << " " << dtype_name(dtype);
        }
      }
    }
  }
}

TEST(PermuteCopy, ValidationErrors) {
  const Tensor x = Tensor::zeros({2, 3, 4}, DType::F32);
  expect_error([&] { ops::permute_copy(x, {0, 0, 1}); }, {"permute_copy", "[0, 0, 1]", "[2, 3, 4]"});
  expect_error([&] { ops::permute_copy(x, {1, 0}); }, {"permute_copy", "[1, 0]"});
  expect_error([&] { ops::permute_copy(x, {0, 1, 3}); }, {"permute_copy", "[0, 1, 3]"});
}

// ---- concat and split

TEST(Concat, AlongFirstMiddleAndLastDimWithViews) {
  const std::vector<int64_t> sizes = {1, 3, 17};
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    for (DType dtype : {DType::F32, DType::BF16}) {
      std::vector<Tensor> parts;
      std::vector<std::vector<double>> part_values;
      for (size_t i = 0; i < sizes.size(); ++i) {
        Shape shape = {4, 5, 6};
        shape[d] = sizes[i];
        const Tensor dense = random_tensor(shape, dtype, 20 + i);
        parts.push_back(in_layout(dense, kLayouts[i % kLayouts.size()]));
        part_values.push_back(values(dense));
      }
      // A narrowed view of a larger tensor as a fourth part.
      Shape big = {4, 5, 6};
      big[d] = 9;
      const Tensor narrowed = random_tensor(big, dtype, 30).narrow(d, 2, 5);
      parts.push_back(narrowed);
      part_values.push_back(values(narrowed));

      const Tensor y = ops::concat(parts, dim);
      Shape expected_shape = {4, 5, 6};
      expected_shape[d] = 1 + 3 + 17 + 5;
      ASSERT_EQ(y.shape(), expected_shape);
      const std::vector<double> got = values(y);
      for (int64_t flat = 0; flat < y.numel(); ++flat) {
        std::vector<int64_t> index = unravel(flat, expected_shape);
        size_t part = 0;
        while (index[d] >= parts[part].size(d)) index[d] -= parts[part++].size(d);
        ASSERT_EQ(got[flat], part_values[part][ravel(index, parts[part].shape())])
            << "dim " << dim << " " << dtype_name(dtype) << " at " << flat;
      }
    }
  }
}

TEST(Concat, ConvertsToTheFirstPartsDtypeAndSkipsEmptyParts) {
  const Tensor first = random_tensor({2, 3}, DType::BF16, 40);
  const Tensor empty = Tensor::zeros({2, 0}, DType::F32);
  const Tensor second = random_tensor({2, 4}, DType::F32, 41);
  const Tensor y = ops::concat({first, empty, second}, 1);
  ASSERT_EQ(y.dtype(), DType::BF16);
  ASSERT_EQ(y.shape(), (Shape{2, 7}));
  const std::vector<double> got = values(y), a = values(first), b = values(second.to(DType::BF16));
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 7; ++c) {
      EXPECT_EQ(got[r * 7 + c], c < 3 ? a[r * 3 + c] : b[r * 4 + c - 3]);
    }
  }
}

TEST(Concat, ValidationErrorsNameThePart) {
  const Tensor a = Tensor::zeros({2, 3, 4}, DType::F32);
  expect_error(
      [&] {
        ops::concat({a, a, Tensor::zeros({2, 5, 5}, DType::F32)}, 1);
      },
      {"concat", "part 2", "[2, 5, 5]", "[2, 3, 4]"});
  expect_error([&] { ops::concat({a, Tensor::zeros({2, 3}, DType::F32)}, 0); }, {"concat", "part 1", "[2, 3]"});
  expect_error([&] { ops::concat({a, Tensor()}, 0); }, {"concat", "part 1", "undefined"});
  expect_error([&] { ops::concat({a, a}, 3); }, {"concat", "dim 3", "[2, 3, 4]"});
  expect_error([&] { ops::concat({a, a}, -4); }, {"concat", "dim -4"});
  expect_error([&] { ops::concat({}, 0); }, {"concat", "no parts"});
}

TEST(Split, ReturnsViewsAndValidates) {
  const Tensor x = iota({3, 10}, DType::F32);
  const std::vector<Tensor> parts = ops::split(x, {2, 0, 8}, -1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(parts[1].shape(), (Shape{3, 0}));
  EXPECT_EQ(parts[2].shape(), (Shape{3, 8}));
  EXPECT_TRUE(parts[2].shares_storage_with(x));
  EXPECT_EQ(values(parts[2])[0], 2.0);
  EXPECT_EQ(values(parts[2])[8], 12.0);
  expect_error([&] { ops::split(x, {2, 7}, 1); }, {"split", "[2, 7]", "9", "[3, 10]"});
  expect_error([&] { ops::split(x, {4, -1}, 0); }, {"split", "negative"});
  expect_error([&] { ops::split(x, {3}, 2); }, {"split", "dim 2"});
}

// ---- pad

// torch.nn.functional.pad, constant mode: output index i of a padded dim reads input i - left.
std::vector<double> pad_ref(const Tensor& x, const std::vector<int64_t>& pads, double value, Shape& out_shape) {
  const Shape& shape = x.shape();
  std::vector<int64_t> left(shape.size(), 0);
  out_shape = shape;
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const size_t d = shape.size() - 1 - i;
    left[d] = pads[2 * i];
    out_shape[d] += pads[2 * i] + pads[2 * i + 1];
  }
  const std::vector<double> in = values(x);
  std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)));
  for (size_t flat = 0; flat < out.size(); ++flat) {
    std::vector<int64_t> index = unravel(static_cast<int64_t>(flat), out_shape);
    bool inside = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      index[d] -= left[d];
      inside = inside && index[d] >= 0 && index[d] < shape[d];
    }
    out[flat] = inside ? in[ravel(index, shape)] : value;
  }
  return out;
}

TEST(Pad, PositiveZeroAndNegativePadsOnOneToFourDims) {
  struct Case {
    Shape shape;
    std::vector<int64_t> pads;
  };
  const std::vector<Case> cases = {
      {{7}, {2, 3}},
      {{7}, {0, 0}},
      {{7}, {-2, 1}},
      {{7}, {-3, -4}},  // crops to nothing
      {{5, 6}, {1, 0, 0, 2}},
      {{5, 6}, {-1, 2, 3, -2}},
      {{3, 4, 5}, {0, 0, 1, 1, 2, 2}},
      {{3, 4, 5}, {2, 2}},  // only the last dim
      {{2, 3, 4, 5}, {1, 1, 1, 1, 1, 1, 1, 1}},
      {{2, 3, 4, 5}, {-1, -1, 0, 3, -1, 2, 1, 0}},
      {{2, 3, 4, 33}, {17, 0}},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (float value : {0.0f, -1.5f}) {
        const Tensor dense = random_tensor(c.shape, dtype, 50, 1.0f, 2.0f);
        Shape expected_shape;
        const std::vector<double> expected = pad_ref(dense, c.pads, value, expected_shape);
        for (Layout layout : kLayouts) {
          const Tensor y = ops::pad(in_layout(dense, layout), c.pads, value);
          ASSERT_EQ(y.shape(), expected_shape) << shape_str(c.shape) << " pads " << shape_str(c.pads);
          EXPECT_EQ(values(y), expected) << shape_str(c.shape) << " pads " << shape_str(c.pads) << " "
                                         << dtype_name(dtype) << " value " << value;
        }
      }
    }
  }
}

TEST(Pad, IntegerTensorsAndLargeInputs) {
  const Tensor ids = iota({3, 5}, DType::I64);
  Shape shape;
  EXPECT_EQ(values(ops::pad(ids, {0, 2}, 7.0f)), pad_ref(ids, {0, 2}, 7.0, shape));
  // Enough rows to be split among threads.
  const Tensor big = random_tensor({2, 300, 301}, DType::BF16, 51);
  EXPECT_EQ(values(ops::pad(big, {1, 1, 2, 0})), pad_ref(big, {1, 1, 2, 0}, 0.0, shape));
}

TEST(Pad, EmptyInputsGiveAllFill) {
  for (const auto& [shape, pads] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
           {{0}, {2, 3}}, {{2, 0}, {1, 1, 0, 0}}, {{0, 3}, {0, 0, 1, 1}}}) {
    const Tensor x = Tensor::empty(shape, DType::BF16);
    Shape expected_shape;
    const std::vector<double> expected = pad_ref(x, pads, 2.5, expected_shape);
    const Tensor y = ops::pad(x, pads, 2.5f);
    EXPECT_EQ(y.shape(), expected_shape);
    EXPECT_EQ(values(y), expected) << shape_str(shape) << " pads " << shape_str(pads);
  }
}

TEST(Pad, ValidationErrors) {
  const Tensor x = Tensor::zeros({2, 3, 4}, DType::F32);
  expect_error([&] { ops::pad(x, {1, 2, 3}); }, {"pad", "[1, 2, 3]", "even"});
  expect_error([&] { ops::pad(x, {1, 1, 1, 1, 1, 1, 1, 1}); }, {"pad", "4 dims", "[2, 3, 4]"});
  expect_error([&] { ops::pad(x, {0, 0, -2, -2}); }, {"pad", "(-2, -2)", "dim 1", "3"});
  expect_error([&] { ops::pad(Tensor(), {1, 1}); }, {"pad", "undefined"});
}

// ---- upsample_nearest

std::vector<double> upsample_ref(const Tensor& x, const std::vector<int64_t>& factors, Shape& out_shape) {
  const Shape& shape = x.shape();
  out_shape = shape;
  std::vector<int64_t> factor(shape.size(), 1);
  for (size_t i = 0; i < factors.size(); ++i) {
    factor[shape.size() - factors.size() + i] = factors[i];
    out_shape[shape.size() - factors.size() + i] *= factors[i];
  }
  const std::vector<double> in = values(x);
  std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)));
  for (size_t flat = 0; flat < out.size(); ++flat) {
    std::vector<int64_t> index = unravel(static_cast<int64_t>(flat), out_shape);
    for (size_t d = 0; d < shape.size(); ++d) index[d] /= factor[d];
    out[flat] = in[ravel(index, shape)];
  }
  return out;
}

TEST(UpsampleNearest, TwoAndThreeDimensional) {
  struct Case {
    Shape shape;
    std::vector<int64_t> factors;
  };
  const std::vector<Case> cases = {
      {{2, 3, 5, 7}, {2, 2}},        // image [N, C, H, W]
      {{1, 2, 3, 4, 5}, {1, 2, 2}},  // video [N, C, T, H, W]
      {{1, 2, 3, 4, 5}, {2, 1, 3}}, {{1, 1, 4, 4}, {3, 1}}, {{4, 5}, {3}}, {{3, 17}, {1}}, {{2, 3, 33, 17}, {2, 2}},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Tensor dense = random_tensor(c.shape, dtype, 60);
      Shape expected_shape;
      const std::vector<double> expected = upsample_ref(dense, c.factors, expected_shape);
      for (Layout layout : kLayouts) {
        const Tensor y = ops::upsample_nearest(in_layout(dense, layout), c.factors);
        ASSERT_EQ(y.shape(), expected_shape);
        EXPECT_TRUE(y.is_contiguous());
        EXPECT_EQ(values(y), expected) << shape_str(c.shape) << " factors " << shape_str(c.factors) << " "
                                       << dtype_name(dtype) << " layout " << static_cast<int>(layout);
      }
    }
  }
}

TEST(UpsampleNearest, LargeInputSplitAmongThreads) {
  const Tensor x = random_tensor({1, 8, 64, 65}, DType::BF16, 61);
  Shape shape;
  EXPECT_EQ(values(ops::upsample_nearest(x, {2, 2})), upsample_ref(x, {2, 2}, shape));
}

TEST(UpsampleNearest, ValidationErrors) {
  const Tensor x = Tensor::zeros({2, 3, 4}, DType::F32);
  expect_error([&] { ops::upsample_nearest(x, {2, 0}); }, {"upsample_nearest", "[2, 0]", ">= 1"});
  expect_error([&] { ops::upsample_nearest(x, {2, 2, 2, 2}); }, {"upsample_nearest", "4 factors", "[2, 3, 4]"});
  expect_error([&] { ops::upsample_nearest(x, {}); }, {"upsample_nearest", "0 factors"});
}

}  // namespace
}  // namespace xdit
