// Attention throughput against the machine's GEMM peak, measured in the same run: ops::attention at
// the transformer shapes (B=1, 24 heads × 128; S = 4608 is FLUX.2 klein at 1024², 4096 image +
// 512 text tokens), and a oneDNN bf16 matmul 1024×3072×3072 with prepacked weights.
//   OMP_NUM_THREADS=2 build/bin/bench_attention --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "xdit/ops/ops.h"

namespace {

using xdit::DType;
using xdit::Tensor;

Tensor filled(const xdit::Shape& shape, DType dtype, float seed) {
  std::vector<float> values(static_cast<size_t>(xdit::shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f + seed;
  return Tensor::from_floats(values, shape, dtype);
}

// q, k, v [1, S, 24, 128]; FLOPs = 4·B·H·Sq·Skv·D (Q·K^T and P·V).
void attention(benchmark::State& state, DType dtype, bool causal) {
  const int64_t seq = state.range(0), heads = 24, dim = 128;
  const Tensor q = filled({1, seq, heads, dim}, dtype, 0.0f);
  const Tensor k = filled({1, seq, heads, dim}, dtype, 0.1f);
  const Tensor v = filled({1, seq, heads, dim}, dtype, -0.1f);
  xdit::AttentionParams params;
  params.causal = causal;
  for (auto _ : state) {
    xdit::AttentionResult result = xdit::ops::attention(q, k, v, params);
    benchmark::DoNotOptimize(result.out.raw_data());
  }
  // A causal pass computes about half of the score matrix; count only what is visible.
  const double visible = causal ? 0.5 * static_cast<double>(seq + 1) / static_cast<double>(seq) : 1.0;
  const double flops = 4.0 * heads * static_cast<double>(seq) * static_cast<double>(seq) * dim * visible;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void attention_bf16(benchmark::State& state) { attention(state, DType::BF16, false); }
void attention_f32(benchmark::State& state) { attention(state, DType::F32, false); }
void attention_bf16_causal(benchmark::State& state) { attention(state, DType::BF16, true); }

// The GEMM peak: oneDNN bf16 matmul [M, K] x [K, N] -> bf16, weights reordered once into the
// layout oneDNN picks (format_tag::any), as Linear prepacks them at load.
void matmul_bf16_onednn(benchmark::State& state) {
  using dnnl::memory;
  const memory::dim m = state.range(0), k = state.range(1), n = state.range(2);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_md({m, k}, memory::data_type::bf16, memory::format_tag::ab);
  const memory::desc b_any({k, n}, memory::data_type::bf16, memory::format_tag::any);
  const memory::desc c_md({m, n}, memory::data_type::bf16, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), engine);

  const Tensor a = filled({m, k}, DType::BF16, 0.0f);
  const Tensor b = filled({k, n}, DType::BF16, 0.1f);
  const Tensor c = Tensor::empty({m, n}, DType::BF16);
  memory a_mem(a_md, engine, a.raw_data());
  memory b_plain({{k, n}, memory::data_type::bf16, memory::format_tag::ab}, engine, b.raw_data());
  memory b_packed(pd.weights_desc(), engine);
  dnnl::reorder(b_plain, b_packed).execute(stream, b_plain, b_packed);
  memory c_mem(c_md, engine, c.raw_data());
  const dnnl::matmul matmul(pd);
  for (auto _ : state) {
    matmul.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_packed}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  }
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(matmul_bf16_onednn)->Args({1024, 3072, 3072})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(attention_bf16)->Arg(1024)->Arg(4096)->Arg(4608)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(attention_bf16_causal)->Arg(4096)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(attention_f32)->Arg(1024)->Arg(4096)->Arg(4608)->UseRealTime()->Unit(benchmark::kMillisecond);
