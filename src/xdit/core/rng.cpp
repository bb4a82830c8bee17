#include "xdit/core/rng.h"

#include <bit>
#include <cmath>
#include <numbers>

#include "xdit/core/error.h"

namespace xdit {

std::string_view noise_source_name(NoiseSource source) {
  switch (source) {
    case NoiseSource::TorchCpu: return "torch_cpu";
    case NoiseSource::TorchCuda: return "torch_cuda";
  }
  fail("invalid noise source value ", static_cast<int>(source));
}

NoiseSource noise_source_from_name(std::string_view name) {
  for (NoiseSource s : {NoiseSource::TorchCpu, NoiseSource::TorchCuda}) {
    if (noise_source_name(s) == name) return s;
  }
  fail("unknown noise source \"", name, "\" (expected torch_cpu or torch_cuda)");
}

std::unique_ptr<NoiseGenerator> make_noise_generator(NoiseSource source, uint64_t seed) {
  switch (source) {
    case NoiseSource::TorchCpu: return std::make_unique<TorchCpuGenerator>(seed);
    case NoiseSource::TorchCuda: throw NotSupported("noise source torch_cuda (torch's CUDA Philox generator)");
  }
  fail("invalid noise source value ", static_cast<int>(source));
}

// ---------------------------------------------------------------------------------------------
// MT19937 (Matsumoto & Nishimura 1998).

Mt19937::Mt19937(uint32_t seed) {
  state_[0] = seed;
  for (int i = 1; i < kN; ++i) {
    const uint32_t prev = state_[i - 1];
    state_[i] = 1812433253u * (prev ^ (prev >> 30)) + static_cast<uint32_t>(i);
  }
}

void Mt19937::regenerate() {
  constexpr int kM = 397;
  for (int i = 0; i < kN; ++i) {
    const uint32_t y = (state_[i] & 0x80000000u) | (state_[(i + 1) % kN] & 0x7fffffffu);
    state_[i] = state_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  }
  next_ = 0;
}

uint32_t Mt19937::operator()() {
  if (next_ == kN) regenerate();
  uint32_t y = state_[next_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

// ---------------------------------------------------------------------------------------------
// torch's vectorised Box-Muller for float (NormalFill16 with avx_mathfun.h's Cephes-derived
// log256_ps and sincos256_ps), one lane at a time. Every operation below is one IEEE single
// operation of the torch 2.15 binary, in its order: std::fma exactly where GCC fused a multiply
// and an add when it built torch, a separate multiply and add everywhere else. The only product
// that feeds a plain addition is the final `+ 0.0f`, where fusing changes nothing, so our own
// compiler's contraction settings cannot change the result (-ffast-math would). The constants are
// the binary's float bit patterns.
namespace {

// log(x) for x in [2^-24, 1], the range of 1 - uniform. (torch also clamps denormals and turns
// x <= 0 into NaN; neither can happen here.)
float cephes_log(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127) + 1.0f;
  // The mantissa scaled into [0.5, 1).
  float m = std::bit_cast<float>((bits & ~0x7f800000u) | 0x3f000000u);
  // Below sqrt(1/2), use 2m - 1 and one less in the exponent, so the polynomial sees [-0.29, 0.41).
  const bool low = m < 0x1.6a09e6p-1f;
  const float low_m = low ? m : 0.0f;
  e = e - (low ? 1.0f : 0.0f);
  m = m - 1.0f;
  m = m + low_m;

  const float z = m * m;
  float y = 0x1.204376p-4f;
  for (float c : {-0x1.d7a370p-4f, 0x1.de4a34p-4f, -0x1.fcba9ep-4f, 0x1.23d37ep-3f, -0x1.555ca0p-3f,
                  0x1.999d58p-3f, -0x1.fffff8p-3f, 0x1.555554p-2f}) {
    y = std::fma(y, m, c);
  }
  y = y * m;
  // log(2) = 0x1.63p-1 + -0x1.bd0106p-13, split so e * 0x1.63p-1 is exact.
  y = std::fma(y, z, e * -0x1.bd0106p-13f);
  y = std::fma(-z, 0.5f, y);
  m = m + y;
  return std::fma(e, 0x1.63p-1f, m);
}

// sin(x) and cos(x) for x in [0, 2pi).
void cephes_sincos(float x, float& sin_x, float& cos_x) {
  // Octant j (made even) of x, then x - j*pi/4 with pi/4 split in three parts.
  int32_t j = static_cast<int32_t>(x * 0x1.45f306p+0f);  // 4/pi; truncation like cvttps2dq
  j = (j + 1) & ~1;
  const float octant = static_cast<float>(j);
  x = std::fma(octant, -0x1.92p-1f, x);
  x = std::fma(octant, -0x1.fb4p-13f, x);
  x = std::fma(octant, -0x1.4442d2p-25f, x);

  const float z = x * x;
  float cos_poly = std::fma(std::fma(0x1.99eb9cp-16f, z, -0x1.6c0c34p-10f), z, 0x1.55554ap-5f);
  cos_poly = z * cos_poly;
  cos_poly = std::fma(z, cos_poly, -(z * 0.5f));
  cos_poly = cos_poly + 1.0f;
  float sin_poly = std::fma(std::fma(-0x1.9943f2p-13f, z, 0x1.11073cp-7f), z, -0x1.555546p-3f);
  sin_poly = z * sin_poly;
  sin_poly = std::fma(x, sin_poly, x);

  const bool swap = (j & 2) != 0;
  sin_x = swap ? cos_poly : sin_poly;
  cos_x = swap ? sin_poly : cos_poly;
  if (j & 4) sin_x = -sin_x;          // sin < 0 around pi and 3pi/2 (j = 4, 6)
  if (!((j - 2) & 4)) cos_x = -cos_x;  // cos < 0 around pi/2 and pi (j = 2, 4)
}

// Eight Box-Muller pairs in place: v[0..8) and v[8..16) are uniforms in [0, 1) on entry and
// standard normals on exit (radius from v[i], angle from v[i + 8]).
void box_muller_16(float* v) {
  for (int i = 0; i < 8; ++i) {
    const float radius = std::sqrt(-2.0f * cephes_log(1.0f - v[i]));
    const float theta = 0x1.921fb6p+2f * v[i + 8];  // float(2 pi)
    float sin_t, cos_t;
    cephes_sincos(theta, sin_t, cos_t);
    // torch finishes with fma(n, std = 1, mean = 0): it only turns -0 (radius -0 when the
    // uniform is 0) into +0.
    v[i] = radius * cos_t + 0.0f;
    v[i + 8] = radius * sin_t + 0.0f;
  }
}

void store(Tensor& out, int64_t i, float value) {
  store_from_f32(out.raw_data(), out.dtype(), static_cast<size_t>(i), value);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// torch.Generator("cpu"): mt19937 seeded with the low 32 bits of the seed, and torch's CPU
// normal kernel (at::native normal_kernel, the AVX2 build even on AVX-512 machines: torch
// registers no AVX-512 kernel for normal_).

TorchCpuGenerator::TorchCpuGenerator(uint64_t seed) : seed_(seed), engine_(static_cast<uint32_t>(seed)) {}

float TorchCpuGenerator::uniform_float() {
  return static_cast<float>(engine_() & 0xffffffu) * 0x1p-24f;
}

double TorchCpuGenerator::uniform_double() {
  const uint64_t high = engine_();
  const uint64_t low = engine_();
  return static_cast<double>(((high << 32) | low) & ((uint64_t{1} << 53) - 1)) * 0x1p-53;
}

double TorchCpuGenerator::normal_double() {
  if (cached_normal_) {
    const double cached = *cached_normal_;
    cached_normal_.reset();
    return cached;
  }
  const double u1 = uniform_double();
  const double u2 = uniform_double();
  const double radius = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * std::numbers::pi * u1;
  cached_normal_ = radius * std::sin(theta);
  return radius * std::cos(theta);
}

// Fewer than 16 elements: one double normal per element (Box-Muller pairs, the second half cached
// across calls), rounded to float and then to the output dtype, as torch's static_cast does.
void TorchCpuGenerator::fill_small(Tensor& out) {
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) {
    // + 0.0: torch's value * std + mean with std = 1, mean = 0 turns -0 into +0.
    store(out, i, static_cast<float>(normal_double() + 0.0));
  }
}

// 16 or more elements: blocks of 16 uniforms turned into 16 normals. When the size is not a
// multiple of 16, the last 16 elements are recomputed from 16 fresh uniforms.
void TorchCpuGenerator::fill_blocks(Tensor& out) {
  const int64_t n = out.numel();
  float block[16];
  auto draw_block = [&](int64_t start) {
    for (float& u : block) u = uniform_float();
    box_muller_16(block);
    for (int64_t j = 0; j < 16; ++j) store(out, start + j, block[j]);
  };
  for (int64_t start = 0; start + 16 <= n; start += 16) draw_block(start);
  if (n % 16 != 0) {
    // For float32 torch draws the uniforms of the partial block into the output before the
    // recomputation overwrites them; those draws still advance the stream. BF16/F16 skip them.
    if (out.dtype() == DType::F32) {
      for (int64_t j = 0; j < n % 16; ++j) engine_();
    }
    draw_block(n - 16);
  }
}

Tensor TorchCpuGenerator::randn(const Shape& shape, DType dtype) {
  XDIT_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "randn: dtype ",
             dtype_name(dtype), " is not supported (expected f32, bf16 or f16)");
  Tensor out = Tensor::empty(shape, dtype);
  if (out.numel() >= 16) {
    fill_blocks(out);
  } else {
    fill_small(out);
  }
  return out;
}

}  // namespace xdit
