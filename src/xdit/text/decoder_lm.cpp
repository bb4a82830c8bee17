#include "xdit/text/decoder_lm.h"

#include <algorithm>
#include <string>

#include "xdit/core/error.h"

namespace xdit {
namespace {

// Stored dtypes of the norms and embeddings (converted to the compute dtype where they differ).
constexpr DTypeSet kStored = {DType::F32, DType::BF16, DType::F16};

}  // namespace

DecoderLMConfig DecoderLMConfig::from_json(const JsonConfig& config, bool qk_norm) {
  DecoderLMConfig c;
  c.qk_norm = qk_norm;
  config.read("hidden_size", c.hidden_size);
  config.read("num_hidden_layers", c.num_hidden_layers);
  config.read("num_attention_heads", c.num_attention_heads);
  config.read("intermediate_size", c.intermediate_size);
  config.read("vocab_size", c.vocab_size);
  config.read_optional("rms_norm_eps", c.rms_norm_eps);
  for (const char* field :
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}) {
    if (config.get_int(field) <= 0)
      config.fail_field(field, "must be > 0, got " + std::to_string(config.get_int(field)));
  }
  c.num_key_value_heads = config.get_int("num_key_value_heads", c.num_attention_heads);
  c.head_dim = config.get_int("head_dim", c.hidden_size / c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    config.fail_field("num_key_value_heads", "is " + std::to_string(c.num_key_value_heads) + "; num_attention_heads " +
                                                 std::to_string(c.num_attention_heads) + " must be a multiple of it");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    config.fail_field("head_dim", "must be even and > 0 for RoPE, got " + std::to_string(c.head_dim));
  if (!(c.rms_norm_eps > 0)) config.fail_field("rms_norm_eps", "must be > 0");

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
  if (!(c.rope_theta > 0)) config.fail_field("rope_theta", "must be > 0");
  const std::string act = config.get_string("hidden_act", "silu");
  if (act != "silu") config.fail_field("hidden_act", "is " + quote(act) + "; only \"silu\" is supported");
  if (config.get_bool("attention_bias", false)) config.fail_field("attention_bias", "is true; not supported");
  if (config.get_bool("use_sliding_window", false))
    config.fail_field("use_sliding_window", "is true; sliding-window attention is not supported");
  return c;
}

void DecoderLayer::bind(WeightBinder& b, const DecoderLMConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, ff = c.intermediate_size;
  b.declare("input_layernorm.weight", {h}, &input_layernorm, kStored);
  self_attn.q_proj.bind(b, "self_attn.q_proj", c.num_attention_heads * d, h, false);
  self_attn.k_proj.bind(b, "self_attn.k_proj", c.num_key_value_heads * d, h, false);
  self_attn.v_proj.bind(b, "self_attn.v_proj", c.num_key_value_heads * d, h, false);
  self_attn.o_proj.bind(b, "self_attn.o_proj", h, c.num_attention_heads * d, false);
  if (c.qk_norm) {
    b.declare("self_attn.q_norm.weight", {d}, &self_attn.q_norm, kStored);
    b.declare("self_attn.k_norm.weight", {d}, &self_attn.k_norm, kStored);
  }
  b.declare("post_attention_layernorm.weight", {h}, &post_attention_layernorm, kStored);
  mlp.gate_proj.bind(b, "mlp.gate_proj", ff, h, false);
  mlp.up_proj.bind(b, "mlp.up_proj", ff, h, false);
  mlp.down_proj.bind(b, "mlp.down_proj", h, ff, false);
}

Tensor DecoderLayer::forward(const Tensor& x, const ops::RopeTable& rope, const Tensor& mask,
                             const DecoderLMConfig& c) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const auto eps = static_cast<float>(c.rms_norm_eps);

  const Tensor a = ops::rms_norm(x, input_layernorm, eps);
  auto heads = [&](const Linear& proj, const Tensor& norm, int64_t n) {
    Tensor t = proj(a).view({batch, seq, n, c.head_dim});
    if (c.qk_norm) t = ops::rms_norm(t, norm, eps);
    return ops::apply_rope(t, rope, RopeStyle::RotateHalf);
  };
  const Tensor q = heads(self_attn.q_proj, self_attn.q_norm, c.num_attention_heads);
  const Tensor k = heads(self_attn.k_proj, self_attn.k_norm, c.num_key_value_heads);
  const Tensor v = self_attn.v_proj(a).view({batch, seq, c.num_key_value_heads, c.head_dim});
  // transformers combines the causal mask with the padding mask; the kernel takes grouped kv heads as they are.
  AttentionParams params;
  params.causal = true;
  params.key_padding_mask = mask;
  const Tensor attn = ops::attention(q, k, v, params).out.view({batch, seq, c.num_attention_heads * c.head_dim});
  const Tensor h = ops::add(x, self_attn.o_proj(attn));

  const Tensor m = ops::rms_norm(h, post_attention_layernorm, eps);
  const Tensor act = ops::mul(ops::silu(mlp.gate_proj(m)), mlp.up_proj(m));
  return ops::add(h, mlp.down_proj(act));
}

size_t DecoderLayer::weight_bytes() const {
  size_t bytes = input_layernorm.nbytes() + post_attention_layernorm.nbytes();
  for (const Linear* l : {&self_attn.q_proj, &self_attn.k_proj, &self_attn.v_proj, &self_attn.o_proj, &mlp.gate_proj,
                          &mlp.up_proj, &mlp.down_proj})
    bytes += l->weight_bytes();
  if (self_attn.q_norm.defined()) bytes += self_attn.q_norm.nbytes() + self_attn.k_norm.nbytes();
  return bytes;
}

DecoderLM DecoderLM::load(const TensorSource& weights, const DecoderLMConfig& config,
                          const DecoderLMCheckpoint& checkpoint, int deepest_tap, const DecoderLMOptions& options) {
  XDIT_CHECK(options.compute_dtype == DType::F32 || options.compute_dtype == DType::BF16,
             "DecoderLM: compute dtype must be f32 or bf16, got ", dtype_name(options.compute_dtype));
  XDIT_CHECK(deepest_tap >= 0 && deepest_tap <= config.num_hidden_layers, "DecoderLM: hidden state ", deepest_tap,
             " does not exist (", weights.label(), " has ", config.num_hidden_layers, " layers)");
  DecoderLM lm;
  lm.config_ = config;
  lm.options_ = options;
  const DecoderLMConfig& c = lm.config_;

  WeightBinder root(weights, "", BindOptions{options.compute_dtype});
  WeightBinder model = root.scoped(checkpoint.model_prefix);
  model.declare("embed_tokens.weight", {c.vocab_size, c.hidden_size}, &lm.embed_tokens_, kStored);
  lm.layers_.resize(static_cast<size_t>(deepest_tap));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    if (i >= deepest_tap) {
      model.ignore(prefix);
      continue;
    }
    WeightBinder layer = model.scoped(prefix);
    lm.layers_[static_cast<size_t>(i)].bind(layer, c);
  }
  if (deepest_tap == c.num_hidden_layers) {
    model.declare("norm.weight", {c.hidden_size}, &lm.norm_, kStored);
  } else {
    model.ignore("norm.");
  }
  for (const std::string& unused : checkpoint.unused_prefixes) root.ignore(unused);
  root.finish();

  if (options.fp8_linear) {
    for (DecoderLayer& l : lm.layers_) {
      for (Linear* p : {&l.self_attn.q_proj, &l.self_attn.k_proj, &l.self_attn.v_proj, &l.self_attn.o_proj,
                        &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj})
        p->quantize_fp8();
    }
  }
  return lm;
}

size_t DecoderLM::weight_bytes() const {
  size_t bytes = embed_tokens_.nbytes() + (norm_.defined() ? norm_.nbytes() : 0);
  for (const DecoderLayer& l : layers_) bytes += l.weight_bytes();
  return bytes;
}

Tensor DecoderLM::embed(const Tensor& ids) const {
  const Tensor flat = ids.to(DType::I64).contiguous();
  const int64_t batch = ids.size(0), seq = ids.size(1);
  Tensor out = Tensor::empty({batch, seq, config_.hidden_size}, options_.compute_dtype, embed_tokens_.device());
  const int64_t* id = flat.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t token = id[b * seq + s];
      XDIT_CHECK(token >= 0 && token < config_.vocab_size, "DecoderLM: token id ", token, " at [", b, ", ", s,
                 "] is outside the vocabulary of ", config_.vocab_size);
      out.select(0, b).select(0, s).copy_from(embed_tokens_.select(0, token));
    }
  }
  return out;
}

Tensor DecoderLM::hidden_states_stacked(const Tensor& ids, const Tensor& mask, const std::vector<int>& taps) const {
  XDIT_CHECK(ids.dim() == 2 && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
             "DecoderLM: ids must be [B, S] i64 or i32, got ", dtype_name(ids.dtype()), " ", shape_str(ids.shape()));
  XDIT_CHECK(mask.shape() == ids.shape() && (mask.dtype() == DType::I64 || mask.dtype() == DType::I32),
             "DecoderLM: mask must be i64 or i32 of the ids' shape ", shape_str(ids.shape()), ", got ",
             dtype_name(mask.dtype()), " ", shape_str(mask.shape()));
  XDIT_CHECK(!taps.empty(), "DecoderLM: no hidden states requested");
  for (int t : taps) {
    XDIT_CHECK(t >= 0 && t <= loaded_layers(), "DecoderLM: hidden state ", t, " was not loaded (loaded up to ",
               loaded_layers(), ")");
  }
  const int deepest = *std::max_element(taps.begin(), taps.end());

  const Tensor key_mask = mask.to(DType::I32).contiguous();
  const int64_t batch = ids.size(0), seq = ids.size(1);
  const int32_t* m = key_mask.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    // Right padding keeps transformers' default position ids 0..S-1 the tokens' true positions.
    int64_t tokens = 0;
    while (tokens < seq && m[b * seq + tokens] != 0) ++tokens;
    for (int64_t s = tokens; s < seq; ++s)
      XDIT_CHECK(m[b * seq + s] == 0, "DecoderLM: mask row ", b, " is not right-padded (token at ", s,
                 " after padding at ", tokens, ")");
    XDIT_CHECK(tokens > 0, "DecoderLM: mask row ", b, " has no tokens");
  }
  std::vector<int64_t> positions(static_cast<size_t>(seq));
  for (int64_t s = 0; s < seq; ++s) positions[static_cast<size_t>(s)] = s;
  const ops::RopeTable rope =
      ops::rope_table(Tensor::from_ints(positions, {seq, 1}), {config_.head_dim}, config_.rope_theta);

  // Keeps only the tapped states; a tap may repeat.
  std::vector<Tensor> picked(taps.size());
  auto keep = [&](int index, const Tensor& state) {
    for (size_t j = 0; j < taps.size(); ++j)
      if (taps[j] == index) picked[j] = state;
  };
  Tensor x = embed(ids);
  keep(0, x);
  for (int i = 0; i < deepest; ++i) {
    x = layers_[static_cast<size_t>(i)].forward(x, rope, key_mask, config_);
    // transformers replaces the last hidden state with the final-normed output.
    keep(i + 1,
         i + 1 == config_.num_hidden_layers ? ops::rms_norm(x, norm_, static_cast<float>(config_.rms_norm_eps)) : x);
  }
  return ops::concat(picked, 2);
}

}  // namespace xdit
