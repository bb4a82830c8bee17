// ops::attention against a float64 softmax(Q K^T · scale) V written here, over odd shapes,
// grouped-query heads, causal and padding masks, strided views, F32 and BF16, and the LSE that
// Ring attention merges partial results with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "support/reference.h"
#include "xdit/backend/cpu/attention_simd.h"
#include "xdit/core/threading.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::matches_reference;
using testing::random_tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Expected {
  std::vector<double> out;  // [B, Sq, H, D]
  std::vector<double> lse;  // [B, H, Sq]
};

// Plain softmax attention in float64 over the logical values of the (possibly strided) inputs.
Expected reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params) {
  const int64_t batch = q.size(0), q_len = q.size(1), heads = q.size(2), dim = q.size(3);
  const int64_t kv_len = k.size(1), kv_heads = k.size(2);
  const std::vector<double> qd = q.to_doubles(), kd = k.to_doubles(), vd = v.to_doubles();
  const std::vector<double> mask =
      params.key_padding_mask.defined() ? params.key_padding_mask.to_doubles() : std::vector<double>{};
  const double scale = params.scale != 0.0f ? static_cast<double>(params.scale) : 1.0 / std::sqrt(double(dim));
  Expected e{std::vector<double>(static_cast<size_t>(batch * q_len * heads * dim), 0.0),
             std::vector<double>(static_cast<size_t>(batch * heads * q_len), -kInf)};
  std::vector<double> scores(static_cast<size_t>(kv_len));
  std::vector<char> visible(static_cast<size_t>(kv_len));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t hk = h / (heads / kv_heads);
      for (int64_t i = 0; i < q_len; ++i) {
        const double* qi = &qd[((b * q_len + i) * heads + h) * dim];
        double max_score = -kInf;
        for (int64_t j = 0; j < kv_len; ++j) {
          const bool causal_ok = !params.causal || j <= i + (kv_len - q_len);
          const bool mask_ok = mask.empty() || mask[b * kv_len + j] != 0.0;
          visible[j] = causal_ok && mask_ok;
          if (!visible[j]) continue;
          const double* kj = &kd[((b * kv_len + j) * kv_heads + hk) * dim];
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += qi[d] * kj[d];
          scores[j] = scale * dot;
          max_score = std::max(max_score, scores[j]);
        }
        if (max_score == -kInf) continue;  // sees no key: output 0, lse -inf
        double sum = 0;
        double* oi = &e.out[((b * q_len + i) * heads + h) * dim];
        for (int64_t j = 0; j < kv_len; ++j) {
          if (!visible[j]) continue;
          const double p = std::exp(scores[j] - max_score);
          sum += p;
          const double* vj = &vd[((b * kv_len + j) * kv_heads + hk) * dim];
          for (int64_t d = 0; d < dim; ++d) oi[d] += p * vj[d];
        }
        for (int64_t d = 0; d < dim; ++d) oi[d] /= sum;
        e.lse[(b * heads + h) * q_len + i] = max_score + std::log(sum);
      }
    }
  }
  return e;
}

enum class Layout {
  Contiguous,
  FusedQkv,           // q, k, v are slices of one [B, S, 3, H, D] projection output
  PaddedRows,         // unit stride in D, rows not adjacent
  HeadMajor,          // [B, H, S, D] storage viewed as [B, S, H, D]
  TransposedStorage,  // D not unit-stride: the ops layer copies
};
enum class MaskKind { None, Random, EmptyBatchRow };

struct Case {
  std::string name;
  int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
  bool causal = false;
  MaskKind mask = MaskKind::None;
  float scale = 0.0f;
  Layout layout = Layout::Contiguous;
  bool lse = true;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Inputs {
  Tensor q, k, v;  // the views handed to the op
  Tensor mask;
};

Tensor mask_for(const Case& c, uint64_t seed) {
  if (c.mask == MaskKind::None) return Tensor();
  std::vector<int64_t> bits(static_cast<size_t>(c.batch * c.kv_len));
  uint64_t state = seed;
  for (int64_t& bit : bits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    bit = (state >> 33) % 10 < 7 ? 1 : 0;  // about 30% padding
  }
  if (c.mask == MaskKind::EmptyBatchRow) {
    for (int64_t j = 0; j < c.kv_len; ++j) bits[static_cast<size_t>(c.kv_len + j)] = 0;  // batch 1 sees nothing
  }
  return Tensor::from_ints(bits, {c.batch, c.kv_len}, DType::I32);
}

Tensor with_layout(const Tensor& dense, Layout layout) {
  switch (layout) {
    case Layout::PaddedRows:
      return testing::padded_rows(dense);
    case Layout::HeadMajor:
      return dense.permute({0, 2, 1, 3}).clone().permute({0, 2, 1, 3});
    case Layout::TransposedStorage:
      return testing::transposed_storage(dense);
    default:
      return dense;
  }
}

Inputs make_inputs(const Case& c, DType dtype, uint64_t seed) {
  // q spans a wider range than k so the softmax is far from uniform.
  Tensor q = random_tensor({c.batch, c.q_len, c.heads, c.head_dim}, dtype, seed, -4.0f, 4.0f);
  Tensor k = random_tensor({c.batch, c.kv_len, c.kv_heads, c.head_dim}, dtype, seed + 1, -2.0f, 2.0f);
  Tensor v = random_tensor({c.batch, c.kv_len, c.kv_heads, c.head_dim}, dtype, seed + 2);
  if (c.layout == Layout::FusedQkv) {
    Tensor fused = Tensor::zeros({c.batch, c.q_len, 3, c.heads, c.head_dim}, dtype);
    fused.select(2, 0).copy_from(q);
    fused.select(2, 1).copy_from(k);
    fused.select(2, 2).copy_from(v);
    return {fused.select(2, 0), fused.select(2, 1), fused.select(2, 2), mask_for(c, seed)};
  }
  return {with_layout(q, c.layout), with_layout(k, c.layout), with_layout(v, c.layout), mask_for(c, seed)};
}

class AttentionCases : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(AttentionCases, MatchesFloat64Reference) {
  const auto& [c, dtype] = GetParam();
  const Inputs in = make_inputs(c, dtype, 1234);
  AttentionParams params;
  params.scale = c.scale;
  params.causal = c.causal;
  params.key_padding_mask = in.mask;
  params.return_lse = c.lse;
  const AttentionResult result = ops::attention(in.q, in.k, in.v, params);
  const Expected expected = reference_attention(in.q, in.k, in.v, params);

  EXPECT_EQ(result.out.shape(), (Shape{c.batch, c.q_len, c.heads, c.head_dim}));
  EXPECT_EQ(result.out.dtype(), dtype);
  EXPECT_TRUE(result.out.is_contiguous());
  EXPECT_MATCHES_REFERENCE(result.out, expected.out);
  if (!c.lse) {
    EXPECT_FALSE(result.lse.defined());
    return;
  }
  ASSERT_TRUE(result.lse.defined());
  EXPECT_EQ(result.lse.shape(), (Shape{c.batch, c.heads, c.q_len}));
  EXPECT_EQ(result.lse.dtype(), DType::F32);
  // The LSE is f32 even for bf16 inputs (f32 accumulation), so it meets the f32 tolerance.
  EXPECT_MATCHES_REFERENCE(result.lse, expected.lse);
  // Rows that see no key give exactly 0 and -inf.
  const std::vector<double> out = result.out.to_doubles(), lse = result.lse.to_doubles();
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t i = 0; i < c.q_len; ++i) {
        if (expected.lse[(b * c.heads + h) * c.q_len + i] != -kInf) continue;
        EXPECT_EQ(lse[(b * c.heads + h) * c.q_len + i], -kInf);
        for (int64_t d = 0; d < c.head_dim; ++d)
          EXPECT_EQ(out[((b * c.q_len + i) * c.heads + h) * c.head_dim + d], 0.0);
      }
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> all = {
      {"OneQueryOneKey", 1, 1, 1, 1, 1, 64},
      {"OddLengths", 2, 3, 17, 4, 4, 64},
      {"MoreQueriesThanKeys", 1, 17, 3, 2, 1, 128},
      {"GroupedQuery", 2, 65, 130, 8, 2, 64},
      {"HeadDim40", 1, 130, 65, 3, 3, 40},
      {"HeadDim72", 1, 33, 33, 2, 2, 72},
      {"HeadDim8", 1, 17, 65, 2, 1, 8},
      {"HeadDim256", 1, 33, 70, 2, 2, 256},
      {"HeadDim512", 1, 13, 40, 1, 1, 512},
      {"HeadDim3", 1, 5, 9, 1, 1, 3},
      {"SeveralKeyBlocks", 1, 100, 600, 2, 1, 64},
  };
  all.push_back({"CausalSquare", 2, 65, 65, 4, 2, 64, true});
  all.push_back({"CausalFewerQueries", 1, 17, 130, 2, 2, 128, true});
  all.push_back({"CausalMoreQueries", 1, 130, 65, 2, 1, 64, true});  // early rows see no key
  all.push_back({"CausalLong", 1, 300, 300, 1, 1, 64, true});
  all.push_back({"PaddingMask", 2, 33, 130, 4, 2, 64, false, MaskKind::Random});
  all.push_back({"MaskedBatchRowSeesNothing", 2, 17, 65, 2, 2, 64, false, MaskKind::EmptyBatchRow});
  all.push_back({"CausalAndMask", 2, 65, 65, 2, 1, 72, true, MaskKind::EmptyBatchRow});
  all.push_back({"CustomScale", 1, 17, 33, 2, 2, 64, false, MaskKind::None, 0.3f});
  all.push_back({"NegativeScale", 1, 17, 33, 2, 2, 64, false, MaskKind::None, -0.2f});
  all.push_back({"FusedQkvSlices", 2, 65, 65, 4, 4, 64, false, MaskKind::None, 0.0f, Layout::FusedQkv});
  all.push_back({"FusedQkvCausal", 1, 130, 130, 2, 2, 128, true, MaskKind::None, 0.0f, Layout::FusedQkv});
  all.push_back({"PaddedRows", 1, 17, 130, 4, 2, 40, false, MaskKind::Random, 0.0f, Layout::PaddedRows});
  all.push_back({"HeadMajor", 2, 33, 65, 4, 1, 64, true, MaskKind::None, 0.0f, Layout::HeadMajor});
  all.push_back({"TransposedStorage", 1, 17, 33, 2, 2, 64, false, MaskKind::None, 0.0f, Layout::TransposedStorage});
  all.push_back({"NoLse", 1, 65, 130, 2, 2, 64, false, MaskKind::Random, 0.0f, Layout::Contiguous, false});
  all.push_back({"NoLseCausal", 1, 130, 130, 2, 2, 128, true, MaskKind::None, 0.0f, Layout::Contiguous, false});
  all.push_back({"NoKeys", 2, 5, 0, 2, 1, 64});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCases,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::string(dtype_name(std::get<1>(info.param)));
                         });

// The length: S = 4096 runs many query and key blocks through the blocked path.
TEST(AttentionLong, Sequence4096F32MatchesReference) {
  const Case c{"", 1, 4096, 4096, 2, 1, 64};
  const Inputs in = make_inputs(c, DType::F32, 77);
  AttentionParams params;
  params.return_lse = true;
  const AttentionResult result = ops::attention(in.q, in.k, in.v, params);
  const Expected expected = reference_attention(in.q, in.k, in.v, params);
  EXPECT_MATCHES_REFERENCE(result.out, expected.out);
  EXPECT_MATCHES_REFERENCE(result.lse, expected.lse);
}

TEST(AttentionLong, Sequence4096Bf16CausalMaskedMatchesReference) {
  const Case c{"", 1, 4096, 4096, 2, 2, 64, true, MaskKind::Random};
  const Inputs in = make_inputs(c, DType::BF16, 78);
  AttentionParams params;
  params.causal = true;
  params.key_padding_mask = in.mask;
  params.return_lse = true;
  const AttentionResult result = ops::attention(in.q, in.k, in.v, params);
  const Expected expected = reference_attention(in.q, in.k, in.v, params);
  EXPECT_MATCHES_REFERENCE(result.out, expected.out);
  EXPECT_MATCHES_REFERENCE(result.lse, expected.lse);
}

// K and V long and wide enough that their packed copies are made a few (batch, kv head) groups
// at a time rather than all at once.
TEST(AttentionLong, PackedInSeveralChunksMatchesReference) {
  const Case c{"", 2, 5, 8200, 6, 3, 512, false, MaskKind::Random};
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Inputs in = make_inputs(c, dtype, 80);
    AttentionParams params;
    params.key_padding_mask = in.mask;
    params.return_lse = true;
    const AttentionResult result = ops::attention(in.q, in.k, in.v, params);
    const Expected expected = reference_attention(in.q, in.k, in.v, params);
    EXPECT_MATCHES_REFERENCE(result.out, expected.out);
    EXPECT_MATCHES_REFERENCE(result.lse, expected.lse);
  }
}

// Each task owns whole query rows and walks the keys in a fixed order, so the result does not
// depend on the number of threads: bit-identical runs, as the design requires.
TEST(AttentionDeterminism, SameBitsForOneAndSeveralThreads) {
  const Case c{"", 2, 200, 300, 4, 2, 64, true, MaskKind::Random};
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Inputs in = make_inputs(c, dtype, 99);
    AttentionParams params;
    params.causal = true;
    params.key_padding_mask = in.mask;
    params.return_lse = true;
    const int threads = num_threads();
    set_num_threads(1);
    const AttentionResult serial = ops::attention(in.q, in.k, in.v, params);
    set_num_threads(std::max(threads, 3));
    const AttentionResult parallel = ops::attention(in.q, in.k, in.v, params);
    set_num_threads(threads);
    EXPECT_EQ(std::memcmp(serial.out.raw_data(), parallel.out.raw_data(), serial.out.nbytes()), 0);
    EXPECT_EQ(std::memcmp(serial.lse.raw_data(), parallel.lse.raw_data(), serial.lse.nbytes()), 0);
  }
}

// Ring attention: attention over two halves of K/V, merged with their LSEs, equals attention over
// all of K/V. The mask leaves the second half of batch 1 empty, so one part has lse = -inf there.
void expect_merge_equals_full(DType dtype) {
  const int64_t batch = 2, q_len = 70, kv_len = 150, heads = 4, kv_heads = 2, dim = 64, half = 64;
  Tensor q = random_tensor({batch, q_len, heads, dim}, dtype, 5, -4.0f, 4.0f);
  Tensor k = random_tensor({batch, kv_len, kv_heads, dim}, dtype, 6, -2.0f, 2.0f);
  Tensor v = random_tensor({batch, kv_len, kv_heads, dim}, dtype, 7);
  std::vector<int64_t> bits(static_cast<size_t>(batch * kv_len), 1);
  for (int64_t j = half; j < kv_len; ++j) bits[static_cast<size_t>(kv_len + j)] = 0;
  bits[3] = bits[100] = 0;
  const Tensor mask = Tensor::from_ints(bits, {batch, kv_len}, DType::I32);

  AttentionParams full_params;
  full_params.key_padding_mask = mask;
  full_params.return_lse = true;
  const Expected expected = reference_attention(q, k, v, full_params);

  std::vector<AttentionResult> parts;
  for (const auto& [start, length] : {std::pair<int64_t, int64_t>{0, half}, {half, kv_len - half}}) {
    AttentionParams p;
    p.key_padding_mask = mask.narrow(1, start, length);
    p.return_lse = true;
    parts.push_back(ops::attention(q, k.narrow(1, start, length), v.narrow(1, start, length), p));
  }
  const std::vector<double> o1 = parts[0].out.to_doubles(), o2 = parts[1].out.to_doubles();
  const std::vector<double> l1 = parts[0].lse.to_doubles(), l2 = parts[1].lse.to_doubles();
  std::vector<double> merged(o1.size()), merged_lse(l1.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < q_len; ++i) {
        const size_t r = static_cast<size_t>((b * heads + h) * q_len + i);
        const double m = std::max(l1[r], l2[r]);
        const double lse = m + std::log(std::exp(l1[r] - m) + std::exp(l2[r] - m));
        merged_lse[r] = lse;
        const double w1 = std::exp(l1[r] - lse), w2 = std::exp(l2[r] - lse);
        for (int64_t d = 0; d < dim; ++d) {
          const size_t o = static_cast<size_t>(((b * q_len + i) * heads + h) * dim + d);
          merged[o] = w1 * o1[o] + w2 * o2[o];
        }
      }
    }
  }
  // Half of batch 1 sees nothing: its weight must be exactly zero, not NaN.
  EXPECT_EQ(l2[static_cast<size_t>(heads * q_len)], -kInf);
  const Tensor merged_out = Tensor::from_doubles(merged, {batch, q_len, heads, dim}, dtype);
  EXPECT_MATCHES_REFERENCE(merged_out, expected.out);
  EXPECT_MATCHES_REFERENCE(Tensor::from_doubles(merged_lse, {batch, heads, q_len}, DType::F32), expected.lse);
}

TEST(AttentionMerge, TwoHalvesMergedWithLseEqualFullF32) { expect_merge_equals_full(DType::F32); }
TEST(AttentionMerge, TwoHalvesMergedWithLseEqualFullBf16) { expect_merge_equals_full(DType::BF16); }

// The softmax's 2^t against std::exp2 in double: within 2 ulp over the normal range, exact
// handling of the ends.
TEST(AttentionExp2, WithinTwoUlpOverTheNormalRange) {
  double worst_ulp = 0;
  float worst_t = 0;
  for (float t = -126.0f; t < 128.0f; t += 0.000731f * (1.0f + std::fabs(t))) {
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = std::nextafter(t, 0.0f) + static_cast<float>(l) * 1e-5f * std::fabs(t);
    float got[16];
    _mm512_storeu_ps(got, cpu::exp2_ps(_mm512_loadu_ps(lanes)));
    for (int l = 0; l < 16; ++l) {
      const double exact = std::exp2(static_cast<double>(lanes[l]));
      if (exact < 0x1p-126 || exact >= 0x1p128) continue;
      const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
      const double err = std::fabs(static_cast<double>(got[l]) - exact) / ulp;
      if (err > worst_ulp) {
        worst_ulp = err;
        worst_t = lanes[l];
      }
    }
  }
  EXPECT_LE(worst_ulp, 2.0) << "at t = " << worst_t;
}

TEST(AttentionExp2, EndsOfTheRange) {
  const float inf = std::numeric_limits<float>::infinity();
  const float inputs[16] = {-inf,  -1000.0f, -151.0f, -149.0f, -140.0f, -127.0f, 0.0f,          1.0f,
                            -1.0f, 10.0f,    127.0f,  128.0f,  129.0f,  inf,     std::nanf(""), -0.5f};
  float got[16];
  _mm512_storeu_ps(got, cpu::exp2_ps(_mm512_loadu_ps(inputs)));
  EXPECT_EQ(got[0], 0.0f);
  EXPECT_EQ(got[1], 0.0f);
  EXPECT_EQ(got[2], 0.0f);
  EXPECT_EQ(got[3], 0x1p-149f);  // the smallest subnormal, not flushed
  EXPECT_EQ(got[4], 0x1p-140f);
  EXPECT_EQ(got[5], 0x1p-127f);
  EXPECT_EQ(got[6], 1.0f);
  EXPECT_EQ(got[7], 2.0f);
  EXPECT_EQ(got[8], 0.5f);
  EXPECT_EQ(got[9], 1024.0f);
  EXPECT_EQ(got[10], 0x1p127f);
  EXPECT_EQ(got[11], inf);
  EXPECT_EQ(got[12], inf);
  EXPECT_EQ(got[13], inf);
  EXPECT_TRUE(std::isnan(got[14]));
  EXPECT_NEAR(got[15], std::sqrt(0.5), 1e-7);
}

void expect_error(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("attention"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(AttentionValidation, BadArgumentsNameTheOpAndTheShapes) {
  auto f32 = [](const Shape& shape) { return random_tensor(shape, DType::F32, 1); };
  const Tensor q = f32({2, 5, 4, 64}), k = f32({2, 7, 2, 64}), v = f32({2, 7, 2, 64});
  expect_error([&] { ops::attention(q, f32({3, 7, 2, 64}), f32({3, 7, 2, 64})); }, "[3, 7, 2, 64]");
  expect_error([&] { ops::attention(q, f32({2, 7, 2, 32}), f32({2, 7, 2, 32})); }, "head dim");
  expect_error([&] { ops::attention(q, f32({2, 7, 3, 64}), f32({2, 7, 3, 64})); }, "multiple of kv heads 3");
  expect_error([&] { ops::attention(q, k, f32({2, 8, 2, 64})); }, "same shape");
  expect_error([&] { ops::attention(q, k.to(DType::BF16), v); }, "share a dtype");
  expect_error([&] { ops::attention(q.to(DType::F16), k.to(DType::F16), v.to(DType::F16)); }, "dtype f16");
  expect_error([&] { ops::attention(q.flatten(2), k, v); }, "[B, Sq, H, D]");
  const Tensor wide = f32({1, 3, 1, 520});
  expect_error([&] { ops::attention(wide, wide, wide); }, "head dim 520");

  AttentionParams p;
  p.key_padding_mask = Tensor::from_ints(std::vector<int64_t>(14, 1), {2, 7}, DType::I64);
  expect_error([&] { ops::attention(q, k, v, p); }, "key_padding_mask has dtype i64");
  p.key_padding_mask = Tensor::from_ints(std::vector<int64_t>(12, 1), {2, 6}, DType::I32);
  expect_error([&] { ops::attention(q, k, v, p); }, "[2, 6]");
  p.key_padding_mask = Tensor::from_ints(std::vector<int64_t>(14, 1), {14}, DType::I32);
  expect_error([&] { ops::attention(q, k, v, p); }, "[B, Skv] = [2, 7]");
  p.key_padding_mask = Tensor();
  p.scale = std::nanf("");
  expect_error([&] { ops::attention(q, k, v, p); }, "scale");
}

}  // namespace
}  // namespace xdit
