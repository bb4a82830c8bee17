// Norm, RoPE and reduction kernels at DiT/VAE sizes. Bytes processed count one read of the input
// plus one write of the output, so the reported rate compares with the memory bandwidth.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_util.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using bench::dtype_arg;
using bench::set_traffic;

Tensor random_input(const Shape& shape, DType dtype) { return bench::uniform_input(shape, dtype, -1.0f, 1.0f); }

// FLUX.2 image tokens at 1024^2: [4096, 3072].
void BM_RmsNorm(benchmark::State& state) {
  const Tensor x = random_input({4096, 3072}, dtype_arg(state));
  const Tensor weight = random_input({3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::rms_norm(x, weight, 1e-6f));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_RmsNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNorm(benchmark::State& state) {
  const Tensor x = random_input({4096, 3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::layer_norm(x, {}, {}, 1e-6f));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_LayerNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// A VAE decoder mid-resolution GroupNorm(32, 512) at 128x128.
void BM_GroupNorm(benchmark::State& state) {
  const Tensor x = random_input({1, 512, 128, 128}, dtype_arg(state));
  const Tensor weight = random_input({512}, DType::F32);
  const Tensor bias = random_input({512}, DType::F32);
  for (auto _ : state) benchmark::DoNotOptimize(ops::group_norm(x, 32, weight, bias, 1e-6f));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_GroupNorm)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// q of a 24-head, 128-wide attention over 4096 tokens; range(1) = 0 interleaved, 1 rotate-half.
void BM_ApplyRope(benchmark::State& state) {
  const Tensor x = random_input({1, 4096, 24, 128}, dtype_arg(state));
  const ops::RopeTable table{random_input({4096, 64}, DType::F32), random_input({4096, 64}, DType::F32)};
  const RopeStyle style = state.range(1) == 0 ? RopeStyle::Interleaved : RopeStyle::RotateHalf;
  for (auto _ : state) benchmark::DoNotOptimize(ops::apply_rope(x, table, style));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_ApplyRope)->Args({0, 0})->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// FLUX.2 ids for 4096 image and 512 text tokens.
void BM_RopeTable(benchmark::State& state) {
  std::vector<int64_t> ids;
  for (int64_t s = 0; s < 4608; ++s) {
    const bool text = s >= 4096;
    ids.insert(ids.end(), {0, text ? 0 : s / 64, text ? 0 : s % 64, text ? s - 4096 : 0});
  }
  const Tensor positions = Tensor::from_ints(ids, {4608, 4});
  for (auto _ : state) benchmark::DoNotOptimize(ops::rope_table(positions, {32, 32, 32, 32}, 2000.0));
}
BENCHMARK(BM_RopeTable)->Unit(benchmark::kMillisecond)->UseRealTime();

// The step cache's residual check reads [1, 4096, 3072] activations: all-dims |x| sum.
void BM_L1NormAll(benchmark::State& state) {
  const Tensor x = random_input({1, 4096, 3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::l1_norm(x));
  set_traffic(state, x.nbytes() + 4);
}
BENCHMARK(BM_L1NormAll)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MeanLastDim(benchmark::State& state) {
  const Tensor x = random_input({4096, 3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::mean(x, {-1}));
  set_traffic(state, x.nbytes() + 4096 * 4);
}
BENCHMARK(BM_MeanLastDim)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace xdit
