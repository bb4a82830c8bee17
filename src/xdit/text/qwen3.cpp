#include "xdit/text/qwen3.h"

#include <algorithm>
#include <string>

#include "xdit/core/error.h"
#include "xdit/io/weights.h"

namespace xdit {

Qwen3Config Qwen3Config::from_json(const JsonConfig& config) {
  Qwen3Config c;
  config.read("hidden_size", c.hidden_size);
  config.read("num_hidden_layers", c.num_hidden_layers);
  config.read("num_attention_heads", c.num_attention_heads);
  config.read("intermediate_size", c.intermediate_size);
  config.read("vocab_size", c.vocab_size);
  config.read_optional("rms_norm_eps", c.rms_norm_eps);
  c.num_key_value_heads = config.get_int("num_key_value_heads", c.num_attention_heads);
  XDIT_CHECK(c.num_attention_heads > 0, config.label(), ": num_attention_heads must be > 0, got ",
             c.num_attention_heads);
  c.head_dim = config.get_int("head_dim", c.hidden_size / c.num_attention_heads);
  XDIT_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, config.label(),
             ": num_attention_heads ", c.num_attention_heads, " is not a multiple of num_key_value_heads ",
             c.num_key_value_heads);

  // transformers 5 moved rope_theta into rope_parameters; older configs keep it at the top level.
  if (config.has("rope_parameters")) {
    const JsonConfig rope = config.get_object("rope_parameters");
    const std::string type = rope.get_string("rope_type", "default");
    if (type != "default") rope.fail_field("rope_type", "is \"" + type + "\"; only \"default\" RoPE is supported");
    rope.read("rope_theta", c.rope_theta);
  } else {
    config.read_optional("rope_theta", c.rope_theta);
    if (config.has("rope_scaling")) config.fail_field("rope_scaling", "is set; only unscaled RoPE is supported");
  }
  if (config.get_bool("attention_bias", false)) config.fail_field("attention_bias", "is true; not supported");
  if (config.get_bool("use_sliding_window", false))
    config.fail_field("use_sliding_window", "is true; sliding-window attention is not supported");
  return c;
}

Qwen3Encoder Qwen3Encoder::load(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                                DType compute_dtype) {
  XDIT_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16,
             "Qwen3Encoder: compute dtype must be f32 or bf16, got ", dtype_name(compute_dtype));
  Qwen3Encoder enc;
  enc.config_ = Qwen3Config::from_json(config);
  enc.compute_dtype_ = compute_dtype;
  const Qwen3Config& c = enc.config_;
  XDIT_CHECK(deepest_tap >= 0 && deepest_tap <= c.num_hidden_layers, "Qwen3Encoder: hidden state ", deepest_tap,
             " does not exist (", config.label(), " has ", c.num_hidden_layers, " layers)");

  const DTypeSet stored = {DType::F32, DType::BF16, DType::F16};
  const int64_t h = c.hidden_size, d = c.head_dim, ff = c.intermediate_size;
  WeightBinder root(weights, "", BindOptions{compute_dtype});
  WeightBinder model = root.scoped("model.");
  model.declare("embed_tokens.weight", {c.vocab_size, h}, &enc.embed_tokens_, stored);

  enc.layers_.resize(static_cast<size_t>(deepest_tap));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    if (i >= deepest_tap) {
      model.ignore(prefix);
      continue;
    }
    Layer& l = enc.layers_[static_cast<size_t>(i)];
    WeightBinder b = model.scoped(prefix);
    b.declare("input_layernorm.weight", {h}, &l.input_norm, stored);
    b.declare("self_attn.q_proj.weight", {c.num_attention_heads * d, h}, &l.q_proj, stored);
    b.declare("self_attn.k_proj.weight", {c.num_key_value_heads * d, h}, &l.k_proj, stored);
    b.declare("self_attn.v_proj.weight", {c.num_key_value_heads * d, h}, &l.v_proj, stored);
    b.declare("self_attn.o_proj.weight", {h, c.num_attention_heads * d}, &l.o_proj, stored);
    b.declare("self_attn.q_norm.weight", {d}, &l.q_norm, stored);
    b.declare("self_attn.k_norm.weight", {d}, &l.k_norm, stored);
    b.declare("post_attention_layernorm.weight", {h}, &l.post_attention_norm, stored);
    b.declare("mlp.gate_proj.weight", {ff, h}, &l.gate_proj, stored);
    b.declare("mlp.up_proj.weight", {ff, h}, &l.up_proj, stored);
    b.declare("mlp.down_proj.weight", {h, ff}, &l.down_proj, stored);
  }
  if (deepest_tap == c.num_hidden_layers) {
    model.declare("norm.weight", {h}, &enc.final_norm_, stored);
  } else {
    model.ignore("norm.");
  }
  root.ignore("lm_head.");  // tied to embed_tokens in klein's checkpoints; absent then
  root.finish();
  return enc;
}

Tensor Qwen3Encoder::embed(const Tensor& ids) const {
  const Tensor flat = ids.to(DType::I64).contiguous();
  const int64_t batch = ids.size(0), seq = ids.size(1);
  Tensor out = Tensor::empty({batch, seq, config_.hidden_size}, compute_dtype_, embed_tokens_.device());
  const int64_t* id = flat.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t token = id[b * seq + s];
      XDIT_CHECK(token >= 0 && token < config_.vocab_size, "Qwen3Encoder: token id ", token, " at [", b, ", ", s,
                 "] is outside the vocabulary of ", config_.vocab_size);
      out.select(0, b).select(0, s).copy_from(embed_tokens_.select(0, token));
    }
  }
  return out;
}

Tensor Qwen3Encoder::run_layer(const Layer& l, const Tensor& x, const ops::RopeTable& rope, const Tensor& mask) const {
  const Qwen3Config& c = config_;
  const int64_t batch = x.size(0), seq = x.size(1);
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Attention: per-head RMSNorm of q and k (Qwen3's addition to Qwen2) before RoPE.
  const Tensor a = ops::rms_norm(x, l.input_norm, eps);
  auto heads = [&](const Tensor& w, const Tensor& norm, int64_t n) {
    const Tensor t = ops::linear(a, w).view({batch, seq, n, c.head_dim});
    return ops::apply_rope(ops::rms_norm(t, norm, eps), rope, RopeStyle::RotateHalf);
  };
  const Tensor q = heads(l.q_proj, l.q_norm, c.num_attention_heads);
  const Tensor k = heads(l.k_proj, l.k_norm, c.num_key_value_heads);
  const Tensor v = ops::linear(a, l.v_proj).view({batch, seq, c.num_key_value_heads, c.head_dim});
  // transformers combines the causal mask with the padding mask; the kernel takes grouped kv heads as they are.
  AttentionParams params;
  params.causal = true;
  params.key_padding_mask = mask;
  const Tensor attn = ops::attention(q, k, v, params).out.view({batch, seq, c.num_attention_heads * c.head_dim});
  const Tensor h = ops::add(x, ops::linear(attn, l.o_proj));

  // MLP: down(silu(gate(x)) * up(x)).
  const Tensor m = ops::rms_norm(h, l.post_attention_norm, eps);
  const Tensor act = ops::mul(ops::silu(ops::linear(m, l.gate_proj)), ops::linear(m, l.up_proj));
  return ops::add(h, ops::linear(act, l.down_proj));
}

Tensor Qwen3Encoder::hidden_states_stacked(const Tensor& ids, const Tensor& mask, const std::vector<int>& taps) const {
  XDIT_CHECK(ids.dim() == 2 && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
             "Qwen3Encoder: ids must be [B, S] i64 or i32, got ", dtype_name(ids.dtype()), " ",
             shape_str(ids.shape()));
  XDIT_CHECK(mask.shape() == ids.shape() && (mask.dtype() == DType::I64 || mask.dtype() == DType::I32),
             "Qwen3Encoder: mask must be i64 or i32 of the ids' shape ", shape_str(ids.shape()), ", got ",
             dtype_name(mask.dtype()), " ", shape_str(mask.shape()));
  XDIT_CHECK(!taps.empty(), "Qwen3Encoder: no hidden states requested");
  const int deepest = *std::max_element(taps.begin(), taps.end());
  for (int t : taps) {
    XDIT_CHECK(t >= 0 && t <= static_cast<int>(layers_.size()), "Qwen3Encoder: hidden state ", t,
               " was not loaded (loaded up to ", layers_.size(), ")");
  }

  // Right padding: transformers' default position_ids 0..S-1 are also the tokens' true positions.
  const int64_t seq = ids.size(1);
  std::vector<int64_t> positions(static_cast<size_t>(seq));
  for (int64_t s = 0; s < seq; ++s) positions[static_cast<size_t>(s)] = s;
  const ops::RopeTable rope =
      ops::rope_table(Tensor::from_ints(positions, {seq, 1}), {config_.head_dim}, config_.rope_theta);
  const Tensor key_mask = mask.to(DType::I32).contiguous();

  // Keeps only the tapped states; a tap may repeat.
  std::vector<Tensor> picked(taps.size());
  auto keep = [&](int index, const Tensor& state) {
    for (size_t j = 0; j < taps.size(); ++j)
      if (taps[j] == index) picked[j] = state;
  };
  Tensor x = embed(ids);
  keep(0, x);
  for (int i = 0; i < deepest; ++i) {
    x = run_layer(layers_[static_cast<size_t>(i)], x, rope, key_mask);
    // transformers replaces the last hidden state with the final-normed output.
    keep(i + 1, i + 1 == config_.num_hidden_layers
                    ? ops::rms_norm(x, final_norm_, static_cast<float>(config_.rms_norm_eps))
                    : x);
  }
  return ops::concat(picked, 2);
}

}  // namespace xdit
