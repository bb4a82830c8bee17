// Conversions are checked bit for bit: decoding against tables built from the format definition,
// encoding against an independent nearest-value search (and, for f16, the F16C hardware).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/error.h"

namespace xdit {
namespace {

// Every 2^32 input is checked unless XDIT_TEST_STRIDE asks for a sample (sanitizer builds).
uint64_t exhaustive_stride() {
  const char* s = std::getenv("XDIT_TEST_STRIDE");
  return s ? std::max<uint64_t>(1, std::strtoull(s, nullptr, 10)) : 1;
}

bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || f32_to_bits(a) == f32_to_bits(b);
}

// The value of a small float from its definition: (-1)^s * 2^(e-bias) * (1 + m/2^M), subnormal at e=0.
double definition_value(uint32_t bits, int exp_bits, int man_bits, int bias) {
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const double sign = (bits >> (exp_bits + man_bits)) & 1u ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -man_bits), static_cast<int>(exp) - bias);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("f64"), Error);
}

TEST(DType, Bf16DecodeIsExhaustivelyTheUpperHalfOfF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    EXPECT_TRUE(same_bits_or_both_nan(bf16_to_f32(static_cast<uint16_t>(h)), bits_to_f32(h << 16))) << h;
  }
}

TEST(DType, F16DecodeMatchesDefinitionAndHardware) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = f16_to_f32(static_cast<uint16_t>(h));
    const float hw = _cvtsh_ss(static_cast<unsigned short>(h));
    ASSERT_TRUE(same_bits_or_both_nan(ours, hw)) << h;
    const uint32_t exp = (h >> 10) & 0x1f;
    if (exp != 0x1f) {
      ASSERT_EQ(static_cast<double>(ours), definition_value(h, 5, 10, 15)) << h;
    }
  }
}

TEST(DType, F8E4M3DecodeTable) {
  for (uint32_t v = 0; v < 256; ++v) {
    const float f = f8e4m3_to_f32(static_cast<uint8_t>(v));
    if ((v & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << v;  // e4m3fn: only S.1111.111 is NaN, and there is no infinity
    } else {
      EXPECT_EQ(static_cast<double>(f), definition_value(v, 4, 3, 7)) << v;
    }
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, F8E5M2DecodeTable) {
  for (uint32_t v = 0; v < 256; ++v) {
    const float f = f8e5m2_to_f32(static_cast<uint8_t>(v));
    const uint32_t exp = (v >> 2) & 0x1f;
    if (exp == 0x1f) {
      EXPECT_TRUE((v & 3) == 0 ? std::isinf(f) : std::isnan(f)) << v;
    } else {
      EXPECT_EQ(static_cast<double>(f), definition_value(v, 5, 2, 15)) << v;
    }
  }
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
}

// Reference rounding: the nearest of the format's finite values, ties to the even code; values
// beyond the largest finite one by at least half an ulp overflow.
struct NearestSearch {
  std::vector<std::pair<double, uint32_t>> positives;  // (value, bits), sorted
  double max_finite;
  double overflow_threshold;  // max_finite + half an ulp of the top binade

  NearestSearch(float (*decode)(uint32_t), uint32_t sign_bit) {
    for (uint32_t c = 0; c < sign_bit; ++c) {
      const double v = decode(c);
      if (std::isfinite(v)) positives.emplace_back(v, c);
    }
    std::sort(positives.begin(), positives.end());
    max_finite = positives.back().first;
    overflow_threshold = max_finite + (max_finite - positives[positives.size() - 2].first) / 2;
  }

  // Returns the magnitude code for |x| (finite, below overflow).
  uint32_t round(double x) const {
    auto it = std::lower_bound(positives.begin(), positives.end(), std::make_pair(x, 0u));
    if (it == positives.end()) return positives.back().second;
    if (it->first == x || it == positives.begin()) return it->second;
    auto below = std::prev(it);
    const double down = x - below->first, up = it->first - x;
    if (down < up) return below->second;
    if (up < down) return it->second;
    return (below->second & 1u) == 0 ? below->second : it->second;
  }
};

float decode_f16(uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); }
float decode_e4m3(uint32_t c) { return f8e4m3_to_f32(static_cast<uint8_t>(c)); }
float decode_e5m2(uint32_t c) { return f8e5m2_to_f32(static_cast<uint8_t>(c)); }

// Checks an encoder on `x` against the nearest-value reference with the format's overflow rule.
void expect_encodes_like_reference(float x, uint32_t got, const NearestSearch& ref, uint32_t sign_bit,
                                   uint32_t overflow_code, bool (*is_nan_code)(uint32_t)) {
  const uint32_t sign = std::signbit(x) ? sign_bit : 0;
  if (std::isnan(x)) {
    ASSERT_TRUE(is_nan_code(got)) << "NaN input gave code " << got;
    return;
  }
  const double mag = std::fabs(static_cast<double>(x));
  const uint32_t expect = sign | (mag >= ref.overflow_threshold ? overflow_code : ref.round(mag));
  ASSERT_EQ(got, expect) << "input " << x << " (bits " << std::hex << f32_to_bits(x) << ")";
}

bool f16_nan(uint32_t c) { return (c & 0x7c00) == 0x7c00 && (c & 0x3ff) != 0; }
bool e4m3_nan(uint32_t c) { return (c & 0x7f) == 0x7f; }
bool e5m2_nan(uint32_t c) { return (c & 0x7c) == 0x7c && (c & 3) != 0; }

TEST(DType, Bf16EncodeExhaustive) {
  const uint64_t stride = exhaustive_stride();
  int64_t failures = 0;
#pragma omp parallel for reduction(+ : failures) schedule(static)
  for (int64_t hi = 0; hi < 65536; ++hi) {
    for (uint64_t lo = 0; lo < 65536; lo += stride) {
      const uint32_t bits = static_cast<uint32_t>(hi << 16) | static_cast<uint32_t>(lo);
      const float x = bits_to_f32(bits);
      const uint16_t got = f32_to_bf16(x);
      if (std::isnan(x)) {
        failures += !std::isnan(bf16_to_f32(got));
        continue;
      }
      // Reference: the two bf16 neighbours by truncation, compared in double; ties to even.
      const uint32_t down = bits >> 16;
      const double lo_val = bf16_to_f32(static_cast<uint16_t>(down));
      const double hi_val = bf16_to_f32(static_cast<uint16_t>(down + 1));
      const double a = std::fabs(static_cast<double>(x));
      const double d_down = std::fabs(a - std::fabs(lo_val));
      const double d_up = std::isinf(hi_val) && (down & 0x7f80) == 0x7f00 ? std::fabs(std::ldexp(1.0, 128) - a)
                                                                           : std::fabs(std::fabs(hi_val) - a);
      uint32_t expect;
      if (std::isinf(x) || lo == 0) {
        expect = down;
      } else if (d_down < d_up) {
        expect = down;
      } else if (d_up < d_down) {
        expect = down + 1;
      } else {
        expect = (down & 1u) == 0 ? down : down + 1;
      }
      failures += got != expect;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(DType, F16EncodeExhaustiveAgainstHardwareAndNearestSearch) {
  const uint64_t stride = exhaustive_stride();
  int64_t failures = 0;
#pragma omp parallel for reduction(+ : failures) schedule(static)
  for (int64_t hi = 0; hi < 65536; ++hi) {
    for (uint64_t lo = 0; lo < 65536; lo += stride) {
      const float x = bits_to_f32(static_cast<uint32_t>(hi << 16) | static_cast<uint32_t>(lo));
      const uint16_t ours = f32_to_f16(x);
      const uint16_t hw = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
      if (std::isnan(x)) {
        failures += !f16_nan(ours);
      } else {
        failures += ours != hw;
      }
    }
  }
  EXPECT_EQ(failures, 0);
  // Hardware is one reference; the nearest search is an independent second one at the boundaries.
  NearestSearch ref(decode_f16, 0x8000);
  for (size_t i = 0; i + 1 < ref.positives.size(); ++i) {
    const double mid = (ref.positives[i].first + ref.positives[i + 1].first) / 2;
    const float m = static_cast<float>(mid);
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY), -m}) {
      expect_encodes_like_reference(x, f32_to_f16(x), ref, 0x8000, 0x7c00, f16_nan);
    }
  }
}

// FP8 encoders are checked at every decision point (each midpoint between neighbouring values,
// its f32 neighbours and the values themselves), across the overflow boundary, and on random
// and special inputs against the nearest search.
void check_fp8_encoder(uint8_t (*encode)(float), float (*decode)(uint32_t), uint32_t max_code, bool (*is_nan)(uint32_t)) {
  NearestSearch ref(decode, 0x80);
  auto check = [&](float x) { expect_encodes_like_reference(x, encode(x), ref, 0x80, max_code, is_nan); };
  for (size_t i = 0; i + 1 < ref.positives.size(); ++i) {
    const double lo = ref.positives[i].first, hi = ref.positives[i + 1].first;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: fp8 midpoints fit in f32
    for (float x : {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      check(x);
      check(-x);
    }
  }
  const float top = static_cast<float>(ref.max_finite);
  const float threshold = static_cast<float>(ref.overflow_threshold);
  for (float x : {top, threshold, std::nextafter(threshold, 0.0f), std::nextafter(threshold, INFINITY), 1e10f,
                  INFINITY, std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 0.0f,
                  -0.0f, NAN}) {
    check(x);
    check(-x);
  }
  std::mt19937 engine(7);
  for (int i = 0; i < 2'000'000; ++i) check(bits_to_f32(engine()));
  std::uniform_real_distribution<float> in_range(-1.2f * top, 1.2f * top);
  for (int i = 0; i < 2'000'000; ++i) check(in_range(engine));
}

TEST(DType, F8E4M3EncodeSaturatesAndRoundsToNearestEven) {
  check_fp8_encoder(f32_to_f8e4m3, decode_e4m3, 0x7e, e4m3_nan);
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);  // exactly between 448 and the (absent) 480: saturates
}

TEST(DType, F8E5M2EncodeSaturatesAndRoundsToNearestEven) {
  check_fp8_encoder(f32_to_f8e5m2, decode_e5m2, 0x7b, e5m2_nan);
  EXPECT_EQ(f32_to_f8e5m2(INFINITY), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(-1e9f), 0xfb);
}

TEST(DType, ConvertBuffersThroughEveryPair) {
  const std::vector<DType> all = {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32, DType::I64};
  const std::vector<float> values = {0.0f, 1.0f, -2.0f, 3.0f, 16.0f, -7.0f, 96.0f};
  for (DType from : all) {
    for (DType to : all) {
      std::vector<unsigned char> src(values.size() * dtype_size(from)), dst(values.size() * dtype_size(to));
      for (size_t i = 0; i < values.size(); ++i) store_from_f32(src.data(), from, i, values[i]);
      convert(src.data(), from, dst.data(), to, values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        // All test values are exact in every format.
        EXPECT_EQ(load_as_f32(dst.data(), to, i), values[i]) << dtype_name(from) << "->" << dtype_name(to);
      }
    }
  }
}

}  // namespace
}  // namespace xdit

namespace xdit {
namespace {

TEST(DType, RoundToDtypeIsTheStoredValue) {
  // 987.5 in bf16: 8 mantissa bits give a spacing of 4 in [512, 1024); ties go to even (988).
  EXPECT_EQ(round_to_dtype(987.5f, DType::BF16), 988.0f);
  EXPECT_EQ(round_to_dtype(986.0f, DType::BF16), 984.0f);
  EXPECT_EQ(round_to_dtype(0.1f, DType::F32), 0.1f);
  EXPECT_EQ(round_to_dtype(1000.0f, DType::F8E4M3), 448.0f);  // saturates like SATFINITE
  EXPECT_EQ(round_to_dtype(1.0f + 1.0f / 2048, DType::F16), 1.0f);
  EXPECT_THROW(round_to_dtype(1.0f, DType::I32), Error);
}

}  // namespace
}  // namespace xdit
