// Activation, elementwise and data-movement kernels at FLUX.2 sizes (1024^2 image: 4096 tokens of
// width 3072) and VAE sizes. Bytes processed count each input read once plus the output written
// once, so the rate compares with BM_Memcpy, the machine's copy bandwidth on the same bytes.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "bench_util.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using bench::dtype_arg;
using bench::set_traffic;

Tensor random_input(const Shape& shape, DType dtype) { return bench::uniform_input(shape, dtype, -4.0f, 4.0f); }

const Shape kTokens = {1, 4096, 3072};

void BM_Memcpy(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  Tensor y = Tensor::empty(kTokens, x.dtype());
  for (auto _ : state) {
    std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
    benchmark::ClobberMemory();
  }
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Memcpy)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Silu(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::silu(x));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Silu)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// range(1): 0 erf, 1 tanh.
void BM_Gelu(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  const GeluApproximation approximation = state.range(1) == 0 ? GeluApproximation::Erf : GeluApproximation::Tanh;
  for (auto _ : state) benchmark::DoNotOptimize(ops::gelu(x, approximation));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Gelu)->Args({0, 0})->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// The FLUX.2 feed-forward: [4096, 2 * 9216] -> [4096, 9216].
void BM_Swiglu(benchmark::State& state) {
  const Tensor x = random_input({1, 4096, 2 * 9216}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::swiglu(x));
  set_traffic(state, x.nbytes() + x.nbytes() / 2);
}
BENCHMARK(BM_Swiglu)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Attention-probability sized rows: 24 heads x 512 queries over 4096 keys.
void BM_Softmax(benchmark::State& state) {
  const Tensor x = random_input({24, 512, 4096}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::softmax(x));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Softmax)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// A bias row [D] over [1, S, D].
void BM_AddBias(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  const Tensor bias = random_input({3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(x, bias));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_AddBias)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MulSameShape(benchmark::State& state) {
  const Tensor a = random_input(kTokens, dtype_arg(state));
  const Tensor b = random_input(kTokens, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::mul(a, b));
  set_traffic(state, 3 * a.nbytes());
}
BENCHMARK(BM_MulSameShape)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// AdaLN: per-batch shift and scale [1, 1, D] over [1, S, D].
void BM_Modulate(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  const Tensor shift = random_input({1, 1, 3072}, dtype_arg(state));
  const Tensor scale = random_input({1, 1, 3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::modulate(x, shift, scale));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Modulate)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GatedResidual(benchmark::State& state) {
  const Tensor x = random_input(kTokens, dtype_arg(state));
  const Tensor y = random_input(kTokens, dtype_arg(state));
  const Tensor gate = random_input({1, 1, 3072}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::gated_residual(x, y, gate));
  set_traffic(state, 3 * x.nbytes());
}
BENCHMARK(BM_GatedResidual)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Attention head split: [B, S, H, D] -> [B, H, S, D] (range(1) = 0) and back (1).
void BM_PermuteHeads(benchmark::State& state) {
  const bool back = state.range(1) == 1;
  const Tensor x = random_input(back ? Shape{1, 24, 4096, 128} : Shape{1, 4096, 24, 128}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::permute_copy(x, {0, 2, 1, 3}));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_PermuteHeads)->Args({1, 0})->Args({1, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// A full transposition, as between [C, H*W] and [H*W, C] in the VAE.
void BM_Transpose(benchmark::State& state) {
  const Tensor x = random_input({512, 128 * 128}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::permute_copy(x, {1, 0}));
  set_traffic(state, 2 * x.nbytes());
}
BENCHMARK(BM_Transpose)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// FLUX.2 single block: attention output [S, D] and MLP output [S, 3D] joined on the last dim.
void BM_ConcatLastDim(benchmark::State& state) {
  const Tensor a = random_input(kTokens, dtype_arg(state));
  const Tensor b = random_input({1, 4096, 9216}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::concat({a, b}, -1));
  set_traffic(state, 2 * (a.nbytes() + b.nbytes()));
}
BENCHMARK(BM_ConcatLastDim)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// VAE decoder: [1, 256, 256, 256] -> padded by 1 on H and W, and upsampled 2x2.
void BM_Pad(benchmark::State& state) {
  const Tensor x = random_input({1, 256, 256, 256}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::pad(x, {1, 1, 1, 1}));
  set_traffic(state, x.nbytes() + static_cast<size_t>(256 * 258 * 258) * (x.nbytes() / x.numel()));
}
BENCHMARK(BM_Pad)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_UpsampleNearest(benchmark::State& state) {
  const Tensor x = random_input({1, 256, 128, 128}, dtype_arg(state));
  for (auto _ : state) benchmark::DoNotOptimize(ops::upsample_nearest(x, {2, 2}));
  set_traffic(state, 5 * x.nbytes());
}
BENCHMARK(BM_UpsampleNearest)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace xdit
