// conv2d and causal_conv3d against direct float64 references.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/reference.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::expect_error;
using testing::padded_rows;
using testing::random_tensor;
using testing::transposed_storage;

// Direct float64 2-D convolution, NCHW, zero padding, groups.
std::vector<double> reference_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const std::vector<double> xv = x.to_doubles(), wv = w.to_doubles();
  const std::vector<double> bv = bias.defined() ? bias.to_doubles() : std::vector<double>{};
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t og = o / p.groups;
  const int64_t ho = (h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1) / p.stride[0] + 1;
  const int64_t wo = (wd + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1) / p.stride[1] + 1;
  std::vector<double> out(static_cast<size_t>(n * o * ho * wo));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc) {
      const int64_t group = oc / og;
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double sum = bv.empty() ? 0.0 : bv[oc];
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t e = 0; e < kw; ++e) {
                const int64_t y = i * p.stride[0] - p.padding[0] + a * p.dilation[0];
                const int64_t z = j * p.stride[1] - p.padding[1] + e * p.dilation[1];
                if (y < 0 || y >= h || z < 0 || z >= wd) continue;
                const int64_t channel = group * cg + ic;
                sum += xv[((b * c + channel) * h + y) * wd + z] * wv[((oc * cg + ic) * kh + a) * kw + e];
              }
          out[((b * o + oc) * ho + i) * wo + j] = sum;
        }
    }
  return out;
}

// Wan's CausalConv3d, literally: prepend the cache (when the time padding is non-zero), pad time
// in front by 2*padding minus the cache length (cropping when that is negative), pad space on
// both sides, then a direct float64 3-D convolution.
std::vector<double> reference_causal_conv3d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& cache,
                                            const CausalConv3dParams& p) {
  const int64_t n = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), wd = x.size(4);
  const std::vector<double> xv = x.to_doubles(), wv = w.to_doubles();
  const std::vector<double> bv = bias.defined() ? bias.to_doubles() : std::vector<double>{};
  // Frames of the sequence the convolution sees, as (source, frame) with source -1 for zeros.
  std::vector<std::pair<int, int64_t>> frames;
  int64_t front = 2 * p.padding[0];
  std::vector<double> cv;
  if (cache.defined() && p.padding[0] > 0) {
    cv = cache.to_doubles();
    for (int64_t f = 0; f < cache.size(2); ++f) frames.push_back({1, f});
    front -= cache.size(2);
  }
  for (int64_t f = 0; f < t; ++f) frames.push_back({0, f});
  if (front >= 0) {
    frames.insert(frames.begin(), static_cast<size_t>(front), {-1, 0});
  } else {
    frames.erase(frames.begin(), frames.begin() + (-front));
  }
  const int64_t tc = cache.defined() ? cache.size(2) : 0;
  auto value = [&](int64_t b, int64_t ch, int64_t f, int64_t y, int64_t z) -> double {
    if (y < 0 || y >= h || z < 0 || z >= wd) return 0.0;
    const auto [source, frame] = frames[static_cast<size_t>(f)];
    if (source < 0) return 0.0;
    if (source == 1) return cv[(((b * c + ch) * tc + frame) * h + y) * wd + z];
    return xv[(((b * c + ch) * t + frame) * h + y) * wd + z];
  };
  const int64_t o = w.size(0), kt = w.size(2), kh = w.size(3), kw = w.size(4);
  const int64_t tp = static_cast<int64_t>(frames.size());
  const int64_t to = (tp - kt) / p.stride[0] + 1;
  const int64_t ho = (h + 2 * p.padding[1] - kh) / p.stride[1] + 1;
  const int64_t wo = (wd + 2 * p.padding[2] - kw) / p.stride[2] + 1;
  std::vector<double> out(static_cast<size_t>(n * o * to * ho * wo));
  size_t index = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < to; ++i)
        for (int64_t j = 0; j < ho; ++j)
          for (int64_t l = 0; l < wo; ++l) {
            double sum = bv.empty() ? 0.0 : bv[oc];
            for (int64_t ic = 0; ic < c; ++ic)
              for (int64_t a = 0; a < kt; ++a)
                for (int64_t e = 0; e < kh; ++e)
                  for (int64_t g = 0; g < kw; ++g) {
                    const double xin = value(b, ic, i * p.stride[0] + a, j * p.stride[1] - p.padding[1] + e,
                                             l * p.stride[2] - p.padding[2] + g);
                    sum += xin * wv[(((oc * c + ic) * kt + a) * kh + e) * kw + g];
                  }
            out[index++] = sum;
          }
  return out;
}

class Conv : public ::testing::TestWithParam<DType> {};

struct Conv2dCase {
  const char* name;
  Shape x, w;
  Conv2dParams params;
  bool bias;
};

TEST_P(Conv, Conv2dShapesAndParameters) {
  const DType dtype = GetParam();
  const std::vector<Conv2dCase> cases = {
      {"3x3 pad 1", {1, 5, 9, 11}, {7, 5, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"stride 2 odd size", {2, 4, 13, 10}, {6, 4, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}, true},
      {"dilation 2", {1, 3, 12, 12}, {4, 3, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}, false},
      {"groups 2", {1, 6, 8, 7}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 2}, true},
      {"depthwise", {1, 5, 7, 9}, {5, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 5}, true},
      {"1x1", {2, 9, 5, 3}, {11, 9, 1, 1}, {}, false},
      {"4x3 mixed", {1, 3, 10, 9}, {5, 3, 4, 3}, {{2, 1}, {1, 0}, {1, 2}, 1}, true},
      {"no padding", {1, 2, 6, 6}, {3, 2, 3, 3}, {}, true},
      {"blocked channels", {1, 32, 20, 17}, {48, 32, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
      {"3 channels in", {1, 3, 16, 16}, {32, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}, true},
  };
  uint64_t seed = 1;
  for (const Conv2dCase& c : cases) {
    const Tensor x = random_tensor(c.x, dtype, seed++);
    const Tensor w = random_tensor(c.w, dtype, seed++);
    const Tensor bias = c.bias ? random_tensor({c.w[0]}, dtype, seed++) : Tensor();
    const Tensor out = ops::conv2d(x, w, bias, c.params);
    const std::vector<double> expected = reference_conv2d(x, w, bias, c.params);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_EQ(out.numel(), static_cast<int64_t>(expected.size())) << c.name;
    EXPECT_MATCHES_REFERENCE(out, expected) << c.name;
  }
}

TEST_P(Conv, Conv2dStridedInputsAndF32Bias) {
  const DType dtype = GetParam();
  const Conv2dParams params{{1, 1}, {1, 1}, {1, 1}, 1};
  const Tensor x = random_tensor({2, 6, 9, 13}, dtype, 20);
  const Tensor w = random_tensor({8, 6, 3, 3}, dtype, 21);
  const Tensor bias = random_tensor({8}, DType::F32, 22);
  const std::vector<double> expected = reference_conv2d(x, w, bias, params);
  EXPECT_MATCHES_REFERENCE(ops::conv2d(padded_rows(x), w, bias, params), expected);
  EXPECT_MATCHES_REFERENCE(ops::conv2d(transposed_storage(x), w, bias, params), expected);
  EXPECT_MATCHES_REFERENCE(ops::conv2d(x, transposed_storage(w), bias, params), expected);
  // A channel slice of a wider tensor, and an NHWC tensor seen as NCHW.
  const Tensor wide = random_tensor({2, 10, 9, 13}, dtype, 23);
  const Tensor slice = wide.narrow(1, 3, 6);
  EXPECT_MATCHES_REFERENCE(ops::conv2d(slice, w, bias, params), reference_conv2d(slice, w, bias, params));
  const Tensor nhwc = random_tensor({2, 9, 13, 6}, dtype, 24).permute({0, 3, 1, 2});
  const Tensor nhwc_out = ops::conv2d(nhwc, w, bias, params);
  EXPECT_MATCHES_REFERENCE(nhwc_out, reference_conv2d(nhwc, w, bias, params));
  // A channels-last input gives a channels-last result (so a channels-last decoder never reorders).
  EXPECT_EQ(nhwc_out.shape(), (Shape{2, 8, 9, 13}));
  EXPECT_TRUE(nhwc_out.permute({0, 2, 3, 1}).is_contiguous());
  EXPECT_TRUE(ops::conv2d(x, w, bias, params).is_contiguous());
}

TEST_P(Conv, Conv2dRepeatedShapesStayCorrect) {
  const DType dtype = GetParam();
  const Conv2dParams params{{1, 1}, {1, 1}, {1, 1}, 1};
  for (uint64_t seed = 30; seed < 33; ++seed) {
    const Tensor x = random_tensor({1, 16, 12, 12}, dtype, seed);
    const Tensor w = random_tensor({16, 16, 3, 3}, dtype, seed + 10);
    const Tensor bias = random_tensor({16}, dtype, seed + 20);
    EXPECT_MATCHES_REFERENCE(ops::conv2d(x, w, bias, params), reference_conv2d(x, w, bias, params));
  }
}

struct Causal3dCase {
  const char* name;
  Shape x, w;
  CausalConv3dParams params;
  int64_t cache_frames;  // -1: no cache
  bool bias;
};

TEST_P(Conv, CausalConv3dWithAndWithoutCache) {
  const DType dtype = GetParam();
  const std::vector<Causal3dCase> cases = {
      {"kt3 pad1", {1, 4, 5, 6, 7}, {6, 4, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}}, -1, true},
      {"kt3 pad1 cache 2", {1, 4, 5, 6, 7}, {6, 4, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}}, 2, true},
      {"kt3 pad1 cache 1", {2, 3, 4, 5, 5}, {5, 3, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}}, 1, false},
      {"kt3 pad1 cache 3 (last 2 used)", {1, 3, 2, 5, 6}, {4, 3, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}}, 3, true},
      {"kt1 (1x1x1)", {1, 6, 3, 4, 5}, {7, 6, 1, 1, 1}, {}, -1, true},
      {"kt1 with cache (ignored)", {1, 6, 3, 4, 5}, {7, 6, 1, 1, 1}, {}, 2, true},
      {"time conv 3x1x1 stride 2", {1, 4, 7, 3, 4}, {8, 4, 3, 1, 1}, {{2, 1, 1}, {1, 0, 0}}, -1, true},
      {"time conv 3x1x1 stride 2 cache", {1, 4, 6, 3, 4}, {8, 4, 3, 1, 1}, {{2, 1, 1}, {1, 0, 0}}, 2, true},
      {"stride 2 in space", {1, 3, 3, 9, 8}, {5, 3, 3, 3, 3}, {{1, 2, 2}, {1, 1, 1}}, 2, false},
      {"stride 2 everywhere", {1, 3, 6, 9, 7}, {4, 3, 3, 3, 3}, {{2, 2, 2}, {1, 1, 1}}, 2, true},
      {"blocked channels", {1, 16, 3, 6, 6}, {32, 16, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}}, 2, true},
  };
  uint64_t seed = 40;
  for (const Causal3dCase& c : cases) {
    const Tensor x = random_tensor(c.x, dtype, seed++);
    const Tensor w = random_tensor(c.w, dtype, seed++);
    const Tensor bias = c.bias ? random_tensor({c.w[0]}, dtype, seed++) : Tensor();
    Tensor cache;
    if (c.cache_frames >= 0) {
      cache = random_tensor({c.x[0], c.x[1], c.cache_frames, c.x[3], c.x[4]}, dtype, seed++);
    }
    const Tensor out = ops::causal_conv3d(x, w, bias, cache, c.params);
    const std::vector<double> expected = reference_causal_conv3d(x, w, bias, cache, c.params);
    EXPECT_EQ(out.numel(), static_cast<int64_t>(expected.size())) << c.name;
    EXPECT_MATCHES_REFERENCE(out, expected) << c.name;
  }
}

TEST_P(Conv, CausalConv3dStridedInputs) {
  const DType dtype = GetParam();
  const CausalConv3dParams params{{1, 1, 1}, {1, 1, 1}};
  const Tensor x = random_tensor({1, 4, 3, 5, 6}, dtype, 60);
  const Tensor w = random_tensor({5, 4, 3, 3, 3}, dtype, 61);
  const Tensor bias = random_tensor({5}, DType::F32, 62);
  const Tensor cache = random_tensor({1, 4, 2, 5, 6}, dtype, 63);
  const std::vector<double> expected = reference_causal_conv3d(x, w, bias, cache, params);
  EXPECT_MATCHES_REFERENCE(ops::causal_conv3d(transposed_storage(x), w, bias, padded_rows(cache), params), expected);
  EXPECT_MATCHES_REFERENCE(ops::causal_conv3d(padded_rows(x), transposed_storage(w), bias, cache, params), expected);
  const std::vector<double> no_cache = reference_causal_conv3d(x, w, bias, Tensor(), params);
  EXPECT_MATCHES_REFERENCE(ops::causal_conv3d(transposed_storage(x), w, bias, Tensor(), params), no_cache);

  // Channels-last (NDHWC) input and cache: the result is channels-last too.
  const Tensor ndhwc = random_tensor({1, 3, 5, 6, 4}, dtype, 64).permute({0, 4, 1, 2, 3});
  const Tensor ndhwc_cache = random_tensor({1, 2, 5, 6, 4}, dtype, 65).permute({0, 4, 1, 2, 3});
  const Tensor out = ops::causal_conv3d(ndhwc, w, bias, ndhwc_cache, params);
  EXPECT_MATCHES_REFERENCE(out, reference_causal_conv3d(ndhwc, w, bias, ndhwc_cache, params));
  EXPECT_TRUE(out.permute({0, 2, 3, 4, 1}).is_contiguous());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Conv, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(ConvValidation, RejectsBadArguments) {
  const Tensor x = random_tensor({1, 4, 8, 8}, DType::F32, 1);
  const Tensor w = random_tensor({6, 4, 3, 3}, DType::F32, 2);
  expect_error([&] { ops::conv2d(x, random_tensor({6, 3, 3, 3}, DType::F32, 3)); }, {"conv2d", "4 channels"});
  expect_error([&] { ops::conv2d(x, w.to(DType::BF16)); }, {"conv2d", "weight is bf16"});
  expect_error([&] { ops::conv2d(random_tensor({4, 8, 8}, DType::F32, 4), w); }, {"conv2d", "[N, C, H, W]"});
  expect_error([&] { ops::conv2d(x, random_tensor({6, 4, 3}, DType::F32, 5)); }, {"conv2d", "weight must be"});
  expect_error([&] { ops::conv2d(x, random_tensor({5, 2, 3, 3}, DType::F32, 6), {}, {{1, 1}, {0, 0}, {1, 1}, 2}); },
               {"conv2d", "not divisible by 2 groups"});
  expect_error([&] { ops::conv2d(x, w, random_tensor({5}, DType::F32, 7)); }, {"conv2d", "bias [5]"});
  expect_error([&] { ops::conv2d(x, w, {}, {{0, 1}, {0, 0}, {1, 1}, 1}); }, {"conv2d", "stride 0"});
  expect_error([&] { ops::conv2d(x, random_tensor({6, 4, 9, 9}, DType::F32, 8)); }, {"conv2d", "does not fit"});
  expect_error([&] { ops::conv2d(x, w, {}, {{1, 1}, {-1, 0}, {1, 1}, 1}); }, {"conv2d", "negative padding"});
  expect_error([&] { ops::conv2d(x.to(DType::I32), w); }, {"conv2d", "i32"});

  const Tensor v = random_tensor({1, 4, 3, 6, 6}, DType::F32, 10);
  const Tensor k = random_tensor({5, 4, 3, 3, 3}, DType::F32, 11);
  const CausalConv3dParams params{{1, 1, 1}, {1, 1, 1}};
  expect_error([&] { ops::causal_conv3d(v, random_tensor({5, 3, 3, 3, 3}, DType::F32, 12), {}, {}, params); },
               {"causal_conv3d", "4 channels"});
  expect_error([&] { ops::causal_conv3d(v, k, {}, random_tensor({1, 4, 2, 5, 6}, DType::F32, 13), params); },
               {"causal_conv3d", "cache [1, 4, 2, 5, 6]"});
  expect_error([&] { ops::causal_conv3d(v, k, {}, random_tensor({1, 4, 2, 6, 6}, DType::BF16, 14), params); },
               {"causal_conv3d", "cache is bf16"});
  expect_error([&] { ops::causal_conv3d(v, k, random_tensor({4}, DType::F32, 15), {}, params); },
               {"causal_conv3d", "bias [4]"});
  expect_error([&] { ops::causal_conv3d(v, k, {}, {}, {{1, 1, 1}, {-1, 1, 1}}); },
               {"causal_conv3d", "negative padding"});
  expect_error([&] { ops::causal_conv3d(random_tensor({1, 4, 6, 6}, DType::F32, 16), k, {}, {}, params); },
               {"causal_conv3d", "[N, C, T, H, W]"});
}

}  // namespace
}  // namespace xdit
