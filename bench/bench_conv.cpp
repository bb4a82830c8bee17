// Convolution throughput at VAE decoder shapes, f32 and bf16:
//   conv2d          ops::conv2d on an NCHW tensor (oneDNN picks the layout; reorders in and out)
//   conv2d_nhwc     ops::conv2d on a channels-last tensor (NHWC buffer viewed as NCHW): the
//                   layout oneDNN picks, so no activation reorders
//   onednn_blocked  a direct oneDNN convolution in the layouts it picks, data already in them:
//                   the bound ops::conv2d's reorders are measured against
//   onednn_nchw     a direct oneDNN convolution forced to plain NCHW / OIHW: whether keeping
//                   the plain layout (no reorders) would be faster
// plus causal_conv3d at a Wan VAE decoder shape. GFLOP/s counts 2*C*O*kh*kw per output pixel.
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using bench::random_input;

struct ConvShape {
  int64_t channels, out_channels, size, kernel;
};

void set_rate(benchmark::State& state, const ConvShape& s) {
  bench::set_gflops(state, 2.0 * static_cast<double>(s.channels * s.out_channels * s.kernel * s.kernel) *
                               static_cast<double>(s.size * s.size) * 1e-9);
}

Conv2dParams same_padding(const ConvShape& s) { return {{1, 1}, {s.kernel / 2, s.kernel / 2}, {1, 1}, 1}; }

void bench_conv2d(benchmark::State& state, ConvShape s, DType dtype) {
  const Tensor x = random_input({1, s.channels, s.size, s.size}, dtype, 1);
  const Tensor w = random_input({s.out_channels, s.channels, s.kernel, s.kernel}, dtype, 2);
  const Tensor bias = random_input({s.out_channels}, DType::F32, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, bias, same_padding(s)));
  set_rate(state, s);
}

void bench_conv2d_nhwc(benchmark::State& state, ConvShape s, DType dtype) {
  const Tensor x = random_input({1, s.size, s.size, s.channels}, dtype, 1).permute({0, 3, 1, 2});
  const Tensor w = random_input({s.out_channels, s.channels, s.kernel, s.kernel}, dtype, 2);
  const Tensor bias = random_input({s.out_channels}, DType::F32, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, bias, same_padding(s)));
  set_rate(state, s);
}

// A oneDNN convolution by hand; `plain` forces NCHW / OIHW, otherwise the layouts are oneDNN's
// choice and the inputs are reordered into them before timing.
void bench_onednn(benchmark::State& state, ConvShape s, DType dtype, bool plain) {
  using dnnl::memory;
  const memory::data_type dt = dtype == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::format_tag act = plain ? memory::format_tag::nchw : memory::format_tag::any;
  const memory::format_tag wei = plain ? memory::format_tag::oihw : memory::format_tag::any;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::dims src_dims = {1, s.channels, s.size, s.size};
  const memory::dims wei_dims = {s.out_channels, s.channels, s.kernel, s.kernel};
  const memory::dims dst_dims = {1, s.out_channels, s.size, s.size};
  const memory::dims pad = {s.kernel / 2, s.kernel / 2};
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, memory::desc(src_dims, dt, act),
      memory::desc(wei_dims, dt, wei), memory::desc({s.out_channels}, memory::data_type::f32, memory::format_tag::x),
      memory::desc(dst_dims, dt, act), {1, 1}, {0, 0}, pad, pad);
  const dnnl::convolution_forward::primitive_desc pd(desc, engine);
  const dnnl::convolution_forward conv(pd);

  const Tensor x = random_input({1, s.channels, s.size, s.size}, dtype, 1);
  const Tensor w = random_input({s.out_channels, s.channels, s.kernel, s.kernel}, dtype, 2);
  const Tensor bias = random_input({s.out_channels}, DType::F32, 3);
  memory user_src({src_dims, dt, memory::format_tag::nchw}, engine, x.raw_data());
  memory user_wei({wei_dims, dt, memory::format_tag::oihw}, engine, w.raw_data());
  memory src(pd.src_desc(), engine), weights(pd.weights_desc(), engine), dst(pd.dst_desc(), engine);
  memory bias_memory(pd.bias_desc(), engine, bias.raw_data());
  dnnl::reorder(user_src, src).execute(stream, user_src, src);
  dnnl::reorder(user_wei, weights).execute(stream, user_wei, weights);
  stream.wait();
  for (auto _ : state) {
    conv.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_BIAS, bias_memory},
                          {DNNL_ARG_DST, dst}});
    stream.wait();
  }
  state.SetLabel(pd.impl_info_str());
  set_rate(state, s);
}

void bench_onednn_blocked(benchmark::State& state, ConvShape s, DType dtype) { bench_onednn(state, s, dtype, false); }
void bench_onednn_nchw(benchmark::State& state, ConvShape s, DType dtype) { bench_onednn(state, s, dtype, true); }

// Wan 2.x VAE decoder: a 3x3x3 causal conv over 384 channels with two cached frames.
void BM_CausalConv3d(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::F32 : DType::BF16;
  const int64_t c = 384, t = 2, h = 60, w = 52;
  const Tensor x = random_input({1, c, t, h, w}, dtype, 1);
  const Tensor cache = random_input({1, c, 2, h, w}, dtype, 2);
  const Tensor weight = random_input({c, c, 3, 3, 3}, dtype, 3);
  const Tensor bias = random_input({c}, DType::F32, 4);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ops::causal_conv3d(x, weight, bias, cache, {{1, 1, 1}, {1, 1, 1}}));
  }
  bench::set_gflops(state, 2.0 * static_cast<double>(c * c * 27) * static_cast<double>(t * h * w) * 1e-9);
}
BENCHMARK(BM_CausalConv3d)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

const bool registered = [] {
  const std::vector<ConvShape> shapes = {{128, 128, 512, 3}, {512, 512, 64, 3}, {512, 512, 128, 3}, {512, 256, 128, 1}};
  struct Variant {
    const char* name;
    void (*fn)(benchmark::State&, ConvShape, DType);
  };
  const std::vector<Variant> variants = {
      {"onednn_blocked", bench_onednn_blocked},
      {"conv2d", bench_conv2d},
      {"conv2d_nhwc", bench_conv2d_nhwc},
      {"onednn_nchw", bench_onednn_nchw}};
  for (const ConvShape& s : shapes) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      for (const Variant& v : variants) {
        const std::string name = std::string(dtype_name(dtype)) + "/c" + std::to_string(s.channels) + "_o" +
                                 std::to_string(s.out_channels) + "_" + std::to_string(s.size) + "x" +
                                 std::to_string(s.size) + "_k" + std::to_string(s.kernel) + "/" + v.name;
        benchmark::RegisterBenchmark(name.c_str(), v.fn, s, dtype)->Unit(benchmark::kMillisecond)->UseRealTime();
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace xdit
