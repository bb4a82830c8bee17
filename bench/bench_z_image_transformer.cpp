// Z-Image transformer blocks at full width on random bf16 weights: dim 3840 (30 heads × 128), SwiGLU width
// int(3840 / 3 · 8) = 10240, cap_feat_dim 2560, with the depth cut to one noise refiner, one context refiner and two
// main layers; a 512×512 image (64×64 latent, patch 2: 1024 image tokens) and a 100-token caption (padded to 128),
// batch 1, so the main layers run S = 1024 + 128 = 1152 tokens.
//
//   OMP_NUM_THREADS=2 build/bin/bench_z_image_transformer
//
// FLOPs per main block: S = 1152, D = 3840, H = 10240,
//   matmuls   2·S·(4·D² + 3·D·H): to_q, to_k, to_v, to_out.0, and the SwiGLU w1, w3 (D -> H) and w2 (H -> D)
//   attention 4·S²·D: Q·K^T and P·V over all heads.
// The main_block_gemms, main_block_attention and main_block_elementwise benchmarks split one main block's time into its
// seven Linears, the attention, and everything else (the sandwich RMSNorms with the folded 1 + scale, q/k RMSNorm,
// RoPE, SiLU·mul, tanh-gated residuals) on tensors of the block's shapes. `forward` is the whole model call on the
// slice (t embedding, patchify, embedders, both refiners, both main layers, final layer, unpatchify), so a full Z-Image
// step is about forward + 28 main blocks + 1 noise refiner + 1 context refiner.
// Times are wall clock. When other work loads the machine, the CPU column (the main thread's CPU time, close to the
// wall time of an unloaded run with 2 threads) is the better guide.
#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/models/z_image/transformer.h"

namespace {

using namespace xdit;

constexpr int64_t kDim = 3840, kHeads = 30, kHeadDim = 128, kHidden = 10240, kCapDim = 2560, kAdaln = 256;
constexpr int64_t kLatent = 64, kGrid = kLatent / 2, kImageTokens = kGrid * kGrid;
constexpr int64_t kCaptionTokens = 100, kPaddedCaption = 128, kTokens = kImageTokens + kPaddedCaption;

const char* kConfig = R"({
  "_class_name": "ZImageTransformer2DModel", "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16,
  "dim": 3840, "n_layers": 2, "n_refiner_layers": 1, "n_heads": 30, "n_kv_heads": 30, "norm_eps": 1e-5,
  "qk_norm": true, "cap_feat_dim": 2560, "siglip_feat_dim": null, "rope_theta": 256.0, "t_scale": 1000.0,
  "axes_dims": [32, 48, 48], "axes_lens": [1024, 512, 512]})";

double gemm_gflop() { return 2.0 * kTokens * (4.0 * kDim * kDim + 3.0 * kDim * kHidden) * 1e-9; }
double attention_gflop() { return 4.0 * kTokens * kTokens * kDim * 1e-9; }

struct ZImageSlice {
  z_image::Transformer model;
  Tensor t;
  Tensor adaln_input;                   // [1, 256]
  z_image::BlockModulation modulation;  // main layer 0
  z_image::SequenceLayout layout;       // the unified [image; caption] sequence
  Tensor unified;                       // main block input [1, 1152, D] bf16
  Tensor latent, caption;               // model inputs [16, 1, 64, 64] and [100, 2560] bf16

  ZImageSlice() {
    const JsonConfig config = JsonConfig::parse(kConfig, "Z-Image slice config");
    TensorMap weights("random Z-Image slice");
    uint32_t seed = 1;
    auto add = [&](const std::string& name, const Shape& shape) { weights.add(name, bench::random_weight(shape, seed++)); };
    auto add_ones = [&](const std::string& name, const Shape& shape) {
      weights.add(name, Tensor::full(shape, 1.0f, DType::BF16));
    };
    auto add_linear = [&](const std::string& name, int64_t out, int64_t in) {
      add(name + ".weight", {out, in});
      weights.add(name + ".bias", Tensor::zeros({out}, DType::BF16));
    };
    add_linear("t_embedder.mlp.0", 1024, 256);
    add_linear("t_embedder.mlp.2", kAdaln, 1024);
    add_ones("cap_embedder.0.weight", {kCapDim});
    add_linear("cap_embedder.1", kDim, kCapDim);
    add_linear("all_x_embedder.2-1", kDim, 64);
    add("x_pad_token", {1, kDim});
    add("cap_pad_token", {1, kDim});
    auto add_block = [&](const std::string& prefix, bool modulated) {
      for (const char* name : {"attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0"})
        add(prefix + name + ".weight", {kDim, kDim});
      add_ones(prefix + "attention.norm_q.weight", {kHeadDim});
      add_ones(prefix + "attention.norm_k.weight", {kHeadDim});
      add(prefix + "feed_forward.w1.weight", {kHidden, kDim});
      add(prefix + "feed_forward.w2.weight", {kDim, kHidden});
      add(prefix + "feed_forward.w3.weight", {kHidden, kDim});
      for (const char* norm : {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"})
        add_ones(prefix + norm + ".weight", {kDim});
      if (modulated) add_linear(prefix + "adaLN_modulation.0", 4 * kDim, kAdaln);
    };
    add_block("noise_refiner.0.", true);
    add_block("context_refiner.0.", false);
    add_block("layers.0.", true);
    add_block("layers.1.", true);
    add_linear("all_final_layer.2-1.adaLN_modulation.1", kDim, kAdaln);
    add_linear("all_final_layer.2-1.linear", 64, kDim);
    model = z_image::Transformer::load(weights, config, {DType::BF16, false});

    t = Tensor::from_floats(std::vector<float>{0.25f}, {1});
    adaln_input = model.t_embed(t);
    modulation = model.layers()[0].modulate(adaln_input);
    std::vector<std::array<int64_t, 3>> positions;
    for (int64_t h = 0; h < kGrid; ++h)
      for (int64_t w = 0; w < kGrid; ++w) positions.push_back({kPaddedCaption + 1, h, w});
    for (int64_t j = 0; j < kPaddedCaption; ++j) positions.push_back({1 + j, 0, 0});
    layout = model.layout({positions});
    unified = bench::random_input({1, kTokens, kDim}, DType::BF16, 101);
    latent = bench::random_input({16, 1, kLatent, kLatent}, DType::BF16, 102);
    caption = bench::random_input({kCaptionTokens, kCapDim}, DType::BF16, 103);
  }
};

const ZImageSlice& slice() {
  static const ZImageSlice instance;
  return instance;
}

// Runs `fn` once before timing (oneDNN builds its kernels on first use), then reports ms per call.
template <typename Fn>
void run(benchmark::State& state, Fn fn, double gflop) {
  fn();
  for (auto _ : state) fn();
  if (gflop > 0) bench::set_gflops(state, gflop);
}

void forward(benchmark::State& state) {
  const ZImageSlice& z = slice();
  run(
      state, [&] { benchmark::DoNotOptimize(z.model.forward({z.latent}, z.t, {z.caption}).front().raw_data()); }, 0);
}

void main_block(benchmark::State& state) {
  const ZImageSlice& z = slice();
  const z_image::TransformerBlock& block = z.model.layers()[0];
  run(
      state, [&] { benchmark::DoNotOptimize(block.forward(z.unified, z.layout, &z.modulation).raw_data()); },
      gemm_gflop() + attention_gflop());
}

// The main block's seven Linears at S = 1152 rows.
void main_block_gemms(benchmark::State& state) {
  const ZImageSlice& z = slice();
  const z_image::TransformerBlock& b = z.model.layers()[0];
  const Tensor hidden = bench::random_input({1, kTokens, kHidden}, DType::BF16, 201);
  run(
      state,
      [&] {
        for (const Linear* l : {&b.attention.to_q, &b.attention.to_k, &b.attention.to_v, &b.attention.to_out,
                                &b.feed_forward.w1, &b.feed_forward.w3})
          benchmark::DoNotOptimize((*l)(z.unified).raw_data());
        benchmark::DoNotOptimize(b.feed_forward.w2(hidden).raw_data());
      },
      gemm_gflop());
}

void main_block_attention(benchmark::State& state) {
  const Tensor q = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 301);
  const Tensor k = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 302);
  const Tensor v = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 303);
  run(
      state, [&] { benchmark::DoNotOptimize(ops::attention(q, k, v).out.raw_data()); }, attention_gflop());
}

// Everything in a main block but its GEMMs and the attention, on tensors of the block's shapes, as
// TransformerBlock::forward runs it at batch 1.
void main_block_elementwise(benchmark::State& state) {
  const ZImageSlice& z = slice();
  const z_image::TransformerBlock& b = z.model.layers()[0];
  const z_image::BlockModulation& mod = z.modulation;
  const Tensor gate_in = bench::random_input({1, kTokens, kHidden}, DType::BF16, 401);
  const Tensor value_in = bench::random_input({1, kTokens, kHidden}, DType::BF16, 402);
  const float eps = 1e-5f;
  auto heads = [](const Tensor& x) { return x.view({1, kTokens, kHeads, kHeadDim}); };
  auto folded = [](const Tensor& weight, const Tensor& scale) {
    return ops::mul(weight.to(DType::F32), scale.reshape({-1}).to(DType::F32));
  };
  run(
      state,
      [&] {
        benchmark::DoNotOptimize(ops::rms_norm(z.unified, folded(b.attention_norm1, mod.scale_msa), eps).raw_data());
        for (const Tensor* norm : {&b.attention.norm_q, &b.attention.norm_k})
          benchmark::DoNotOptimize(ops::apply_rope(ops::rms_norm(heads(z.unified), *norm, eps), z.layout.rope.front(),
                                                   RopeStyle::Interleaved)
                                       .raw_data());
        const Tensor h = ops::gated_residual(z.unified, ops::rms_norm(z.unified, b.attention_norm2, eps), mod.gate_msa);
        benchmark::DoNotOptimize(ops::rms_norm(h, folded(b.ffn_norm1, mod.scale_mlp), eps).raw_data());
        benchmark::DoNotOptimize(ops::mul(ops::silu(gate_in), value_in).raw_data());
        benchmark::DoNotOptimize(
            ops::gated_residual(h, ops::rms_norm(z.unified, b.ffn_norm2, eps), mod.gate_mlp).raw_data());
      },
      0);
}

}  // namespace

BENCHMARK(forward)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
BENCHMARK(main_block)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(main_block_gemms)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(main_block_attention)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(main_block_elementwise)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
