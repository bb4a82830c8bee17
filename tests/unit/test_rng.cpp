// TorchCpuGenerator against torch itself: every draw recorded in
// tests/fixtures/reference/rng_torch_cpu.safetensors (tools/reference/make_rng_fixture.py) must
// come out bit for bit, in float32, bfloat16 and float16, on both of torch's paths (fewer than 16
// elements: double Box-Muller; 16 or more: blocks of 16), and across successive draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "xdit/core/error.h"
#include "xdit/core/rng.h"
#include "xdit/io/safetensors.h"

namespace xdit {
namespace {

const std::string kFixture = XDIT_SOURCE_DIR "/tests/fixtures/reference/rng_torch_cpu.safetensors";

// Bit patterns of a contiguous F32/BF16/F16 tensor, widened to 32 bits.
std::vector<uint32_t> bit_patterns(const Tensor& t) {
  const Tensor dense = t.contiguous();
  const auto n = static_cast<size_t>(dense.numel());
  std::vector<uint32_t> bits(n);
  if (dense.dtype() == DType::F32) {
    std::memcpy(bits.data(), dense.raw_data(), n * 4);
  } else {
    const auto* half = dense.data<uint16_t>();
    std::copy(half, half + n, bits.begin());
  }
  return bits;
}

// Distance in units in the last place between two values of the same format (sign-magnitude
// bit patterns mapped onto a monotonic integer line).
int64_t ulp_distance(uint32_t a, uint32_t b, DType dtype) {
  const uint32_t sign = dtype == DType::F32 ? 0x80000000u : 0x8000u;
  auto line = [sign](uint32_t bits) {
    const int64_t magnitude = bits & (sign - 1);
    return (bits & sign) ? -magnitude : magnitude;
  };
  return std::abs(line(a) - line(b));
}

// One fixture case: the draws a fresh generator makes in order.
struct Case {
  uint64_t seed = 0;
  std::vector<std::pair<int, std::string>> draws;  // (index, tensor name)
};

// Names are "seed<S>.<case>.<i>".
std::map<std::string, Case> fixture_cases(const SafetensorsFile& file) {
  std::map<std::string, Case> cases;
  for (const std::string& name : file.names()) {
    const size_t first_dot = name.find('.');
    const size_t last_dot = name.rfind('.');
    XDIT_CHECK(name.rfind("seed", 0) == 0 && first_dot != std::string::npos && last_dot > first_dot,
               "unexpected fixture tensor name ", name);
    Case& c = cases[name.substr(0, last_dot)];
    c.seed = std::stoull(name.substr(4, first_dot - 4));
    c.draws.emplace_back(std::stoi(name.substr(last_dot + 1)), name);
  }
  for (auto& [label, c] : cases) std::sort(c.draws.begin(), c.draws.end());
  return cases;
}

struct Tally {
  int64_t elements = 0;
  int64_t exact = 0;
  int64_t max_ulp = 0;
};

TEST(TorchCpuGenerator, MatchesTorchBitForBit) {
  const SafetensorsFile file = SafetensorsFile::open(kFixture);
  const auto cases = fixture_cases(file);
  ASSERT_GE(cases.size(), 60u);

  std::map<std::string, Tally> tallies;  // by dtype and path
  for (const auto& [label, c] : cases) {
    TorchCpuGenerator generator(c.seed);
    for (const auto& [index, name] : c.draws) {
      const Tensor expected = file.tensor(name);
      const Tensor actual = generator.randn(expected.shape(), expected.dtype());
      ASSERT_EQ(actual.shape(), expected.shape()) << name;
      ASSERT_EQ(actual.dtype(), expected.dtype()) << name;

      const std::vector<uint32_t> want = bit_patterns(expected);
      const std::vector<uint32_t> got = bit_patterns(actual);
      const std::string path = expected.numel() < 16 ? "double Box-Muller (< 16)" : "blocks of 16 (>= 16)";
      Tally& tally = tallies[std::string(dtype_name(expected.dtype())) + ", " + path];
      int64_t mismatches = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const int64_t ulp = ulp_distance(want[i], got[i], expected.dtype());
        tally.max_ulp = std::max(tally.max_ulp, ulp);
        if (ulp == 0) continue;
        if (mismatches++ < 3) {
          ADD_FAILURE() << name << "[" << i << "]: torch bits 0x" << std::hex << want[i] << ", ours 0x" << got[i]
                        << std::dec << " (" << ulp << " ulp)";
        }
      }
      tally.elements += static_cast<int64_t>(want.size());
      tally.exact += static_cast<int64_t>(want.size()) - mismatches;
      EXPECT_EQ(mismatches, 0) << name << ": " << mismatches << " of " << want.size() << " elements differ";
    }
  }
  for (const auto& [key, tally] : tallies) {
    std::cout << "  " << key << ": " << tally.exact << " of " << tally.elements << " bit-exact, max "
              << tally.max_ulp << " ulp\n";
  }
}

TEST(TorchCpuGenerator, SeedsAboveThirtyTwoBitsKeepTheLowBits) {
  TorchCpuGenerator low(5), high((uint64_t{1} << 32) + 5);
  EXPECT_EQ(high.seed(), (uint64_t{1} << 32) + 5);
  const Tensor a = low.randn({40}, DType::F32);
  const Tensor b = high.randn({40}, DType::F32);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

TEST(TorchCpuGenerator, RejectsOtherDtypes) {
  TorchCpuGenerator generator(0);
  EXPECT_THROW(generator.randn({4}, DType::I32), Error);
  EXPECT_THROW(generator.randn({4}, DType::F8E4M3), Error);
}

TEST(Mt19937, MatchesStdMt19937) {
  for (uint32_t seed : {0u, 1u, 42u, 5489u, 0xffffffffu}) {
    Mt19937 ours(seed);
    std::mt19937 reference(seed);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(ours(), reference()) << "seed " << seed << ", draw " << i;
  }
  // The C++ standard's check value: the 10000th draw after default seeding (5489).
  Mt19937 standard(5489);
  for (int i = 0; i < 9999; ++i) standard();
  EXPECT_EQ(standard(), 4123659995u);
}

TEST(NoiseSource, NamesAndFactory) {
  for (NoiseSource s : {NoiseSource::TorchCpu, NoiseSource::TorchCuda}) {
    EXPECT_EQ(noise_source_from_name(noise_source_name(s)), s);
  }
  EXPECT_THROW(noise_source_from_name("philox"), Error);

  auto generator = make_noise_generator(NoiseSource::TorchCpu, 42);
  TorchCpuGenerator direct(42);
  const Tensor a = generator->randn({3, 7}, DType::BF16);
  const Tensor b = direct.randn({3, 7}, DType::BF16);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);

  EXPECT_THROW(make_noise_generator(NoiseSource::TorchCuda, 42), NotSupported);
}

}  // namespace
}  // namespace xdit
