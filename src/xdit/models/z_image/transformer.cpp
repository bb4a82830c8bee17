#include "xdit/models/z_image/transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "xdit/core/error.h"

namespace xdit::z_image {

namespace {

constexpr const char* kClassName = "ZImageTransformer2DModel";
constexpr int64_t kSeqMultipleOf = 32;        // SEQ_MULTI_OF: each segment is padded to this
constexpr int64_t kFrequencyEmbedding = 256;  // TimestepEmbedder.frequency_embedding_size
constexpr int64_t kTimeMidSize = 1024;        // TimestepEmbedder mid_size, fixed by the model
constexpr float kQkNormEps = 1e-5f;           // the Attention's qk RMSNorm eps, fixed by the model
constexpr float kFinalNormEps = 1e-6f;        // FinalLayer.norm_final

std::string list_str(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

int64_t padded_length(int64_t length) { return length + (kSeqMultipleOf - length % kSeqMultipleOf) % kSeqMultipleOf; }

// `rows` [N, D] followed by copies of `pad_token` [1, D] up to `total` rows.
Tensor pad_with_token(const Tensor& rows, const Tensor& pad_token, int64_t total) {
  const int64_t missing = total - rows.size(0);
  if (missing == 0) return rows;
  return ops::concat({rows, pad_token.to(rows.dtype()).expand({missing, rows.size(1)})}, 0);
}

// Items [S_i, D] -> [B, S_max, D], zero rows after each item (pad_sequence(padding_value=0)).
Tensor stack_padded(const std::vector<Tensor>& items) {
  int64_t longest = 0;
  for (const Tensor& item : items) longest = std::max(longest, item.size(0));
  if (items.size() == 1) return items.front().unsqueeze(0);
  std::vector<Tensor> rows;
  for (const Tensor& item : items) rows.push_back(ops::pad(item.unsqueeze(0), {0, 0, 0, longest - item.size(0)}));
  return ops::concat(rows, 0);
}

// RMSNorm(x) · scale with scale [B, 1, D] (1 + adaLN scale). With one batch row the product is
// folded into the norm's weight: one pass over x and no rounding of the normalised value.
Tensor rms_norm_scaled(const Tensor& x, const Tensor& weight, const Tensor& scale, float eps) {
  if (x.size(0) != 1) return ops::mul(ops::rms_norm(x, weight, eps), scale);
  return ops::rms_norm(x, ops::mul(weight.to(DType::F32), scale.reshape({-1}).to(DType::F32)), eps);
}

// RoPE per batch item: each item has its own positions (the caption length moves the image).
Tensor apply_rope_per_item(const Tensor& x, const SequenceLayout& layout) {
  if (x.size(0) == 1) return ops::apply_rope(x, layout.rope.front(), RopeStyle::Interleaved);
  std::vector<Tensor> items;
  for (int64_t b = 0; b < x.size(0); ++b)
    items.push_back(ops::apply_rope(x.narrow(0, b, 1), layout.rope[static_cast<size_t>(b)], RopeStyle::Interleaved));
  return ops::concat(items, 0);
}

void check_item(bool ok, const char* what, size_t index, const Tensor& t, const std::string& expected) {
  XDIT_CHECK(ok, "z_image Transformer: ", what, "[", index, "] must be ", expected, ", got ",
             t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) : std::string("undefined"));
}

}  // namespace

int64_t TransformerConfig::ffn_hidden_dim() const { return static_cast<int64_t>(static_cast<double>(dim) / 3.0 * 8.0); }

TransformerConfig TransformerConfig::from_json(const JsonConfig& config) {
  config.check_class_name(kClassName);
  TransformerConfig c;
  config.read_optional("all_patch_size", c.all_patch_size);
  config.read_optional("all_f_patch_size", c.all_f_patch_size);
  config.read_optional("in_channels", c.in_channels);
  config.read_optional("dim", c.dim);
  config.read_optional("n_layers", c.n_layers);
  config.read_optional("n_refiner_layers", c.n_refiner_layers);
  config.read_optional("n_heads", c.n_heads);
  config.read_optional("n_kv_heads", c.n_kv_heads);
  config.read_optional("norm_eps", c.norm_eps);
  config.read_optional("qk_norm", c.qk_norm);
  config.read_optional("cap_feat_dim", c.cap_feat_dim);
  config.read_optional("rope_theta", c.rope_theta);
  config.read_optional("t_scale", c.t_scale);
  config.read_optional("axes_dims", c.axes_dims);
  config.read_optional("axes_lens", c.axes_lens);

  // The pipeline always runs forward's defaults patch_size=2, f_patch_size=1; every released
  // config has exactly that one embedder.
  if (c.all_patch_size != std::vector<int64_t>{2})
    config.fail_field("all_patch_size", "is " + list_str(c.all_patch_size) + "; only [2] is supported");
  if (c.all_f_patch_size != std::vector<int64_t>{1})
    config.fail_field("all_f_patch_size", "is " + list_str(c.all_f_patch_size) + "; only [1] is supported");
  if (config.has("siglip_feat_dim"))
    config.fail_field("siglip_feat_dim", "is set (the Omni variant); only null is supported");
  config.require_positive("in_channels", c.in_channels);
  config.require_positive("dim", c.dim);
  if (c.n_layers < 0) config.fail_field("n_layers", "must be >= 0, got " + std::to_string(c.n_layers));
  if (c.n_refiner_layers < 0)
    config.fail_field("n_refiner_layers", "must be >= 0, got " + std::to_string(c.n_refiner_layers));
  config.require_positive("n_heads", c.n_heads);
  config.require_positive("n_kv_heads", c.n_kv_heads);
  if (c.dim % c.n_heads != 0)
    config.fail_field("n_heads", std::to_string(c.n_heads) + " does not divide dim " + std::to_string(c.dim));
  if (!(c.norm_eps >= 0)) config.fail_field("norm_eps", "must be >= 0, got " + std::to_string(c.norm_eps));
  config.require_positive("cap_feat_dim", c.cap_feat_dim);
  if (!(c.rope_theta > 0)) config.fail_field("rope_theta", "must be > 0, got " + std::to_string(c.rope_theta));
  if (!std::isfinite(c.t_scale)) config.fail_field("t_scale", "must be finite");
  if (c.axes_dims.size() != 3)
    config.fail_field("axes_dims", "is " + list_str(c.axes_dims) + "; expected 3 axes (frame, height, width)");
  for (int64_t width : c.axes_dims) {
    if (width <= 0 || width % 2 != 0)
      config.fail_field("axes_dims", "holds " + std::to_string(width) + "; every axis width must be positive and even");
  }
  const int64_t rotary = std::accumulate(c.axes_dims.begin(), c.axes_dims.end(), int64_t{0});
  if (rotary != c.head_dim())
    config.fail_field("axes_dims", "sums to " + std::to_string(rotary) + " but the head dim (dim / n_heads) is " +
                                       std::to_string(c.head_dim()));
  if (c.axes_lens.size() != c.axes_dims.size())
    config.fail_field("axes_lens", "has " + std::to_string(c.axes_lens.size()) + " entries but axes_dims has " +
                                       std::to_string(c.axes_dims.size()));
  for (int64_t length : c.axes_lens) {
    if (length <= 0) config.fail_field("axes_lens", "holds " + std::to_string(length) + "; must be positive");
  }
  return c;
}

// ---- Layers

void FeedForward::bind(WeightBinder& binder, int64_t dim, int64_t hidden) {
  w1.bind(binder, "w1", hidden, dim, false);
  w2.bind(binder, "w2", dim, hidden, false);
  w3.bind(binder, "w3", hidden, dim, false);
}

void FeedForward::quantize_fp8() {
  for (Linear* l : {&w1, &w2, &w3}) l->quantize_fp8();
}

Tensor FeedForward::operator()(const Tensor& x) const { return w2(ops::mul(ops::silu(w1(x)), w3(x))); }

void TransformerBlock::bind(WeightBinder& binder, const BlockShape& block_shape, int64_t adaln_embed_dim,
                            bool modulated) {
  shape = block_shape;
  modulation = modulated;
  const int64_t d = shape.dim, hd = shape.head_dim;
  attention.to_q.bind(binder, "attention.to_q", d, d, false);
  attention.to_k.bind(binder, "attention.to_k", d, d, false);
  attention.to_v.bind(binder, "attention.to_v", d, d, false);
  attention.to_out.bind(binder, "attention.to_out.0", d, d, false);
  if (shape.qk_norm) {
    binder.declare("attention.norm_q.weight", {hd}, &attention.norm_q);
    binder.declare("attention.norm_k.weight", {hd}, &attention.norm_k);
  }
  WeightBinder ff_binder = binder.scoped("feed_forward.");
  feed_forward.bind(ff_binder, d, shape.ffn_hidden_dim);
  binder.declare("attention_norm1.weight", {d}, &attention_norm1);
  binder.declare("attention_norm2.weight", {d}, &attention_norm2);
  binder.declare("ffn_norm1.weight", {d}, &ffn_norm1);
  binder.declare("ffn_norm2.weight", {d}, &ffn_norm2);
  if (modulation) adaLN_modulation.bind(binder, "adaLN_modulation.0", 4 * d, adaln_embed_dim, true);
}

void TransformerBlock::quantize_fp8() {
  for (Linear* l : {&attention.to_q, &attention.to_k, &attention.to_v, &attention.to_out}) l->quantize_fp8();
  feed_forward.quantize_fp8();
}

// mod.chunk(4) = scale_msa, gate_msa, scale_mlp, gate_mlp; no SiLU before the projection. The
// [B, 4D] row is small, so 1 + scale and tanh(gate) are taken on the host and rounded to the
// compute dtype, as diffusers rounds them.
BlockModulation TransformerBlock::modulate(const Tensor& adaln_input) const {
  const int64_t batch = adaln_input.size(0), d = shape.dim;
  const Tensor projection = adaLN_modulation(adaln_input);
  std::vector<float> values = projection.to_floats();
  for (int64_t b = 0; b < batch; ++b) {
    float* row = values.data() + b * 4 * d;
    for (int64_t i = 0; i < d; ++i) {
      row[i] = 1.0f + row[i];
      row[d + i] = std::tanh(row[d + i]);
      row[2 * d + i] = 1.0f + row[2 * d + i];
      row[3 * d + i] = std::tanh(row[3 * d + i]);
    }
  }
  const Tensor all = Tensor::from_floats(values, {batch, 1, 4 * d}, projection.dtype());
  return {all.narrow(-1, 0, d), all.narrow(-1, d, d), all.narrow(-1, 2 * d, d), all.narrow(-1, 3 * d, d)};
}

Tensor TransformerBlock::forward(const Tensor& x, const SequenceLayout& layout, const BlockModulation* mod) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const float eps = shape.norm_eps;
  auto heads = [&](const Tensor& t) { return t.view({batch, seq, shape.heads, shape.head_dim}); };
  auto attend = [&](const Tensor& h) {
    Tensor query = heads(attention.to_q(h)), key = heads(attention.to_k(h));
    if (shape.qk_norm) {
      query = ops::rms_norm(query, attention.norm_q, kQkNormEps);
      key = ops::rms_norm(key, attention.norm_k, kQkNormEps);
    }
    AttentionParams params;
    params.key_padding_mask = layout.key_padding_mask;
    const Tensor out = ops::attention(apply_rope_per_item(query, layout), apply_rope_per_item(key, layout),
                                      heads(attention.to_v(h)), params)
                           .out.view({batch, seq, shape.dim});
    return attention.to_out(out);
  };

  if (mod == nullptr) {
    Tensor h = ops::add(x, ops::rms_norm(attend(ops::rms_norm(x, attention_norm1, eps)), attention_norm2, eps));
    return ops::add(h, ops::rms_norm(feed_forward(ops::rms_norm(h, ffn_norm1, eps)), ffn_norm2, eps));
  }
  const Tensor attn_out = attend(rms_norm_scaled(x, attention_norm1, mod->scale_msa, eps));
  Tensor h = ops::gated_residual(x, ops::rms_norm(attn_out, attention_norm2, eps), mod->gate_msa);
  const Tensor ffn_out = feed_forward(rms_norm_scaled(h, ffn_norm1, mod->scale_mlp, eps));
  return ops::gated_residual(h, ops::rms_norm(ffn_out, ffn_norm2, eps), mod->gate_mlp);
}

// ---- Model

Transformer Transformer::load(const TensorSource& weights, const JsonConfig& config,
                              const TransformerLoadOptions& options) {
  XDIT_CHECK(options.compute_dtype == DType::F32 || options.compute_dtype == DType::BF16,
             "z_image Transformer: compute dtype must be f32 or bf16, got ", dtype_name(options.compute_dtype));
  Transformer t;
  t.config_ = TransformerConfig::from_json(config);
  t.compute_dtype_ = options.compute_dtype;
  const TransformerConfig& c = t.config_;
  const int64_t d = c.dim, adaln = c.adaln_embed_dim();
  const std::string patch_key = std::to_string(c.patch_size()) + "-" + std::to_string(c.f_patch_size());
  const BlockShape shape{d, c.n_heads, c.head_dim(), c.ffn_hidden_dim(), static_cast<float>(c.norm_eps), c.qk_norm};

  WeightBinder root(weights, "", BindOptions{options.compute_dtype});
  t.t_embedder_mlp_0_.bind(root, "t_embedder.mlp.0", kTimeMidSize, kFrequencyEmbedding, true);
  t.t_embedder_mlp_2_.bind(root, "t_embedder.mlp.2", adaln, kTimeMidSize, true);
  root.declare("cap_embedder.0.weight", {c.cap_feat_dim}, &t.cap_embedder_norm_);
  t.cap_embedder_linear_.bind(root, "cap_embedder.1", d, c.cap_feat_dim, true);
  t.x_embedder_.bind(root, "all_x_embedder." + patch_key, d, c.patch_features(), true);
  root.declare("x_pad_token", {1, d}, &t.x_pad_token_);
  root.declare("cap_pad_token", {1, d}, &t.cap_pad_token_);

  auto bind_blocks = [&](std::vector<TransformerBlock>& blocks, const std::string& name, int64_t count,
                         bool modulated) {
    blocks.resize(static_cast<size_t>(count));
    for (size_t i = 0; i < blocks.size(); ++i) {
      WeightBinder block = root.scoped(name + "." + std::to_string(i) + ".");
      blocks[i].bind(block, shape, adaln, modulated);
    }
  };
  bind_blocks(t.noise_refiner_, "noise_refiner", c.n_refiner_layers, true);
  bind_blocks(t.context_refiner_, "context_refiner", c.n_refiner_layers, false);
  bind_blocks(t.layers_, "layers", c.n_layers, true);

  const std::string final_layer = "all_final_layer." + patch_key + ".";
  t.final_adaLN_modulation_.bind(root, final_layer + "adaLN_modulation.1", d, adaln, true);
  t.final_linear_.bind(root, final_layer + "linear", c.patch_features(), d, true);
  root.finish();

  if (options.fp8_linear) {
    for (auto* blocks : {&t.noise_refiner_, &t.context_refiner_, &t.layers_})
      for (TransformerBlock& block : *blocks) block.quantize_fp8();
    t.x_embedder_.quantize_fp8();
    t.cap_embedder_linear_.quantize_fp8();
  }
  return t;
}

// TimestepEmbedder: the sinusoid [cos, sin] of t_scale · t in f32 (t stays f32 in the pipeline,
// also under bf16), cast to the weights' dtype, then mlp.0 -> SiLU -> mlp.2.
Tensor Transformer::t_embed(const Tensor& t) const {
  const int64_t batch = t.size(0), half = kFrequencyEmbedding / 2;
  const std::vector<float> values = t.to_floats();
  const float log_period = static_cast<float>(-std::log(10000.0));
  std::vector<float> sinusoid(static_cast<size_t>(batch * kFrequencyEmbedding));
  for (int64_t b = 0; b < batch; ++b) {
    const float scaled = values[static_cast<size_t>(b)] * static_cast<float>(config_.t_scale);
    for (int64_t i = 0; i < half; ++i) {
      const float frequency = std::exp(log_period * static_cast<float>(i) / static_cast<float>(half));
      const float angle = scaled * frequency;
      sinusoid[static_cast<size_t>(b * kFrequencyEmbedding + i)] = std::cos(angle);
      sinusoid[static_cast<size_t>(b * kFrequencyEmbedding + half + i)] = std::sin(angle);
    }
  }
  const Tensor projection = Tensor::from_floats(sinusoid, {batch, kFrequencyEmbedding}, compute_dtype_);
  return t_embedder_mlp_2_(ops::silu(t_embedder_mlp_0_(projection)));
}

// RopeEmbedder: per axis, angle = f32(pos · 1 / theta^(2i/d)) with the product in f64, then
// cos/sin of that f32 angle (torch.polar on the f32 table); pairs are interleaved (view_as_complex).
// A shorter item's table is padded with position 0; its padded rows are masked out as keys and
// their outputs dropped.
SequenceLayout Transformer::layout(const std::vector<std::vector<std::array<int64_t, 3>>>& positions) const {
  const TransformerConfig& c = config_;
  SequenceLayout layout;
  int64_t longest = 0;
  for (const auto& item : positions) {
    layout.lengths.push_back(static_cast<int64_t>(item.size()));
    longest = std::max(longest, static_cast<int64_t>(item.size()));
  }
  for (const auto& item : positions) {
    std::vector<int64_t> ids(static_cast<size_t>(longest * 3), 0);
    for (size_t s = 0; s < item.size(); ++s) {
      for (size_t a = 0; a < 3; ++a) {
        XDIT_CHECK(item[s][a] >= 0 && item[s][a] < c.axes_lens[a], "z_image Transformer: position ", item[s][a],
                   " on axis ", a, " is outside axes_lens ", list_str(c.axes_lens),
                   " (the caption or the latent is too long for the RoPE table)");
        ids[s * 3 + a] = item[s][a];
      }
    }
    layout.rope.push_back(ops::rope_table(Tensor::from_ints(ids, {longest, 3}), c.axes_dims, c.rope_theta,
                                          ops::RopeAngle::RoundedToF32));
  }
  if (std::any_of(layout.lengths.begin(), layout.lengths.end(), [&](int64_t n) { return n != longest; })) {
    std::vector<int64_t> mask;
    for (int64_t n : layout.lengths)
      for (int64_t s = 0; s < longest; ++s) mask.push_back(s < n ? 1 : 0);
    layout.key_padding_mask = Tensor::from_ints(mask, {static_cast<int64_t>(positions.size()), longest}, DType::I32);
  }
  return layout;
}

std::vector<Tensor> Transformer::forward(const std::vector<Tensor>& x, const Tensor& t,
                                         const std::vector<Tensor>& cap_feats) const {
  const TransformerConfig& c = config_;
  const int64_t batch = static_cast<int64_t>(x.size());
  const int64_t pf = c.f_patch_size(), p = c.patch_size(), d = c.dim;
  XDIT_CHECK(batch >= 1, "z_image Transformer: x is empty (one latent per batch item expected)");
  XDIT_CHECK(cap_feats.size() == x.size(), "z_image Transformer: ", x.size(), " latents but ", cap_feats.size(),
             " caption feature tensors (one per item expected)");
  XDIT_CHECK(t.defined() && t.dim() == 1 && t.size(0) == batch && is_floating(t.dtype()),
             "z_image Transformer: t must be a float tensor [", batch, "], got ",
             t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.shape()) : std::string("undefined"));
  for (size_t i = 0; i < x.size(); ++i) {
    const Tensor& xi = x[i];
    check_item(xi.defined() && xi.dim() == 4 && is_floating(xi.dtype()) && xi.size(0) == c.in_channels &&
                   xi.size(1) % pf == 0 && xi.size(2) % p == 0 && xi.size(3) % p == 0 && xi.numel() > 0,
               "x", i, xi,
               "float [" + std::to_string(c.in_channels) + ", F, H, W] with F divisible by " + std::to_string(pf) +
                   " and H, W by " + std::to_string(p));
    const Tensor& ci = cap_feats[i];
    check_item(
        ci.defined() && ci.dim() == 2 && is_floating(ci.dtype()) && ci.size(0) >= 1 && ci.size(1) == c.cap_feat_dim,
        "cap_feats", i, ci, "float [L >= 1, " + std::to_string(c.cap_feat_dim) + "]");
  }

  const Tensor adaln_input = t_embed(t);

  // patchify_and_embed: tokens in (f, h, w) order, features in (pf, ph, pw, c) order.
  std::vector<Tensor> patches;
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<int64_t> cap_lengths;
  for (size_t i = 0; i < x.size(); ++i) {
    const Tensor& xi = x[i];
    const std::array<int64_t, 3> grid{xi.size(1) / pf, xi.size(2) / p, xi.size(3) / p};
    grids.push_back(grid);
    patches.push_back(
        ops::permute_copy(xi.to(compute_dtype_).contiguous().view({c.in_channels, grid[0], pf, grid[1], p, grid[2], p}),
                          {1, 3, 5, 2, 4, 6, 0})
            .view({grid[0] * grid[1] * grid[2], c.patch_features()}));
    cap_lengths.push_back(padded_length(cap_feats[i].size(0)));
  }

  // Positions: caption token j (pads included) at (1 + j, 0, 0); image token (f, h, w) at
  // (cap_len + 1 + f, h, w); image pad tokens at (0, 0, 0).
  std::vector<std::vector<std::array<int64_t, 3>>> img_positions(x.size()), cap_positions(x.size());
  std::vector<int64_t> img_lengths;
  for (size_t i = 0; i < x.size(); ++i) {
    const std::array<int64_t, 3>& g = grids[i];
    for (int64_t f = 0; f < g[0]; ++f)
      for (int64_t h = 0; h < g[1]; ++h)
        for (int64_t w = 0; w < g[2]; ++w) img_positions[i].push_back({cap_lengths[i] + 1 + f, h, w});
    const int64_t tokens = static_cast<int64_t>(img_positions[i].size());
    img_lengths.push_back(padded_length(tokens));
    img_positions[i].resize(static_cast<size_t>(img_lengths.back()), {0, 0, 0});
    for (int64_t j = 0; j < cap_lengths[i]; ++j) cap_positions[i].push_back({1 + j, 0, 0});
  }

  // Image: embed every item's patches at once, pad each with x_pad_token, refine.
  std::vector<Tensor> img_items;
  {
    const Tensor embedded = x_embedder_(ops::concat(patches, 0));
    int64_t offset = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t n = patches[i].size(0);
      img_items.push_back(pad_with_token(embedded.narrow(0, offset, n), x_pad_token_, img_lengths[i]));
      offset += n;
    }
  }
  Tensor img = stack_padded(img_items);
  {
    const SequenceLayout img_layout = layout(img_positions);
    for (const TransformerBlock& block : noise_refiner_) {
      const BlockModulation mod = block.modulate(adaln_input);
      img = block.forward(img, img_layout, &mod);
    }
  }

  // Caption: RMSNorm + Linear over every item at once, pad with cap_pad_token, refine.
  std::vector<Tensor> cap_items;
  {
    std::vector<Tensor> features;
    for (const Tensor& ci : cap_feats) features.push_back(ci.to(compute_dtype_));
    const Tensor embedded = cap_embedder_linear_(
        ops::rms_norm(ops::concat(features, 0), cap_embedder_norm_, static_cast<float>(c.norm_eps)));
    int64_t offset = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t n = cap_feats[i].size(0);
      cap_items.push_back(pad_with_token(embedded.narrow(0, offset, n), cap_pad_token_, cap_lengths[i]));
      offset += n;
    }
  }
  Tensor cap = stack_padded(cap_items);
  {
    const SequenceLayout cap_layout = layout(cap_positions);
    for (const TransformerBlock& block : context_refiner_) cap = block.forward(cap, cap_layout, nullptr);
  }

  // Unified sequence [img; cap] per item, then the main layers.
  std::vector<Tensor> unified_items;
  std::vector<std::vector<std::array<int64_t, 3>>> unified_positions(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t b = static_cast<int64_t>(i);
    unified_items.push_back(
        ops::concat({img.select(0, b).narrow(0, 0, img_lengths[i]), cap.select(0, b).narrow(0, 0, cap_lengths[i])}, 0));
    unified_positions[i] = img_positions[i];
    unified_positions[i].insert(unified_positions[i].end(), cap_positions[i].begin(), cap_positions[i].end());
  }
  Tensor unified = stack_padded(unified_items);
  {
    const SequenceLayout unified_layout = layout(unified_positions);
    for (const TransformerBlock& block : layers_) {
      const BlockModulation mod = block.modulate(adaln_input);
      unified = block.forward(unified, unified_layout, &mod);
    }
  }

  // FinalLayer: LayerNorm (no affine) · (1 + Linear(SiLU(c))), then the linear.
  const Tensor final_scale =
      ops::add(Tensor::full({1}, 1.0f, compute_dtype_), final_adaLN_modulation_(ops::silu(adaln_input)))
          .view({batch, 1, d});
  Tensor normed;
  if (batch == 1) {
    normed = ops::layer_norm(unified, final_scale.reshape({-1}).to(DType::F32), Tensor(), kFinalNormEps);
  } else {
    normed = ops::mul(ops::layer_norm(unified, Tensor(), Tensor(), kFinalNormEps), final_scale);
  }
  const Tensor out = final_linear_(normed);

  // unpatchify: "f h w pf ph pw c -> c (f pf) (h ph) (w pw)" over the item's image tokens.
  std::vector<Tensor> result;
  for (size_t i = 0; i < x.size(); ++i) {
    const std::array<int64_t, 3>& g = grids[i];
    const Tensor tokens = out.select(0, static_cast<int64_t>(i)).narrow(0, 0, g[0] * g[1] * g[2]);
    result.push_back(
        ops::permute_copy(tokens.view({g[0], g[1], g[2], pf, p, p, c.out_channels()}), {6, 0, 3, 1, 4, 2, 5})
            .view({c.out_channels(), x[i].size(1), x[i].size(2), x[i].size(3)}));
  }
  return result;
}

size_t Transformer::weight_bytes() const {
  size_t bytes = 0;
  for (const Linear* l : {&t_embedder_mlp_0_, &t_embedder_mlp_2_, &cap_embedder_linear_, &x_embedder_,
                          &final_adaLN_modulation_, &final_linear_})
    bytes += l->weight_bytes();
  for (const Tensor* w : {&cap_embedder_norm_, &x_pad_token_, &cap_pad_token_}) bytes += w->nbytes();
  for (const auto* blocks : {&noise_refiner_, &context_refiner_, &layers_}) {
    for (const TransformerBlock& b : *blocks) {
      for (const Linear* l : {&b.attention.to_q, &b.attention.to_k, &b.attention.to_v, &b.attention.to_out,
                              &b.feed_forward.w1, &b.feed_forward.w2, &b.feed_forward.w3})
        bytes += l->weight_bytes();
      if (b.modulation) bytes += b.adaLN_modulation.weight_bytes();
      for (const Tensor* n : {&b.attention.norm_q, &b.attention.norm_k, &b.attention_norm1, &b.attention_norm2,
                              &b.ffn_norm1, &b.ffn_norm2})
        if (n->defined()) bytes += n->nbytes();
    }
  }
  return bytes;
}

}  // namespace xdit::z_image
