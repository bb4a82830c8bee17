// Helpers the microbenchmarks share: deterministic inputs, the dtype argument and the rate counters.
#pragma once

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "xdit/core/tensor.h"

namespace xdit::bench {

// Uniform values in [-1, 1) from a cheap generator, deterministic for a seed: the GEMM and
// convolution inputs are large and only their magnitude matters there.
inline Tensor random_input(const Shape& shape, DType dtype, uint32_t seed) {
  std::vector<float> data(static_cast<size_t>(shape_numel(shape)));
  uint32_t state = seed * 2654435761u + 1u;
  for (float& v : data) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return Tensor::from_floats(data, shape, dtype);
}

// Uniform bf16 weights of variance 1/fan_in (so activations keep their scale through a model's
// blocks), written directly as bf16: the full-width model slices hold billions of them.
inline Tensor random_weight(const Shape& shape, uint32_t seed) {
  const float step = 2.0f * std::sqrt(3.0f / static_cast<float>(shape.back())) / 16777216.0f;
  const float bound = 8388608.0f * step;
  Tensor weight = Tensor::empty(shape, DType::BF16);
  uint16_t* out = weight.data<uint16_t>();
  uint32_t state = seed * 2654435761u + 1u;
  const int64_t count = weight.numel();
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    out[i] = f32_to_bf16(static_cast<float>(state >> 8) * step - bound);
  }
  return weight;
}

// Uniform values in [lo, hi) from std::mt19937 seeded with 7 (the same values for every call).
inline Tensor uniform_input(const Shape& shape, DType dtype, float lo, float hi) {
  std::mt19937 engine(7);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> data(static_cast<size_t>(shape_numel(shape)));
  for (float& v : data) v = dist(engine);
  return Tensor::from_floats(data, shape, dtype);
}

// The dtype a benchmark's first argument selects: 0 for F32, anything else for BF16.
inline DType dtype_arg(const benchmark::State& state) { return state.range(0) == 0 ? DType::F32 : DType::BF16; }

// Reports `bytes` moved per iteration as the bytes-per-second rate.
inline void set_traffic(benchmark::State& state, size_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// Reports `gflop` of work per iteration as the "GFLOP/s" counter.
inline void set_gflops(benchmark::State& state, double gflop) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(gflop * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace xdit::bench
