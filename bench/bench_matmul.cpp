// GEMM throughput at the acceptance point (1024x3072x3072) and DiT shapes, for f32 and bf16:
//   linear          ops::linear with the weight in its stored [N, K] layout (zero copy)
//   matmul          ops::matmul with a [K, N] right operand
//   onednn_packed   a direct oneDNN matmul written here, weights prepacked in the layout oneDNN
//                   picks (format_tag::any): the reference the others are measured against
//   linear_packed   ops-level linear on weights prepacked once (gemm_packed.h)
//   fp8_linear      ops::linear with an f8e4m3 weight and per-channel scales
// Benchmarks of one shape and dtype run next to each other, so their ratios come from one run.
// GFLOP/s counts 2*M*N*K per call.
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/backend/cpu/gemm_packed.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using bench::random_input;

struct GemmShape {
  int64_t m, k, n;
};

void set_rate(benchmark::State& state, const GemmShape& s) {
  bench::set_gflops(state,
                    2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) * 1e-9);
}

void bench_linear(benchmark::State& state, GemmShape s, DType dtype) {
  const Tensor x = random_input({s.m, s.k}, dtype, 1);
  const Tensor w = random_input({s.n, s.k}, dtype, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::linear(x, w));
  set_rate(state, s);
}

void bench_matmul(benchmark::State& state, GemmShape s, DType dtype) {
  const Tensor a = random_input({s.m, s.k}, dtype, 1);
  const Tensor b = random_input({s.k, s.n}, dtype, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::matmul(a, b));
  set_rate(state, s);
}

void bench_linear_packed(benchmark::State& state, GemmShape s, DType dtype) {
  const Tensor x = random_input({s.m, s.k}, dtype, 1);
  const cpu::PackedLinearWeight w = cpu::pack_linear_weight(random_input({s.n, s.k}, dtype, 2), s.m);
  for (auto _ : state) benchmark::DoNotOptimize(cpu::linear_packed(x, w, {}));
  set_rate(state, s);
}

void bench_fp8_linear(benchmark::State& state, GemmShape s, DType dtype) {
  const Tensor x = random_input({s.m, s.k}, dtype, 1);
  const ops::Fp8Weight w = ops::quantize_fp8_per_channel(random_input({s.n, s.k}, DType::BF16, 2));
  for (auto _ : state) benchmark::DoNotOptimize(ops::linear(x, w.data, {}, w.scale));
  set_rate(state, s);
}

// oneDNN by hand: plain row-major src and dst, weights reordered once into the layout the
// primitive asks for, library-managed scratchpad. Only the primitive execution is timed.
void bench_onednn_packed(benchmark::State& state, GemmShape s, DType dtype) {
  using dnnl::memory;
  const memory::data_type dt = dtype == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc src_md({s.m, s.k}, dt, memory::format_tag::ab);
  const memory::desc plain_weights_md({s.k, s.n}, dt, memory::format_tag::ab);
  const memory::desc any_weights_md({s.k, s.n}, dt, memory::format_tag::any);
  const memory::desc dst_md({s.m, s.n}, dt, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_weights_md, dst_md), engine);
  const dnnl::matmul matmul(pd);

  const Tensor x = random_input({s.m, s.k}, dtype, 1);
  const Tensor b = random_input({s.k, s.n}, dtype, 2);
  const Tensor out = Tensor::empty({s.m, s.n}, dtype);
  memory src(src_md, engine, x.raw_data());
  memory plain_weights(plain_weights_md, engine, b.raw_data());
  memory packed_weights(pd.weights_desc(), engine);
  memory dst(dst_md, engine, out.raw_data());
  dnnl::reorder(plain_weights, packed_weights).execute(stream, plain_weights, packed_weights);
  stream.wait();

  for (auto _ : state) {
    matmul.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, packed_weights}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
  set_rate(state, s);
}

const bool registered = [] {
  const std::vector<GemmShape> shapes = {{1024, 3072, 3072}, {4608, 3072, 9216}, {4608, 3072, 3072}, {1536, 3072, 18432}};
  struct Variant {
    const char* name;
    void (*fn)(benchmark::State&, GemmShape, DType);
  };
  const std::vector<Variant> variants = {{"onednn_packed", bench_onednn_packed},
                                         {"matmul", bench_matmul},
                                         {"linear", bench_linear},
                                         {"linear_packed", bench_linear_packed},
                                         {"fp8_linear", bench_fp8_linear}};
  for (const GemmShape& s : shapes) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      for (const Variant& v : variants) {
        const std::string name = std::string(dtype_name(dtype)) + "/" + std::to_string(s.m) + "x" +
                                 std::to_string(s.k) + "x" + std::to_string(s.n) + "/" + v.name;
        benchmark::RegisterBenchmark(name.c_str(), v.fn, s, dtype)->Unit(benchmark::kMillisecond)->UseRealTime();
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace xdit
