#include "xdit/models/flux2/transformer.h"

#include <cmath>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "xdit/core/error.h"

namespace xdit::flux2 {

namespace {

constexpr const char* kClassName = "Flux2Transformer2DModel";

void require_even(const JsonConfig& config, std::string_view field, int64_t value) {
  if (value % 2 != 0) config.fail_field(field, "must be even, got " + std::to_string(value));
}

// A [B] float tensor's values, checked; `what` names the argument.
std::vector<float> batch_values(const char* what, const Tensor& t, int64_t batch) {
  XDIT_CHECK(t.dim() == 1 && t.size(0) == batch && is_floating(t.dtype()), "flux2 Transformer: ", what,
             " must be a float tensor [", batch, "] (one value per batch row), got ", dtype_name(t.dtype()), " ",
             shape_str(t.shape()));
  return t.to_floats();
}

// ids [S, n] or [B, S, n] -> [S, n] (batch row 0, as diffusers' Flux2Transformer2DModel takes it).
Tensor first_batch_row(const char* what, const Tensor& ids, int64_t axes) {
  XDIT_CHECK((ids.dim() == 2 || ids.dim() == 3) && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
             "flux2 Transformer::rope: ", what, " must be [S, ", axes, "] or [B, S, ", axes, "] i64/i32, got ",
             dtype_name(ids.dtype()), " ", shape_str(ids.shape()));
  const Tensor rows = ids.dim() == 3 ? ids.select(0, 0) : ids;
  XDIT_CHECK(rows.size(1) == axes, "flux2 Transformer::rope: ", what, " ", shape_str(ids.shape()), " has ",
             rows.size(1), " coordinates per token, but axes_dims_rope has ", axes, " axes");
  return rows;
}

// The [B, 1, D] chunk `index` of a modulation projection viewed as [B, 1, chunks * D].
Tensor chunk_of(const Tensor& projection, int64_t index, int64_t dim) {
  return projection.narrow(-1, index * dim, dim);
}

Tensor layer_norm(const Tensor& x, float eps) { return ops::layer_norm(x, Tensor(), Tensor(), eps); }

// (1 + scale) * LayerNorm(x) + shift, LayerNorm without affine. With one batch row the modulation
// is a per-channel affine, so it runs as the layer norm's own weight and bias: one pass over x
// instead of two, and no rounding of the normalised value before it is scaled.
Tensor norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale, float eps) {
  if (x.size(0) != 1) return ops::modulate(layer_norm(x, eps), shift, scale);
  const Tensor weight = ops::add(Tensor::full({1}, 1.0f, DType::F32), scale.reshape({-1}));  // f32 [D]
  return ops::layer_norm(x, weight, shift.reshape({-1}), eps);
}

}  // namespace

int64_t TransformerConfig::mlp_hidden_dim() const {
  return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio);
}

TransformerConfig TransformerConfig::from_json(const JsonConfig& config) {
  config.check_class_name(kClassName);
  TransformerConfig c;
  config.read_optional("patch_size", c.patch_size);
  config.read_optional("in_channels", c.in_channels);
  c.out_channels = config.get_int("out_channels", c.in_channels);
  config.read_optional("num_layers", c.num_layers);
  config.read_optional("num_single_layers", c.num_single_layers);
  config.read_optional("attention_head_dim", c.attention_head_dim);
  config.read_optional("num_attention_heads", c.num_attention_heads);
  config.read_optional("joint_attention_dim", c.joint_attention_dim);
  config.read_optional("timestep_guidance_channels", c.timestep_guidance_channels);
  config.read_optional("mlp_ratio", c.mlp_ratio);
  config.read_optional("axes_dims_rope", c.axes_dims_rope);
  config.read_optional("rope_theta", c.rope_theta);
  config.read_optional("eps", c.eps);
  config.read_optional("guidance_embeds", c.guidance_embeds);

  config.require_positive("patch_size", c.patch_size);
  config.require_positive("in_channels", c.in_channels);
  config.require_positive("out_channels", c.out_channels);
  if (c.num_layers < 0) config.fail_field("num_layers", "must be >= 0, got " + std::to_string(c.num_layers));
  if (c.num_single_layers < 0)
    config.fail_field("num_single_layers", "must be >= 0, got " + std::to_string(c.num_single_layers));
  config.require_positive("attention_head_dim", c.attention_head_dim);
  require_even(config, "attention_head_dim", c.attention_head_dim);
  config.require_positive("num_attention_heads", c.num_attention_heads);
  config.require_positive("joint_attention_dim", c.joint_attention_dim);
  // An odd count would make diffusers' sinusoid zero-padded; no FLUX.2 model uses one.
  config.require_positive("timestep_guidance_channels", c.timestep_guidance_channels);
  require_even(config, "timestep_guidance_channels", c.timestep_guidance_channels);
  if (!(c.mlp_ratio > 0) || c.mlp_hidden_dim() < 1)
    config.fail_field("mlp_ratio", "must give a positive MLP width, got " + std::to_string(c.mlp_ratio));
  if (!(c.rope_theta > 0)) config.fail_field("rope_theta", "must be > 0, got " + std::to_string(c.rope_theta));
  if (!(c.eps >= 0)) config.fail_field("eps", "must be >= 0, got " + std::to_string(c.eps));
  if (c.axes_dims_rope.empty()) config.fail_field("axes_dims_rope", "is empty");
  for (int64_t width : c.axes_dims_rope) {
    if (width <= 0 || width % 2 != 0)
      config.fail_field("axes_dims_rope",
                        "holds " + std::to_string(width) + "; every axis width must be positive and even");
  }
  const int64_t rotary = std::accumulate(c.axes_dims_rope.begin(), c.axes_dims_rope.end(), int64_t{0});
  if (rotary != c.attention_head_dim)
    config.fail_field("axes_dims_rope", "sums to " + std::to_string(rotary) + " but attention_head_dim is " +
                                            std::to_string(c.attention_head_dim));
  return c;
}

// ---- Layers

void TimestepEmbedding::bind(WeightBinder& binder, int64_t in_channels, int64_t dim) {
  linear_1.bind(binder, "linear_1", dim, in_channels, false);
  linear_2.bind(binder, "linear_2", dim, dim, false);
}

Tensor TimestepEmbedding::operator()(const Tensor& projection) const {
  return linear_2(ops::silu(linear_1(projection)));
}

void Modulation::bind(WeightBinder& binder, int64_t dim, int64_t sets) {
  param_sets = sets;
  linear.bind(binder, "linear", 3 * sets * dim, dim, false);
}

std::vector<ModulationParams> Modulation::operator()(const Tensor& temb) const {
  const int64_t batch = temb.size(0), dim = linear.in_features();
  const Tensor projection = linear(ops::silu(temb)).view({batch, 1, 3 * param_sets * dim});
  std::vector<ModulationParams> sets;
  for (int64_t s = 0; s < param_sets; ++s)
    sets.push_back(
        {chunk_of(projection, 3 * s, dim), chunk_of(projection, 3 * s + 1, dim), chunk_of(projection, 3 * s + 2, dim)});
  return sets;
}

void FeedForward::bind(WeightBinder& binder, int64_t dim, int64_t hidden) {
  linear_in.bind(binder, "linear_in", 2 * hidden, dim, false);
  linear_out.bind(binder, "linear_out", dim, hidden, false);
}

Tensor FeedForward::operator()(const Tensor& x) const { return linear_out(ops::swiglu(linear_in(x))); }

void FeedForward::quantize_fp8() {
  linear_in.quantize_fp8();
  linear_out.quantize_fp8();
}

// ---- Double-stream block

void TransformerBlock::bind(WeightBinder& binder, const BlockShape& block_shape) {
  shape = block_shape;
  const int64_t d = shape.dim, hd = shape.head_dim;
  attn.to_q.bind(binder, "attn.to_q", d, d, false);
  attn.to_k.bind(binder, "attn.to_k", d, d, false);
  attn.to_v.bind(binder, "attn.to_v", d, d, false);
  attn.to_out.bind(binder, "attn.to_out.0", d, d, false);
  binder.declare("attn.norm_q.weight", {hd}, &attn.norm_q);
  binder.declare("attn.norm_k.weight", {hd}, &attn.norm_k);
  attn.add_q_proj.bind(binder, "attn.add_q_proj", d, d, false);
  attn.add_k_proj.bind(binder, "attn.add_k_proj", d, d, false);
  attn.add_v_proj.bind(binder, "attn.add_v_proj", d, d, false);
  attn.to_add_out.bind(binder, "attn.to_add_out", d, d, false);
  binder.declare("attn.norm_added_q.weight", {hd}, &attn.norm_added_q);
  binder.declare("attn.norm_added_k.weight", {hd}, &attn.norm_added_k);
  WeightBinder ff_binder = binder.scoped("ff.");
  ff.bind(ff_binder, d, shape.mlp_hidden_dim);
  WeightBinder ff_context_binder = binder.scoped("ff_context.");
  ff_context.bind(ff_context_binder, d, shape.mlp_hidden_dim);
}

void TransformerBlock::quantize_fp8() {
  for (Linear* l : {&attn.to_q, &attn.to_k, &attn.to_v, &attn.to_out, &attn.add_q_proj, &attn.add_k_proj,
                    &attn.add_v_proj, &attn.to_add_out})
    l->quantize_fp8();
  ff.quantize_fp8();
  ff_context.quantize_fp8();
}

std::pair<Tensor, Tensor> TransformerBlock::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                                    const std::array<ModulationParams, 2>& img,
                                                    const std::array<ModulationParams, 2>& txt,
                                                    const ops::RopeTable& rope) const {
  const int64_t batch = hidden_states.size(0), n_img = hidden_states.size(1), n_txt = encoder_hidden_states.size(1);
  const float eps = shape.eps;
  auto heads = [&](const Tensor& x) { return x.view({batch, x.size(1), shape.heads, shape.head_dim}); };

  const Tensor norm_img = norm_modulate(hidden_states, img[0].shift, img[0].scale, eps);
  const Tensor norm_txt = norm_modulate(encoder_hidden_states, txt[0].shift, txt[0].scale, eps);

  // Joint attention over [txt; img]: per-head RMSNorm of q and k with each stream's weights, then RoPE.
  auto normed = [&](const Linear& proj, const Tensor& x, const Tensor& norm) {
    return ops::rms_norm(heads(proj(x)), norm, eps);
  };
  const Tensor query = ops::apply_rope(
      ops::concat({normed(attn.add_q_proj, norm_txt, attn.norm_added_q), normed(attn.to_q, norm_img, attn.norm_q)}, 1),
      rope, RopeStyle::Interleaved);
  const Tensor key = ops::apply_rope(
      ops::concat({normed(attn.add_k_proj, norm_txt, attn.norm_added_k), normed(attn.to_k, norm_img, attn.norm_k)}, 1),
      rope, RopeStyle::Interleaved);
  const Tensor value = ops::concat({heads(attn.add_v_proj(norm_txt)), heads(attn.to_v(norm_img))}, 1);
  const Tensor joint = ops::attention(query, key, value).out.view({batch, n_txt + n_img, shape.dim});

  Tensor h = ops::gated_residual(hidden_states, attn.to_out(joint.narrow(1, n_txt, n_img)), img[0].gate);
  h = ops::gated_residual(h, ff(norm_modulate(h, img[1].shift, img[1].scale, eps)), img[1].gate);

  Tensor e = ops::gated_residual(encoder_hidden_states, attn.to_add_out(joint.narrow(1, 0, n_txt)), txt[0].gate);
  e = ops::gated_residual(e, ff_context(norm_modulate(e, txt[1].shift, txt[1].scale, eps)), txt[1].gate);
  return {e, h};
}

// ---- Single-stream block

void SingleTransformerBlock::bind(WeightBinder& binder, const BlockShape& block_shape) {
  shape = block_shape;
  const int64_t d = shape.dim, mlp = shape.mlp_hidden_dim;
  attn.to_qkv_mlp_proj.bind(binder, "attn.to_qkv_mlp_proj", 3 * d + 2 * mlp, d, false);
  binder.declare("attn.norm_q.weight", {shape.head_dim}, &attn.norm_q);
  binder.declare("attn.norm_k.weight", {shape.head_dim}, &attn.norm_k);
  attn.to_out.bind(binder, "attn.to_out", d, d + mlp, false);
}

void SingleTransformerBlock::quantize_fp8() {
  attn.to_qkv_mlp_proj.quantize_fp8();
  attn.to_out.quantize_fp8();
}

Tensor SingleTransformerBlock::forward(const Tensor& hidden_states, const ModulationParams& mod,
                                       const ops::RopeTable& rope) const {
  const int64_t batch = hidden_states.size(0), seq = hidden_states.size(1), d = shape.dim;
  auto heads = [&](const Tensor& x) { return x.view({batch, seq, shape.heads, shape.head_dim}); };

  const Tensor norm = norm_modulate(hidden_states, mod.shift, mod.scale, shape.eps);
  const std::vector<Tensor> parts = attn.to_qkv_mlp_proj(norm).split({d, d, d, 2 * shape.mlp_hidden_dim}, -1);
  const Tensor query =
      ops::apply_rope(ops::rms_norm(heads(parts[0]), attn.norm_q, shape.eps), rope, RopeStyle::Interleaved);
  const Tensor key =
      ops::apply_rope(ops::rms_norm(heads(parts[1]), attn.norm_k, shape.eps), rope, RopeStyle::Interleaved);
  const Tensor attention = ops::attention(query, key, heads(parts[2])).out.view({batch, seq, d});
  const Tensor out = attn.to_out(ops::concat({attention, ops::swiglu(parts[3])}, -1));
  return ops::gated_residual(hidden_states, out, mod.gate);
}

Tensor SingleTransformerBlock::forward_image_rows(const Tensor& hidden_states, int64_t text_tokens,
                                                  const ModulationParams& mod, const ops::RopeTable& rope) const {
  const int64_t batch = hidden_states.size(0), n_img = hidden_states.size(1) - text_tokens, d = shape.dim;
  auto heads = [&](const Tensor& x) { return x.view({batch, x.size(1), shape.heads, shape.head_dim}); };

  const Tensor norm = norm_modulate(hidden_states, mod.shift, mod.scale, shape.eps);
  // Rows d..3d of the fused projection are the keys and values.
  const Linear& fused = attn.to_qkv_mlp_proj;
  const Linear text_kv{fused.weight.narrow(0, d, 2 * d), {},
                       fused.weight_scale.defined() ? fused.weight_scale.narrow(0, d, 2 * d) : Tensor{}};
  const std::vector<Tensor> txt = text_kv(norm.narrow(1, 0, text_tokens)).split({d, d}, -1);
  const std::vector<Tensor> img =
      fused(norm.narrow(1, text_tokens, n_img)).split({d, d, d, 2 * shape.mlp_hidden_dim}, -1);

  const ops::RopeTable image_rope{rope.cos.narrow(0, text_tokens, n_img), rope.sin.narrow(0, text_tokens, n_img)};
  const Tensor query =
      ops::apply_rope(ops::rms_norm(heads(img[0]), attn.norm_q, shape.eps), image_rope, RopeStyle::Interleaved);
  const Tensor key = ops::apply_rope(ops::rms_norm(heads(ops::concat({txt[0], img[1]}, 1)), attn.norm_k, shape.eps),
                                     rope, RopeStyle::Interleaved);
  const Tensor value = heads(ops::concat({txt[1], img[2]}, 1));
  const Tensor attention = ops::attention(query, key, value).out.view({batch, n_img, d});
  const Tensor out = attn.to_out(ops::concat({attention, ops::swiglu(img[3])}, -1));
  return ops::gated_residual(hidden_states.narrow(1, text_tokens, n_img), out, mod.gate);
}

// ---- Model

Transformer Transformer::load(const TensorSource& weights, const JsonConfig& config,
                              const TransformerLoadOptions& options) {
  XDIT_CHECK(options.compute_dtype == DType::F32 || options.compute_dtype == DType::BF16,
             "flux2 Transformer: compute dtype must be f32 or bf16, got ", dtype_name(options.compute_dtype));
  Transformer t;
  t.config_ = TransformerConfig::from_json(config);
  t.compute_dtype_ = options.compute_dtype;
  const TransformerConfig& c = t.config_;
  const int64_t d = c.inner_dim();
  const BlockShape shape{d, c.num_attention_heads, c.attention_head_dim, c.mlp_hidden_dim(), static_cast<float>(c.eps)};

  WeightBinder root(weights, "", BindOptions{options.compute_dtype});
  WeightBinder timestep_binder = root.scoped("time_guidance_embed.timestep_embedder.");
  t.timestep_embedder_.bind(timestep_binder, c.timestep_guidance_channels, d);
  if (c.guidance_embeds) {
    WeightBinder guidance_binder = root.scoped("time_guidance_embed.guidance_embedder.");
    t.guidance_embedder_.bind(guidance_binder, c.timestep_guidance_channels, d);
  }
  WeightBinder mod_img = root.scoped("double_stream_modulation_img.");
  t.double_stream_modulation_img_.bind(mod_img, d, 2);
  WeightBinder mod_txt = root.scoped("double_stream_modulation_txt.");
  t.double_stream_modulation_txt_.bind(mod_txt, d, 2);
  WeightBinder mod_single = root.scoped("single_stream_modulation.");
  t.single_stream_modulation_.bind(mod_single, d, 1);
  t.x_embedder_.bind(root, "x_embedder", d, c.in_channels, false);
  t.context_embedder_.bind(root, "context_embedder", d, c.joint_attention_dim, false);

  t.transformer_blocks_.resize(static_cast<size_t>(c.num_layers));
  for (size_t i = 0; i < t.transformer_blocks_.size(); ++i) {
    WeightBinder block = root.scoped("transformer_blocks." + std::to_string(i) + ".");
    t.transformer_blocks_[i].bind(block, shape);
  }
  t.single_transformer_blocks_.resize(static_cast<size_t>(c.num_single_layers));
  for (size_t i = 0; i < t.single_transformer_blocks_.size(); ++i) {
    WeightBinder block = root.scoped("single_transformer_blocks." + std::to_string(i) + ".");
    t.single_transformer_blocks_[i].bind(block, shape);
  }
  t.norm_out_linear_.bind(root, "norm_out.linear", 2 * d, d, false);
  t.proj_out_.bind(root, "proj_out", c.proj_out_channels(), d, false);
  root.finish();

  if (options.fp8_linear) {
    t.x_embedder_.quantize_fp8();
    t.context_embedder_.quantize_fp8();
    for (TransformerBlock& block : t.transformer_blocks_) block.quantize_fp8();
    for (SingleTransformerBlock& block : t.single_transformer_blocks_) block.quantize_fp8();
  }
  return t;
}

ops::RopeTable Transformer::rope(const Tensor& txt_ids, const Tensor& img_ids) const {
  const int64_t axes = static_cast<int64_t>(config_.axes_dims_rope.size());
  const Tensor ids = ops::concat({first_batch_row("txt_ids", txt_ids, axes).to(DType::I64),
                                  first_batch_row("img_ids", img_ids, axes).to(DType::I64)},
                                 0);
  return ops::rope_table(ids, config_.axes_dims_rope, config_.rope_theta);
}

// Flux2TimestepGuidanceEmbeddings after the model's `timestep * 1000`. diffusers casts the
// timestep to the activations' dtype and multiplies there, so in bf16 sigma·1000 is rounded
// twice (0.75 embeds as 752); the sinusoid itself is computed in f32 and cast to the compute dtype.
Tensor Transformer::time_guidance_embed(const Tensor& timestep, const Tensor& guidance) const {
  const int64_t batch = timestep.size(0), channels = config_.timestep_guidance_channels, half = channels / 2;
  // Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0): [cos(t f_i), sin(t f_i)], f_i = 10000^(-i/half).
  std::vector<float> frequencies(static_cast<size_t>(half));
  const float log_period = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < half; ++i)
    frequencies[static_cast<size_t>(i)] = std::exp(log_period * static_cast<float>(i) / static_cast<float>(half));
  auto sinusoid = [&](const std::vector<float>& values) {
    std::vector<float> out(static_cast<size_t>(batch * channels));
    for (int64_t b = 0; b < batch; ++b) {
      const float t = round_to_dtype(round_to_dtype(values[static_cast<size_t>(b)], compute_dtype_) * 1000.0f, compute_dtype_);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = t * frequencies[static_cast<size_t>(i)];
        out[static_cast<size_t>(b * channels + i)] = std::cos(angle);
        out[static_cast<size_t>(b * channels + half + i)] = std::sin(angle);
      }
    }
    return Tensor::from_floats(out, {batch, channels}, compute_dtype_);
  };
  Tensor temb = timestep_embedder_(sinusoid(batch_values("timestep", timestep, batch)));
  if (config_.guidance_embeds)
    temb = ops::add(temb, guidance_embedder_(sinusoid(batch_values("guidance", guidance, batch))));
  return temb;
}

Conditioning Transformer::condition(const Tensor& timestep, const Tensor& guidance) const {
  XDIT_CHECK(timestep.defined() && timestep.dim() == 1, "flux2 Transformer: timestep must be [B], got ",
             timestep.defined() ? shape_str(timestep.shape()) : std::string("undefined"));
  if (config_.guidance_embeds) {
    XDIT_CHECK(guidance.defined(),
               "flux2 Transformer: guidance is required: the config has guidance_embeds "
               "(FLUX.2 dev embeds the guidance scale)");
  } else {
    XDIT_CHECK(!guidance.defined(),
               "flux2 Transformer: guidance was given but the config has no guidance "
               "embedder (guidance_embeds is false)");
  }
  Conditioning cond;
  cond.temb = time_guidance_embed(timestep, guidance);
  const std::vector<ModulationParams> img = double_stream_modulation_img_(cond.temb);
  const std::vector<ModulationParams> txt = double_stream_modulation_txt_(cond.temb);
  cond.img = {img[0], img[1]};
  cond.txt = {txt[0], txt[1]};
  cond.single = single_stream_modulation_(cond.temb)[0];
  return cond;
}

Tensor Transformer::forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& timestep,
                            const Tensor& guidance, const ops::RopeTable& rope) const {
  const TransformerConfig& c = config_;
  XDIT_CHECK(hidden_states.defined() && hidden_states.dim() == 3 && hidden_states.size(2) == c.in_channels &&
                 is_floating(hidden_states.dtype()),
             "flux2 Transformer: hidden_states must be float [B, N_img, ", c.in_channels, "], got ",
             hidden_states.defined() ? shape_str(hidden_states.shape()) : std::string("undefined"));
  const int64_t batch = hidden_states.size(0), n_img = hidden_states.size(1);
  XDIT_CHECK(
      encoder_hidden_states.defined() && encoder_hidden_states.dim() == 3 && encoder_hidden_states.size(0) == batch &&
          encoder_hidden_states.size(2) == c.joint_attention_dim && is_floating(encoder_hidden_states.dtype()),
      "flux2 Transformer: encoder_hidden_states must be float [", batch, ", N_txt, ", c.joint_attention_dim, "], got ",
      encoder_hidden_states.defined() ? shape_str(encoder_hidden_states.shape()) : std::string("undefined"));
  const int64_t n_txt = encoder_hidden_states.size(1);
  XDIT_CHECK(rope.cos.defined() && rope.cos.dim() == 2 && rope.cos.size(0) == n_txt + n_img &&
                 rope.cos.size(1) == c.attention_head_dim / 2,
             "flux2 Transformer: the RoPE table must cover the ", n_txt, " text + ", n_img, " image tokens with ",
             c.attention_head_dim / 2, " angles each, got ", rope.cos.defined() ? shape_str(rope.cos.shape()) : "none");
  XDIT_CHECK(timestep.defined() && timestep.dim() == 1 && timestep.size(0) == batch,
             "flux2 Transformer: timestep must be [", batch, "], got ",
             timestep.defined() ? shape_str(timestep.shape()) : std::string("undefined"));

  const Conditioning cond = condition(timestep, guidance);
  Tensor img = x_embedder_(hidden_states.to(compute_dtype_));
  Tensor txt = context_embedder_(encoder_hidden_states.to(compute_dtype_));
  for (const TransformerBlock& block : transformer_blocks_)
    std::tie(txt, img) = block.forward(img, txt, cond.img, cond.txt, rope);

  Tensor joint = ops::concat({txt, img}, 1);
  if (single_transformer_blocks_.empty()) {
    img = joint.narrow(1, n_txt, n_img);
  } else {
    for (size_t i = 0; i + 1 < single_transformer_blocks_.size(); ++i)
      joint = single_transformer_blocks_[i].forward(joint, cond.single, rope);
    img = single_transformer_blocks_.back().forward_image_rows(joint, n_txt, cond.single, rope);
  }

  // norm_out (AdaLayerNormContinuous): chunk order scale, shift.
  const int64_t d = c.inner_dim();
  const Tensor emb = norm_out_linear_(ops::silu(cond.temb)).view({batch, 1, 2 * d});
  const Tensor out = norm_modulate(img, chunk_of(emb, 1, d), chunk_of(emb, 0, d), static_cast<float>(c.eps));
  return proj_out_(out);
}

size_t Transformer::weight_bytes() const {
  size_t bytes = 0;
  for (const Linear* l :
       {&timestep_embedder_.linear_1, &timestep_embedder_.linear_2, &guidance_embedder_.linear_1,
        &guidance_embedder_.linear_2, &double_stream_modulation_img_.linear, &double_stream_modulation_txt_.linear,
        &single_stream_modulation_.linear, &x_embedder_, &context_embedder_, &norm_out_linear_, &proj_out_}) {
    if (l->weight.defined()) bytes += l->weight_bytes();
  }
  for (const TransformerBlock& b : transformer_blocks_) {
    for (const Linear* l : {&b.attn.to_q, &b.attn.to_k, &b.attn.to_v, &b.attn.to_out, &b.attn.add_q_proj,
                            &b.attn.add_k_proj, &b.attn.add_v_proj, &b.attn.to_add_out, &b.ff.linear_in,
                            &b.ff.linear_out, &b.ff_context.linear_in, &b.ff_context.linear_out})
      bytes += l->weight_bytes();
    for (const Tensor* n : {&b.attn.norm_q, &b.attn.norm_k, &b.attn.norm_added_q, &b.attn.norm_added_k})
      bytes += n->nbytes();
  }
  for (const SingleTransformerBlock& b : single_transformer_blocks_) {
    bytes += b.attn.to_qkv_mlp_proj.weight_bytes() + b.attn.to_out.weight_bytes();
    bytes += b.attn.norm_q.nbytes() + b.attn.norm_k.nbytes();
  }
  return bytes;
}

}  // namespace xdit::flux2
