// VAE decode at the real FLUX.2 size (AutoencoderKLFlux2 defaults: block_out_channels
// [128, 256, 512, 512], 2 ResNet layers per level, 32 latent channels) with random weights built
// in memory, f32 and bf16 (first argument 0 / 1):
//   BM_VaeDecode/<dtype>/<pixels>  AutoencoderKL::decode of a [1, 32, pixels/8, pixels/8] latent
//   BM_VaeDecodeBreakdown/<dtype>  the same decode at 512x512 walked op by op, with the time of
//                                  each kind of op reported as a counter (ms per decode);
//                                  upsample_block is Upsample2D (2x2 phase conv + interleave)
// The decodes run one iteration: a 512x512 decode takes seconds. GFLOP/s counts the multiply-adds
// (x2) of the convolutions, the attention and its projections as diffusers computes them (each
// Upsample2D as a 3x3 conv at the upsampled size), so it is an effective rate: Upsample2D::forward
// does 16/36 of that work. The CPU column is the whole process's CPU time: on a busy machine,
// CPU time / threads is about what the wall time would be on an idle one.
//   BM_Upsample2D/<dtype>/<channels>/<size>/<phases>  one Upsample2D at the decoder's shapes, as
//                                  diffusers runs it (phases 0) and as Upsample2D::forward does (1)
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"
#include "xdit/models/vae/autoencoder_kl.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using vae::AutoencoderKLConfig;

const char* const kFlux2VaeConfig = R"({"_class_name": "AutoencoderKLFlux2"})";

// Random weights with every tensor AutoencoderKLFlux2 has, scaled by 1/sqrt(fan_in) so the
// activations keep a sane magnitude through the decoder.
class RandomWeights {
 public:
  explicit RandomWeights(const AutoencoderKLConfig& c) {
    add_encoder(c);
    add_decoder(c);
    conv("quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
    conv("post_quant_conv", c.latent_channels, c.latent_channels, 1);
    const int64_t width = 4 * c.latent_channels;
    map_.add("bn.running_mean", bench::uniform_input({width}, DType::F32, -0.5f, 0.5f));
    map_.add("bn.running_var", bench::uniform_input({width}, DType::F32, 0.5f, 2.0f));
  }
  const TensorMap& map() const { return map_; }

 private:
  void tensor(const std::string& name, const Shape& shape, float scale) {
    map_.add(name, ops::scale(bench::random_input(shape, DType::F32, seed_++), scale));
  }
  void conv(const std::string& name, int64_t out, int64_t in, int64_t kernel) {
    tensor(name + ".weight", {out, in, kernel, kernel}, 1.0f / std::sqrt(static_cast<float>(in * kernel * kernel)));
    tensor(name + ".bias", {out}, 0.01f);
  }
  void norm(const std::string& name, int64_t channels) {
    map_.add(name + ".weight", Tensor::full({channels}, 1.0f, DType::F32));
    map_.add(name + ".bias", Tensor::zeros({channels}, DType::F32));
  }
  void linear(const std::string& name, int64_t channels) {
    tensor(name + ".weight", {channels, channels}, 1.0f / std::sqrt(static_cast<float>(channels)));
    tensor(name + ".bias", {channels}, 0.01f);
  }
  void resnet(const std::string& prefix, int64_t in, int64_t out) {
    norm(prefix + "norm1", in);
    conv(prefix + "conv1", out, in, 3);
    norm(prefix + "norm2", out);
    conv(prefix + "conv2", out, out, 3);
    if (in != out) conv(prefix + "conv_shortcut", out, in, 1);
  }
  void mid_block(const std::string& prefix, int64_t channels) {
    resnet(prefix + "resnets.0.", channels, channels);
    norm(prefix + "attentions.0.group_norm", channels);
    for (const char* proj : {"to_q", "to_k", "to_v", "to_out.0"}) linear(prefix + "attentions.0." + proj, channels);
    resnet(prefix + "resnets.1.", channels, channels);
  }
  void add_encoder(const AutoencoderKLConfig& c) {
    const std::vector<int64_t>& ch = c.block_out_channels;
    conv("encoder.conv_in", ch[0], c.in_channels, 3);
    int64_t in = ch[0];
    for (size_t level = 0; level < ch.size(); ++level) {
      const std::string block = "encoder.down_blocks." + std::to_string(level) + ".";
      for (int64_t i = 0; i < c.layers_per_block; ++i)
        resnet(block + "resnets." + std::to_string(i) + ".", i == 0 ? in : ch[level], ch[level]);
      if (level + 1 < ch.size()) conv(block + "downsamplers.0.conv", ch[level], ch[level], 3);
      in = ch[level];
    }
    mid_block("encoder.mid_block.", ch.back());
    norm("encoder.conv_norm_out", ch.back());
    conv("encoder.conv_out", 2 * c.latent_channels, ch.back(), 3);
  }
  void add_decoder(const AutoencoderKLConfig& c) {
    const std::vector<int64_t> ch(c.decoder_block_out_channels.rbegin(), c.decoder_block_out_channels.rend());
    conv("decoder.conv_in", ch[0], c.latent_channels, 3);
    mid_block("decoder.mid_block.", ch[0]);
    int64_t in = ch[0];
    for (size_t level = 0; level < ch.size(); ++level) {
      const std::string block = "decoder.up_blocks." + std::to_string(level) + ".";
      for (int64_t i = 0; i <= c.layers_per_block; ++i)
        resnet(block + "resnets." + std::to_string(i) + ".", i == 0 ? in : ch[level], ch[level]);
      if (level + 1 < ch.size()) conv(block + "upsamplers.0.conv", ch[level], ch[level], 3);
      in = ch[level];
    }
    norm("decoder.conv_norm_out", ch.back());
    conv("decoder.conv_out", c.out_channels, ch.back(), 3);
  }

  TensorMap map_{"random AutoencoderKLFlux2 weights"};
  uint32_t seed_ = 1;
};

// The multiply-adds of one decode of a [1, C, h, w] latent, times 2.
double decode_gflop(const AutoencoderKLConfig& c, int64_t h, int64_t w) {
  double flop = 0;
  auto conv = [&](int64_t in, int64_t out, int64_t k, int64_t pixels) {
    flop += 2.0 * static_cast<double>(in * out * k * k) * static_cast<double>(pixels);
  };
  const std::vector<int64_t> ch(c.decoder_block_out_channels.rbegin(), c.decoder_block_out_channels.rend());
  int64_t pixels = h * w;
  conv(c.latent_channels, c.latent_channels, 1, pixels);
  conv(c.latent_channels, ch[0], 3, pixels);
  conv(ch[0], ch[0], 3, pixels * 4);  // the mid block's two resnets: 4 convs
  const double positions = static_cast<double>(pixels);
  flop += 2.0 * 4 * positions * static_cast<double>(ch[0] * ch[0]) +
          2.0 * 2 * positions * positions * static_cast<double>(ch[0]);
  int64_t in = ch[0];
  for (size_t level = 0; level < ch.size(); ++level) {
    for (int64_t i = 0; i <= c.layers_per_block; ++i) {
      const int64_t from = i == 0 ? in : ch[level];
      conv(from, ch[level], 3, pixels);
      conv(ch[level], ch[level], 3, pixels);
      if (from != ch[level]) conv(from, ch[level], 1, pixels);
    }
    if (level + 1 < ch.size()) {
      pixels *= 4;
      conv(ch[level], ch[level], 3, pixels);
    }
    in = ch[level];
  }
  conv(ch.back(), c.out_channels, 3, pixels);
  return flop * 1e-9;
}

struct Flux2Vae {
  JsonConfig config = JsonConfig::parse(kFlux2VaeConfig, "bench vae config");
  AutoencoderKLConfig parsed = AutoencoderKLConfig::from_json(config);
  RandomWeights weights{parsed};
};

const Flux2Vae& flux2_vae() {
  static const Flux2Vae vae;
  return vae;
}

void BM_VaeDecode(benchmark::State& state) {
  const DType dtype = bench::dtype_arg(state);
  const Flux2Vae& model = flux2_vae();
  const vae::AutoencoderKL vae = vae::AutoencoderKL::load(model.weights.map(), model.config, dtype);
  const int64_t latent = state.range(1) / 8;
  const Tensor z = bench::random_input({1, 32, latent, latent}, DType::F32, 11);
  for (auto _ : state) benchmark::DoNotOptimize(vae.decode(z));
  bench::set_gflops(state, decode_gflop(model.parsed, latent, latent));
  state.counters["weights_MB"] = static_cast<double>(vae.weight_bytes()) / 1e6;
}
BENCHMARK(BM_VaeDecode)
    ->ArgNames({"bf16", "pixels"})
    ->Args({0, 512})
    ->Args({1, 512})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// Times each op of a decode by kind; the walk mirrors Decoder::forward.
class OpTimer {
 public:
  template <typename Fn>
  Tensor operator()(const std::string& kind, Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    Tensor out = fn();
    ms_[kind] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  const std::map<std::string, double>& ms() const { return ms_; }

 private:
  std::map<std::string, double> ms_;
};

Tensor timed_resnet(OpTimer& time, const vae::ResnetBlock2D& r, const Tensor& x) {
  Tensor h = time("group_norm", [&] { return r.norm1(x); });
  h = time("silu", [&] { return ops::silu(h); });
  h = time("conv3x3", [&] { return r.conv1(h); });
  h = time("group_norm", [&] { return r.norm2(h); });
  h = time("silu", [&] { return ops::silu(h); });
  h = time("conv3x3", [&] { return r.conv2(h); });
  const Tensor skip = r.conv_shortcut ? time("conv1x1", [&] { return (*r.conv_shortcut)(x); }) : x;
  return time("add", [&] { return ops::add(skip, h); });
}

Tensor timed_mid_block(OpTimer& time, const vae::UNetMidBlock2D& m, const Tensor& x) {
  Tensor h = timed_resnet(time, m.resnets[0], x);
  if (m.attention) h = time("attention_block", [&] { return m.attention->forward(h); });
  return timed_resnet(time, m.resnets[1], h);
}

void BM_VaeDecodeBreakdown(benchmark::State& state) {
  const DType dtype = bench::dtype_arg(state);
  const Flux2Vae& model = flux2_vae();
  WeightBinder binder(model.weights.map(), "", BindOptions{dtype});
  binder.ignore("encoder.");
  binder.ignore("quant_conv.");
  binder.ignore("post_quant_conv.");
  binder.ignore("bn.");
  WeightBinder scope = binder.scoped("decoder.");
  vae::Decoder decoder;
  decoder.bind(scope, model.parsed);
  binder.finish();
  decoder.fold_weights();
  const Tensor z = bench::random_input({1, 32, 64, 64}, dtype, 11);

  OpTimer time;
  for (auto _ : state) {
    Tensor h = time("conv3x3", [&] { return decoder.conv_in(z); });
    h = timed_mid_block(time, decoder.mid_block, h);
    for (const vae::UpDecoderBlock2D& block : decoder.up_blocks) {
      for (const vae::ResnetBlock2D& r : block.resnets) h = timed_resnet(time, r, h);
      if (block.upsampler) h = time("upsample_block", [&] { return block.upsampler->forward(h); });
    }
    h = time("group_norm", [&] { return decoder.conv_norm_out(h); });
    h = time("silu", [&] { return ops::silu(h); });
    benchmark::DoNotOptimize(time("conv3x3", [&] { return decoder.conv_out(h); }));
  }
  for (const auto& [kind, ms] : time.ms()) state.counters[kind + "_ms"] = ms / static_cast<double>(state.iterations());
}
BENCHMARK(BM_VaeDecodeBreakdown)
    ->ArgName("bf16")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Upsample2D at the FLUX.2 decoder's three shapes: nearest x2 then the 3x3 conv (phases 0), or
// the 2x2 phase conv then the interleave (phases 1).
void BM_Upsample2D(benchmark::State& state) {
  const DType dtype = bench::dtype_arg(state);
  const int64_t channels = state.range(1), size = state.range(2);
  vae::Upsample2D up;
  up.conv.weight = ops::scale(bench::random_input({channels, channels, 3, 3}, dtype, 1),
                              1.0f / std::sqrt(9.0f * static_cast<float>(channels)));
  up.conv.bias = bench::random_input({channels}, dtype, 2);
  up.conv.padding = 1;
  up.fold_weights();
  const Tensor x = bench::random_input({1, channels, size, size}, dtype, 3);
  const bool phases = state.range(3) != 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(phases ? up.forward(x) : up.conv(ops::upsample_nearest(x, {2, 2})));
  }
  bench::set_gflops(state,
                    2.0 * 9 * static_cast<double>(channels * channels) * static_cast<double>(4 * size * size) * 1e-9);
}
BENCHMARK(BM_Upsample2D)
    ->ArgNames({"bf16", "channels", "size", "phases"})
    ->ArgsProduct({{0, 1}, {512}, {64}, {0, 1}})
    ->Args({1, 512, 128, 0})
    ->Args({1, 512, 128, 1})
    ->Args({1, 256, 256, 0})
    ->Args({1, 256, 256, 1})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

}  // namespace
}  // namespace xdit
