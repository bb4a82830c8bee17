// The decoder-LM text encoder at Qwen3-4B width (hidden 2560, 32 heads of 128, 8 kv heads, FFN
// 9728) with random bf16 weights and 4 layers: one 512-token prompt through hidden states 2, 3, 4
// (a quarter of the time is one layer; FLUX.2 klein-4B runs 27). The vocabulary is cut to
// 4096 rows: the embedding lookup does not depend on it.
//   OMP_NUM_THREADS=2 build/bin/bench_text_encoder
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "bench_util.h"
#include "xdit/io/safetensors.h"
#include "xdit/ops/ops.h"
#include "xdit/text/decoder_lm.h"

namespace {

using xdit::DType;
using xdit::Tensor;

constexpr int kLayers = 4;
constexpr int64_t kSeq = 512;

xdit::DecoderLMConfig qwen3_4b() {
  xdit::DecoderLMConfig c;
  c.hidden_size = 2560;
  c.num_hidden_layers = 36;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 9728;
  c.vocab_size = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.qk_norm = true;
  return c;
}

// Random bf16 weights for layers 0..kLayers-1 under Qwen3ForCausalLM's names; projections scaled
// like a trained model's (about 1/sqrt(fan_in)), norms near 1.
const xdit::TensorMap& weights() {
  static const xdit::TensorMap map = [] {
    const xdit::DecoderLMConfig c = qwen3_4b();
    xdit::TensorMap m("random Qwen3-4B-width weights");
    uint32_t seed = 1;
    auto add = [&](const std::string& name, const xdit::Shape& shape, float scale, float offset) {
      Tensor t = xdit::ops::scale(xdit::bench::random_input(shape, DType::F32, seed++), scale);
      if (offset != 0.0f) t = xdit::ops::add(t, Tensor::full({1}, offset, DType::F32));
      m.add(name, t.to(DType::BF16));
    };
    const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
    const int64_t ff = c.intermediate_size;
    add("model.embed_tokens.weight", {c.vocab_size, h}, 1.0f, 0.0f);
    for (int i = 0; i < kLayers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {h}, 0.1f, 1.0f);
      add(p + "post_attention_layernorm.weight", {h}, 0.1f, 1.0f);
      add(p + "self_attn.q_norm.weight", {c.head_dim}, 0.1f, 1.0f);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, 0.1f, 1.0f);
      add(p + "self_attn.q_proj.weight", {q, h}, 0.02f, 0.0f);
      add(p + "self_attn.k_proj.weight", {kv, h}, 0.02f, 0.0f);
      add(p + "self_attn.v_proj.weight", {kv, h}, 0.02f, 0.0f);
      add(p + "self_attn.o_proj.weight", {h, q}, 0.02f, 0.0f);
      add(p + "mlp.gate_proj.weight", {ff, h}, 0.02f, 0.0f);
      add(p + "mlp.up_proj.weight", {ff, h}, 0.02f, 0.0f);
      add(p + "mlp.down_proj.weight", {h, ff}, 0.01f, 0.0f);
    }
    return m;
  }();
  return map;
}

// FLOPs of one layer at S tokens: the seven projections, plus the visible half of causal attention.
double layer_gflop() {
  const xdit::DecoderLMConfig c = qwen3_4b();
  const double s = kSeq, h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(c.num_attention_heads) * d, kv = static_cast<double>(c.num_key_value_heads) * d;
  const double projections = 2.0 * s * (h * q * 2 + h * kv * 2 + 3 * h * static_cast<double>(c.intermediate_size));
  const double attention = 4.0 * s * s * q * 0.5;
  return (projections + attention) * 1e-9;
}

void encode_prompt(benchmark::State& state, DType dtype, bool fp8) {
  const xdit::DecoderLM lm = xdit::DecoderLM::load(weights(), qwen3_4b(), {"model.", {}}, kLayers, {dtype, fp8});
  std::vector<int64_t> ids(kSeq);
  for (int64_t s = 0; s < kSeq; ++s) ids[static_cast<size_t>(s)] = (s * 977) % qwen3_4b().vocab_size;
  const Tensor input_ids = Tensor::from_ints(ids, {1, kSeq});
  const Tensor mask = Tensor::full({1, kSeq}, 1.0f, DType::I64);
  for (auto _ : state) {
    const Tensor out = lm.hidden_states_stacked(input_ids, mask, {2, 3, kLayers});
    benchmark::DoNotOptimize(out.raw_data());
  }
  xdit::bench::set_gflops(state, kLayers * layer_gflop());
}

void text_encoder_bf16(benchmark::State& state) { encode_prompt(state, DType::BF16, false); }
void text_encoder_bf16_fp8(benchmark::State& state) { encode_prompt(state, DType::BF16, true); }

BENCHMARK(text_encoder_bf16)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(text_encoder_bf16_fp8)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
