// FLUX.2 klein-4B transformer blocks at full width on random bf16 weights: hidden 3072 (24 heads
// × 128), joint_attention_dim 7680, mlp_ratio 3, one double and one single block, a 512×512
// image (32×32 = 1024 image tokens) and 512 text tokens, batch 1.
//
//   OMP_NUM_THREADS=2 build/bin/bench_flux2_transformer
//
// FLOPs per block (both kinds; MODELS.md): S = 1536 tokens, D = 3072,
//   matmuls   2·13·D²·S: double block q,k,v,out (4D²) + SwiGLU FF (6D² in, 3D² out) per stream;
//             single block to_qkv_mlp_proj (3D² + 6D²) + to_out (4D²)
//   attention 4·S²·D: Q·K^T and P·V over all heads.
// The *_gemms, attention and *_elementwise benchmarks split one block's time into its GEMMs (the
// block's own Linears at its row counts), the attention, and everything else (norms, modulation,
// RoPE, concatenation, SwiGLU, gated residuals) run on tensors of the block's shapes. `forward` is
// the whole model call on the slice (conditioning, embedders, both blocks, norm_out, proj_out), so
// a full klein-4B step is about forward + 4 double + 19 single blocks.
// Times are wall clock. When other work loads the machine, the CPU column (the main thread's CPU
// time, close to the wall time of an unloaded run with 2 threads) is the better guide.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/models/flux2/position_ids.h"
#include "xdit/models/flux2/transformer.h"

namespace {

using namespace xdit;

constexpr int64_t kDim = 3072, kHeads = 24, kHeadDim = 128, kMlp = 3 * kDim, kJointDim = 7680;
constexpr int64_t kImageTokens = 1024, kTextTokens = 512, kTokens = kImageTokens + kTextTokens;

const char* kConfig = R"({
  "_class_name": "Flux2Transformer2DModel", "patch_size": 1, "in_channels": 128, "out_channels": null,
  "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 128, "num_attention_heads": 24,
  "joint_attention_dim": 7680, "timestep_guidance_channels": 256, "mlp_ratio": 3.0,
  "axes_dims_rope": [32, 32, 32, 32], "rope_theta": 2000, "eps": 1e-6, "guidance_embeds": false})";

double block_gflop() {
  const double d = kDim, s = kTokens;
  return (2.0 * 13.0 * d * d * s + 4.0 * s * s * d) * 1e-9;
}

struct Klein4BSlice {
  flux2::Transformer model;
  flux2::Conditioning cond;
  ops::RopeTable rope;
  Tensor img, txt, joint;  // block inputs [1, N, D] bf16
  Tensor latents, text;    // model inputs [1, 1024, 128] and [1, 512, 7680] bf16

  Klein4BSlice() {
    const JsonConfig config = JsonConfig::parse(kConfig, "klein-4B slice config");
    const flux2::TransformerConfig c = flux2::TransformerConfig::from_json(config);
    TensorMap weights("random klein-4B slice");
    uint32_t seed = 1;
    auto add = [&](const std::string& name, const Shape& shape) { weights.add(name, bench::random_weight(shape, seed++)); };
    auto add_norm = [&](const std::string& name) { weights.add(name, Tensor::full({kHeadDim}, 1.0f, DType::BF16)); };
    add("time_guidance_embed.timestep_embedder.linear_1.weight", {kDim, c.timestep_guidance_channels});
    add("time_guidance_embed.timestep_embedder.linear_2.weight", {kDim, kDim});
    add("double_stream_modulation_img.linear.weight", {6 * kDim, kDim});
    add("double_stream_modulation_txt.linear.weight", {6 * kDim, kDim});
    add("single_stream_modulation.linear.weight", {3 * kDim, kDim});
    add("x_embedder.weight", {kDim, c.in_channels});
    add("context_embedder.weight", {kDim, kJointDim});
    const std::string d = "transformer_blocks.0.";
    for (const char* name : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                             "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"})
      add(d + name + ".weight", {kDim, kDim});
    for (const char* name : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
      add_norm(d + name + ".weight");
    for (const char* ff : {"ff.", "ff_context."}) {
      add(d + ff + "linear_in.weight", {2 * kMlp, kDim});
      add(d + ff + "linear_out.weight", {kDim, kMlp});
    }
    const std::string s = "single_transformer_blocks.0.attn.";
    add(s + "to_qkv_mlp_proj.weight", {3 * kDim + 2 * kMlp, kDim});
    add(s + "to_out.weight", {kDim, kDim + kMlp});
    add_norm(s + "norm_q.weight");
    add_norm(s + "norm_k.weight");
    add("norm_out.linear.weight", {2 * kDim, kDim});
    add("proj_out.weight", {c.proj_out_channels(), kDim});
    model = flux2::Transformer::load(weights, config, {DType::BF16, false});

    cond = model.condition(Tensor::from_floats(std::vector<float>{0.75f}, {1}), Tensor());
    rope = model.rope(flux2::prepare_text_ids(1, kTextTokens), flux2::prepare_latent_ids(1, {32, 32}));
    img = bench::random_input({1, kImageTokens, kDim}, DType::BF16, 101);
    txt = bench::random_input({1, kTextTokens, kDim}, DType::BF16, 102);
    joint = ops::concat({txt, img}, 1);
    latents = bench::random_input({1, kImageTokens, c.in_channels}, DType::BF16, 103);
    text = bench::random_input({1, kTextTokens, kJointDim}, DType::BF16, 104);
  }
};

const Klein4BSlice& slice() {
  static const Klein4BSlice instance;
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
  const Klein4BSlice& k = slice();
  const Tensor timestep = Tensor::from_floats(std::vector<float>{0.75f}, {1});
  run(
      state,
      [&] { benchmark::DoNotOptimize(k.model.forward(k.latents, k.text, timestep, Tensor(), k.rope).raw_data()); }, 0);
}

void double_block(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::TransformerBlock& block = k.model.transformer_blocks()[0];
  run(
      state,
      [&] {
        auto [txt, img] = block.forward(k.img, k.txt, k.cond.img, k.cond.txt, k.rope);
        benchmark::DoNotOptimize(img.raw_data());
      },
      block_gflop());
}

void single_block(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::SingleTransformerBlock& block = k.model.single_transformer_blocks()[0];
  run(
      state, [&] { benchmark::DoNotOptimize(block.forward(k.joint, k.cond.single, k.rope).raw_data()); },
      block_gflop());
}

// The double block's twelve Linears at their row counts (1024 image, 512 text).
void double_block_gemms(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::TransformerBlock& b = k.model.transformer_blocks()[0];
  const Tensor img_mlp = bench::random_input({1, kImageTokens, kMlp}, DType::BF16, 201);
  const Tensor txt_mlp = bench::random_input({1, kTextTokens, kMlp}, DType::BF16, 202);
  run(
      state,
      [&] {
        for (const Linear* l : {&b.attn.to_q, &b.attn.to_k, &b.attn.to_v, &b.attn.to_out, &b.ff.linear_in})
          benchmark::DoNotOptimize((*l)(k.img).raw_data());
        benchmark::DoNotOptimize(b.ff.linear_out(img_mlp).raw_data());
        for (const Linear* l :
             {&b.attn.add_q_proj, &b.attn.add_k_proj, &b.attn.add_v_proj, &b.attn.to_add_out, &b.ff_context.linear_in})
          benchmark::DoNotOptimize((*l)(k.txt).raw_data());
        benchmark::DoNotOptimize(b.ff_context.linear_out(txt_mlp).raw_data());
      },
      2.0 * 13.0 * kDim * kDim * kTokens * 1e-9);
}

void single_block_gemms(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::SingleTransformerBlock& b = k.model.single_transformer_blocks()[0];
  const Tensor concat = bench::random_input({1, kTokens, kDim + kMlp}, DType::BF16, 203);
  run(
      state,
      [&] {
        benchmark::DoNotOptimize(b.attn.to_qkv_mlp_proj(k.joint).raw_data());
        benchmark::DoNotOptimize(b.attn.to_out(concat).raw_data());
      },
      2.0 * 13.0 * kDim * kDim * kTokens * 1e-9);
}

void block_attention(benchmark::State& state) {
  const Tensor q = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 301);
  const Tensor k = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 302);
  const Tensor v = bench::random_input({1, kTokens, kHeads, kHeadDim}, DType::BF16, 303);
  run(
      state, [&] { benchmark::DoNotOptimize(ops::attention(q, k, v).out.raw_data()); },
      4.0 * kTokens * kTokens * kDim * 1e-9);
}

// The blocks' modulated LayerNorm at batch 1: one layer_norm pass with (1 + scale, shift) as its affine.
Tensor modulated_norm(const Tensor& x, const flux2::ModulationParams& mod) {
  const Tensor weight = ops::add(Tensor::full({1}, 1.0f, DType::F32), mod.scale.reshape({-1}));
  return ops::layer_norm(x, weight, mod.shift.reshape({-1}), 1e-6f);
}

// Everything in a double block but its GEMMs and the attention, on tensors of the block's shapes.
void double_block_elementwise(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::TransformerBlock& b = k.model.transformer_blocks()[0];
  const Tensor img_ff = bench::random_input({1, kImageTokens, 2 * kMlp}, DType::BF16, 401);
  const Tensor txt_ff = bench::random_input({1, kTextTokens, 2 * kMlp}, DType::BF16, 402);
  const float eps = 1e-6f;
  auto heads = [](const Tensor& x) { return x.view({1, x.size(1), kHeads, kHeadDim}); };
  run(
      state,
      [&] {
        for (int sub = 0; sub < 2; ++sub) {  // attention, then feed-forward sub-block
          const Tensor img = modulated_norm(k.img, k.cond.img[sub]);
          const Tensor txt = modulated_norm(k.txt, k.cond.txt[sub]);
          benchmark::DoNotOptimize(ops::gated_residual(k.img, img, k.cond.img[sub].gate).raw_data());
          benchmark::DoNotOptimize(ops::gated_residual(k.txt, txt, k.cond.txt[sub].gate).raw_data());
          if (sub == 0) {
            for (int qk = 0; qk < 2; ++qk) {
              const Tensor joint = ops::concat(
                  {ops::rms_norm(heads(txt), b.attn.norm_added_q, eps), ops::rms_norm(heads(img), b.attn.norm_q, eps)},
                  1);
              benchmark::DoNotOptimize(ops::apply_rope(joint, k.rope, RopeStyle::Interleaved).raw_data());
            }
            benchmark::DoNotOptimize(ops::concat({heads(txt), heads(img)}, 1).raw_data());
          }
        }
        benchmark::DoNotOptimize(ops::swiglu(img_ff).raw_data());
        benchmark::DoNotOptimize(ops::swiglu(txt_ff).raw_data());
      },
      0);
}

void single_block_elementwise(benchmark::State& state) {
  const Klein4BSlice& k = slice();
  const flux2::SingleTransformerBlock& b = k.model.single_transformer_blocks()[0];
  const Tensor proj = bench::random_input({1, kTokens, 3 * kDim + 2 * kMlp}, DType::BF16, 403);
  const Tensor attention = bench::random_input({1, kTokens, kDim}, DType::BF16, 404);
  const float eps = 1e-6f;
  auto heads = [](const Tensor& x) { return x.view({1, x.size(1), kHeads, kHeadDim}); };
  run(
      state,
      [&] {
        benchmark::DoNotOptimize(modulated_norm(k.joint, k.cond.single).raw_data());
        const std::vector<Tensor> parts = proj.split({kDim, kDim, kDim, 2 * kMlp}, -1);
        for (int qk = 0; qk < 2; ++qk)
          benchmark::DoNotOptimize(
              ops::apply_rope(ops::rms_norm(heads(parts[qk]), qk == 0 ? b.attn.norm_q : b.attn.norm_k, eps), k.rope,
                              RopeStyle::Interleaved)
                  .raw_data());
        benchmark::DoNotOptimize(ops::concat({attention, ops::swiglu(parts[3])}, -1).raw_data());
        benchmark::DoNotOptimize(ops::gated_residual(k.joint, k.joint, k.cond.single.gate).raw_data());
      },
      0);
}

}  // namespace

BENCHMARK(forward)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2);
BENCHMARK(double_block)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2);
BENCHMARK(single_block)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2);
BENCHMARK(double_block_gemms)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(single_block_gemms)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(block_attention)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(double_block_elementwise)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(single_block_elementwise)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
