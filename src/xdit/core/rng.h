// Seeded noise that reproduces torch's random streams bit for bit.
//
// diffusers draws its initial latents with torch.randn(shape, generator=g, dtype=dt) from
// g = torch.Generator(device).manual_seed(seed), so an image is reproducible from a seed only if
// we produce exactly the same numbers. docs/rng.md lists the torch code paths reproduced here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "xdit/core/tensor.h"

namespace xdit {

// Whose generator the noise must match: the CLI's --rng torch_cpu|torch_cuda.
enum class NoiseSource : uint8_t { TorchCpu, TorchCuda };

std::string_view noise_source_name(NoiseSource source);      // "torch_cpu", "torch_cuda"
NoiseSource noise_source_from_name(std::string_view name);   // throws naming the input

// A seeded stream of standard normal noise; successive calls continue the stream.
class NoiseGenerator {
 public:
  virtual ~NoiseGenerator() = default;
  // torch.randn(shape, generator=g, dtype=dtype): a new contiguous CPU tensor of F32, BF16 or F16.
  virtual Tensor randn(const Shape& shape, DType dtype) = 0;
};

// The generator for `source` seeded like torch.Generator(device).manual_seed(seed).
// TorchCuda (torch's Philox generator) throws NotSupported.
std::unique_ptr<NoiseGenerator> make_noise_generator(NoiseSource source, uint64_t seed);

// The 32-bit Mersenne Twister MT19937 with the reference init_genrand seeding: the same stream as
// std::mt19937(seed).
class Mt19937 {
 public:
  explicit Mt19937(uint32_t seed);
  uint32_t operator()();

 private:
  static constexpr int kN = 624;
  void regenerate();

  std::array<uint32_t, kN> state_;
  int next_ = kN;  // index of the next state word to temper; kN: regenerate first
};

// torch.Generator("cpu").manual_seed(seed), drawn from as torch 2.15 does on x86-64 CPUs with
// AVX2 (torch's AVX2 and AVX512 capabilities; docs/rng.md). Only the low 32 bits of the seed reach
// the engine: 2**32 + 5 gives the same stream as 5.
class TorchCpuGenerator final : public NoiseGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed);

  uint64_t seed() const { return seed_; }
  Tensor randn(const Shape& shape, DType dtype) override;

 private:
  float uniform_float();    // [0, 1) on a 2^-24 grid: one engine draw
  double uniform_double();  // [0, 1) on a 2^-53 grid: two engine draws
  double normal_double();   // Box-Muller in double; the second sample of each pair is kept
  void fill_small(Tensor& out);
  void fill_blocks(Tensor& out);

  uint64_t seed_;
  Mt19937 engine_;
  // The sine half of the last double Box-Muller pair, used by the next small draw. Large draws
  // leave it alone, as torch does.
  std::optional<double> cached_normal_;
};

}  // namespace xdit
