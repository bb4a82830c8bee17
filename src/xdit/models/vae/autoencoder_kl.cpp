#include "xdit/models/vae/autoencoder_kl.h"

#include <algorithm>
#include <string>
#include <vector>

#include "xdit/core/error.h"
#include "xdit/ops/ops.h"

namespace xdit::vae {

namespace {

constexpr float kLogvarMin = -30.0f, kLogvarMax = 20.0f;

std::string index_name(std::string_view base, size_t i) { return std::string(base) + "." + std::to_string(i) + "."; }

// Channel counts must be positive and divisible into the GroupNorm groups.
void check_channels(const JsonConfig& config, std::string_view field, const std::vector<int64_t>& channels,
                    int64_t groups) {
  if (channels.empty()) config.fail_field(field, "is empty");
  for (int64_t c : channels) {
    if (c <= 0 || c % groups != 0)
      config.fail_field(field,
                        concat_message("has ", c, " channels, not a positive multiple of norm_num_groups ", groups));
  }
}

void check_block_types(const JsonConfig& config, std::string_view field, std::string_view expected, size_t levels) {
  if (!config.has(field)) return;
  const std::vector<std::string> types = config.get_string_list(field);
  if (types.size() != levels)
    config.fail_field(field, concat_message("has ", types.size(), " entries but block_out_channels has ", levels));
  for (const std::string& type : types) {
    if (type != expected)
      config.fail_field(field, concat_message("contains \"", type, "\"; only ", expected, " is supported"));
  }
}

}  // namespace

AutoencoderKLConfig AutoencoderKLConfig::from_json(const JsonConfig& config) {
  AutoencoderKLConfig c;
  c.class_name = config.get_string("_class_name");
  // Each class's constructor defaults in diffusers.
  if (c.class_name == "AutoencoderKLFlux2") {
    c.block_out_channels = {128, 256, 512, 512};
    c.layers_per_block = 2;
    c.latent_channels = 32;
  } else if (c.class_name == "AutoencoderKL") {
    c.block_out_channels = {64};
    c.layers_per_block = 1;
    c.latent_channels = 4;
    c.scaling_factor = 0.18215;
  } else {
    config.fail_field("_class_name", "is \"" + c.class_name + "\"; expected AutoencoderKL or AutoencoderKLFlux2");
  }
  config.read_optional("in_channels", c.in_channels);
  config.read_optional("out_channels", c.out_channels);
  config.read_optional("block_out_channels", c.block_out_channels);
  config.read_optional("layers_per_block", c.layers_per_block);
  config.read_optional("latent_channels", c.latent_channels);
  config.read_optional("norm_num_groups", c.norm_num_groups);
  config.read_optional("use_quant_conv", c.use_quant_conv);
  config.read_optional("use_post_quant_conv", c.use_post_quant_conv);
  config.read_optional("mid_block_add_attention", c.mid_block_add_attention);
  config.read_optional("sample_size", c.sample_size);
  if (c.sample_size) config.require_positive("sample_size", *c.sample_size);
  c.decoder_block_out_channels = c.block_out_channels;

  if (c.has_batch_norm()) {
    config.read_optional("decoder_block_out_channels", c.decoder_block_out_channels);
    config.read_optional("batch_norm_eps", c.batch_norm_eps);
    if (!(c.batch_norm_eps >= 0)) config.fail_field("batch_norm_eps", "must be >= 0");
    // The FLUX.2 pipelines patchify 2x2 whatever the config says; the BatchNorm width follows it.
    if (config.has("patch_size") && config.get_int_list("patch_size") != std::vector<int64_t>{2, 2})
      config.fail_field("patch_size", "must be [2, 2], the patchification the FLUX.2 pipelines use");
  } else {
    config.read_optional("scaling_factor", c.scaling_factor);
    config.read_optional("shift_factor", c.shift_factor);
    if (c.scaling_factor == 0) config.fail_field("scaling_factor", "must not be 0");
    if (config.has("latents_mean") || config.has("latents_std"))
      config.fail_field(config.has("latents_mean") ? "latents_mean" : "latents_std",
                        "is set; per-channel latent statistics are not supported");
  }

  const std::string act = config.get_string("act_fn", "silu");
  if (act != "silu") config.fail_field("act_fn", "is \"" + act + "\"; only \"silu\" is supported");
  if (config.get_string("norm_type", "group") != "group")
    config.fail_field("norm_type", "is not \"group\"; spatial norm is not supported");
  if (c.norm_num_groups <= 0) config.fail_field("norm_num_groups", "must be > 0");
  if (c.in_channels <= 0) config.fail_field("in_channels", "must be > 0");
  if (c.out_channels <= 0) config.fail_field("out_channels", "must be > 0");
  if (c.latent_channels <= 0) config.fail_field("latent_channels", "must be > 0");
  if (c.layers_per_block <= 0) config.fail_field("layers_per_block", "must be > 0");
  check_channels(config, "block_out_channels", c.block_out_channels, c.norm_num_groups);
  check_channels(config, "decoder_block_out_channels", c.decoder_block_out_channels, c.norm_num_groups);
  if (c.block_out_channels.size() > 8) config.fail_field("block_out_channels", "has more than 8 levels");
  if (c.decoder_block_out_channels.size() != c.block_out_channels.size())
    config.fail_field("decoder_block_out_channels", "must have as many levels as block_out_channels");
  check_block_types(config, "down_block_types", "DownEncoderBlock2D", c.block_out_channels.size());
  check_block_types(config, "up_block_types", "UpDecoderBlock2D", c.block_out_channels.size());
  return c;
}

// ---- Layers

void Conv2d::bind(WeightBinder& binder, std::string_view name, int64_t out_channels, int64_t in_channels,
                  int64_t kernel) {
  const std::string prefix(name);
  binder.declare(prefix + ".weight", {out_channels, in_channels, kernel, kernel}, &weight);
  binder.declare(prefix + ".bias", {out_channels}, &bias);
}

Tensor Conv2d::operator()(const Tensor& x) const {
  Conv2dParams params;
  params.stride = {stride, stride};
  params.padding = {padding, padding};
  return ops::conv2d(x, weight, bias, params);
}

void GroupNorm::bind(WeightBinder& binder, std::string_view name, int64_t channels, int64_t group_count) {
  const std::string prefix(name);
  binder.declare(prefix + ".weight", {channels}, &weight);
  binder.declare(prefix + ".bias", {channels}, &bias);
  groups = group_count;
}

Tensor GroupNorm::operator()(const Tensor& x) const { return ops::group_norm(x, groups, weight, bias, eps); }

void ResnetBlock2D::bind(WeightBinder& binder, int64_t in_channels, int64_t out_channels, int64_t groups) {
  norm1.bind(binder, "norm1", in_channels, groups);
  conv1.bind(binder, "conv1", out_channels, in_channels, 3);
  conv1.padding = 1;
  norm2.bind(binder, "norm2", out_channels, groups);
  conv2.bind(binder, "conv2", out_channels, out_channels, 3);
  conv2.padding = 1;
  if (in_channels != out_channels) {
    conv_shortcut.emplace();
    conv_shortcut->bind(binder, "conv_shortcut", out_channels, in_channels, 1);
  }
}

Tensor ResnetBlock2D::forward(const Tensor& x) const {
  Tensor h = conv1(ops::silu(norm1(x)));
  h = conv2(ops::silu(norm2(h)));
  return ops::add(conv_shortcut ? (*conv_shortcut)(x) : x, h);
}

void Downsample2D::bind(WeightBinder& binder, int64_t channels) {
  conv.bind(binder, "conv", channels, channels, 3);
  conv.stride = 2;
}

Tensor Downsample2D::forward(const Tensor& x) const { return conv(ops::pad(x, {0, 1, 0, 1})); }

void Upsample2D::bind(WeightBinder& binder, int64_t channels) {
  conv.bind(binder, "conv", channels, channels, 3);
  conv.padding = 1;
}

void Upsample2D::fold_weights() {
  const int64_t out = conv.weight.size(0), in = conv.weight.size(1);
  // Output row 2i + a of the upsampled conv reads upsampled rows 2i + a - 1 .. 2i + a + 1, i.e.
  // input rows i - 1, i, i (a = 0) or i, i, i + 1 (a = 1). A 2x2 conv with padding 1 puts input
  // rows i + a - 1 and i + a under its taps 0 and 1 at output row i + a, so tap t of phase a sums
  // the 3x3 kernel rows kTaps[a][t] (and likewise for columns).
  static constexpr int64_t kTaps[2][2][2] = {{{0, 1}, {1, 3}}, {{0, 2}, {2, 3}}};  // [phase][tap] = [begin, end)
  const std::vector<float> w = conv.weight.to_floats();
  std::vector<float> folded(static_cast<size_t>(4 * out * in * 4));
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i)
          for (int64_t r = 0; r < 2; ++r)
            for (int64_t s = 0; s < 2; ++s) {
              double sum = 0;
              for (int64_t kr = kTaps[a][r][0]; kr < kTaps[a][r][1]; ++kr)
                for (int64_t ks = kTaps[b][s][0]; ks < kTaps[b][s][1]; ++ks) sum += w[((o * in + i) * 3 + kr) * 3 + ks];
              folded[(((((2 * a + b) * out + o) * in + i) * 2 + r) * 2 + s)] = static_cast<float>(sum);
            }
  phase_conv.weight = Tensor::from_floats(folded, {4 * out, in, 2, 2}, conv.weight.dtype());
  phase_conv.bias = ops::concat({conv.bias, conv.bias, conv.bias, conv.bias}, 0);
  phase_conv.padding = 1;
}

Tensor Upsample2D::forward(const Tensor& x) const {
  XDIT_CHECK(phase_conv.weight.defined(), "Upsample2D: fold_weights() was not called after binding the weights");
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  // [N, (a, b, C), H + 1, W + 1]: phase (a, b) of output pixel (2i + a, 2j + b) sits at (i + a, j + b).
  const Tensor phases = phase_conv(x).view({batch, 2, 2, channels, height + 1, width + 1});
  Tensor out = Tensor::empty({batch, channels, 2 * height, 2 * width}, x.dtype(), x.device());
  const Tensor interleaved = out.view({batch, channels, height, 2, width, 2});
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b)
      interleaved.select(5, b).select(3, a).copy_from(
          phases.select(1, a).select(1, b).narrow(2, a, height).narrow(3, b, width));
  return out;
}

void SpatialSelfAttention::bind(WeightBinder& binder, int64_t channels, int64_t groups) {
  group_norm.bind(binder, "group_norm", channels, groups);
  to_q.bind(binder, "to_q", channels, channels, true);
  to_k.bind(binder, "to_k", channels, channels, true);
  to_v.bind(binder, "to_v", channels, channels, true);
  to_out.bind(binder, "to_out.0", channels, channels, true);
}

Tensor SpatialSelfAttention::forward(const Tensor& x) const {
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t positions = height * width;
  // [B, C, H, W] -> [B, H*W, C] tokens (a view; the projections read it strided).
  const Tensor tokens = group_norm(x).view({batch, channels, positions}).transpose(1, 2);
  auto head = [&](const Linear& proj) { return proj(tokens).view({batch, positions, 1, channels}); };
  const Tensor attended = ops::attention(head(to_q), head(to_k), head(to_v)).out.view({batch, positions, channels});
  const Tensor out = to_out(attended).transpose(1, 2).view({batch, channels, height, width});
  return ops::add(out, x);
}

void UNetMidBlock2D::bind(WeightBinder& binder, int64_t channels, int64_t groups, bool add_attention) {
  resnets.resize(2);
  for (size_t i = 0; i < resnets.size(); ++i) {
    WeightBinder scope = binder.scoped(index_name("resnets", i));
    resnets[i].bind(scope, channels, channels, groups);
  }
  if (add_attention) {
    attention.emplace();
    WeightBinder scope = binder.scoped("attentions.0.");
    attention->bind(scope, channels, groups);
  }
}

Tensor UNetMidBlock2D::forward(const Tensor& x) const {
  Tensor h = resnets[0].forward(x);
  if (attention) h = attention->forward(h);
  return resnets[1].forward(h);
}

void Encoder::bind(WeightBinder& binder, const AutoencoderKLConfig& config) {
  const std::vector<int64_t>& channels = config.block_out_channels;
  const int64_t groups = config.norm_num_groups;
  conv_in.bind(binder, "conv_in", channels[0], config.in_channels, 3);
  conv_in.padding = 1;
  down_blocks.resize(channels.size());
  int64_t in = channels[0];
  for (size_t level = 0; level < channels.size(); ++level) {
    WeightBinder block = binder.scoped(index_name("down_blocks", level));
    DownEncoderBlock2D& b = down_blocks[level];
    b.resnets.resize(static_cast<size_t>(config.layers_per_block));
    for (size_t i = 0; i < b.resnets.size(); ++i) {
      WeightBinder scope = block.scoped(index_name("resnets", i));
      b.resnets[i].bind(scope, i == 0 ? in : channels[level], channels[level], groups);
    }
    if (level + 1 < channels.size()) {
      b.downsampler.emplace();
      WeightBinder scope = block.scoped("downsamplers.0.");
      b.downsampler->bind(scope, channels[level]);
    }
    in = channels[level];
  }
  WeightBinder mid = binder.scoped("mid_block.");
  mid_block.bind(mid, channels.back(), groups, config.mid_block_add_attention);
  conv_norm_out.bind(binder, "conv_norm_out", channels.back(), groups);
  conv_out.bind(binder, "conv_out", 2 * config.latent_channels, channels.back(), 3);
  conv_out.padding = 1;
}

Tensor Encoder::forward(const Tensor& image) const {
  Tensor h = conv_in(image);
  for (const DownEncoderBlock2D& block : down_blocks) {
    for (const ResnetBlock2D& resnet : block.resnets) h = resnet.forward(h);
    if (block.downsampler) h = block.downsampler->forward(h);
  }
  h = mid_block.forward(h);
  return conv_out(ops::silu(conv_norm_out(h)));
}

void Decoder::bind(WeightBinder& binder, const AutoencoderKLConfig& config) {
  // The decoder runs the levels deepest first.
  std::vector<int64_t> channels(config.decoder_block_out_channels.rbegin(), config.decoder_block_out_channels.rend());
  const int64_t groups = config.norm_num_groups;
  conv_in.bind(binder, "conv_in", channels[0], config.latent_channels, 3);
  conv_in.padding = 1;
  WeightBinder mid = binder.scoped("mid_block.");
  mid_block.bind(mid, channels[0], groups, config.mid_block_add_attention);
  up_blocks.resize(channels.size());
  int64_t in = channels[0];
  for (size_t level = 0; level < channels.size(); ++level) {
    WeightBinder block = binder.scoped(index_name("up_blocks", level));
    UpDecoderBlock2D& b = up_blocks[level];
    b.resnets.resize(static_cast<size_t>(config.layers_per_block + 1));
    for (size_t i = 0; i < b.resnets.size(); ++i) {
      WeightBinder scope = block.scoped(index_name("resnets", i));
      b.resnets[i].bind(scope, i == 0 ? in : channels[level], channels[level], groups);
    }
    if (level + 1 < channels.size()) {
      b.upsampler.emplace();
      WeightBinder scope = block.scoped("upsamplers.0.");
      b.upsampler->bind(scope, channels[level]);
    }
    in = channels[level];
  }
  conv_norm_out.bind(binder, "conv_norm_out", channels.back(), groups);
  conv_out.bind(binder, "conv_out", config.out_channels, channels.back(), 3);
  conv_out.padding = 1;
}

void Decoder::fold_weights() {
  for (UpDecoderBlock2D& block : up_blocks)
    if (block.upsampler) block.upsampler->fold_weights();
}

Tensor Decoder::forward(const Tensor& latent) const {
  Tensor h = mid_block.forward(conv_in(latent));
  for (const UpDecoderBlock2D& block : up_blocks) {
    for (const ResnetBlock2D& resnet : block.resnets) h = resnet.forward(h);
    if (block.upsampler) h = block.upsampler->forward(h);
  }
  return conv_out(ops::silu(conv_norm_out(h)));
}

// ---- AutoencoderKL

AutoencoderKL AutoencoderKL::load(const TensorSource& weights, const JsonConfig& config, DType compute_dtype) {
  XDIT_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16,
             "AutoencoderKL: compute dtype must be f32 or bf16, got ", dtype_name(compute_dtype));
  AutoencoderKL vae;
  vae.config_ = AutoencoderKLConfig::from_json(config);
  vae.compute_dtype_ = compute_dtype;
  const AutoencoderKLConfig& c = vae.config_;

  WeightBinder root(weights, "", BindOptions{compute_dtype});
  WeightBinder encoder = root.scoped("encoder.");
  vae.encoder_.bind(encoder, c);
  WeightBinder decoder = root.scoped("decoder.");
  vae.decoder_.bind(decoder, c);
  if (c.use_quant_conv) {
    vae.quant_conv_.emplace();
    vae.quant_conv_->bind(root, "quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
  }
  if (c.use_post_quant_conv) {
    vae.post_quant_conv_.emplace();
    vae.post_quant_conv_->bind(root, "post_quant_conv", c.latent_channels, c.latent_channels, 1);
  }

  // The BatchNorm statistics stay F32 whatever the compute dtype: a binder of their own.
  std::optional<WeightBinder> batch_norm;
  if (c.has_batch_norm()) {
    root.ignore("bn.");
    batch_norm.emplace(weights, "bn.", BindOptions{DType::F32});
    const int64_t width = 4 * c.latent_channels;
    batch_norm->declare("running_mean", {width}, &vae.batch_norm_mean_);
    batch_norm->declare("running_var", {width}, &vae.batch_norm_var_);
    batch_norm->ignore("num_batches_tracked");
  }
  root.finish();
  if (batch_norm) {
    batch_norm->finish();
    const std::vector<float> var = vae.batch_norm_var_.to_floats();
    XDIT_CHECK(std::all_of(var.begin(), var.end(), [](float v) { return v >= 0; }), weights.label(),
               ": bn.running_var has negative entries");
  }
  vae.decoder_.fold_weights();

  for (const std::string& name : weights.names()) {
    const TensorInfo& info = weights.info(name);
    if (!is_floating(info.dtype)) continue;
    const DType held = name.starts_with("bn.") ? DType::F32 : compute_dtype;
    vae.weight_bytes_ += static_cast<size_t>(shape_numel(info.shape)) * dtype_size(held);
  }
  for (const UpDecoderBlock2D& block : vae.decoder_.up_blocks)
    if (block.upsampler)
      vae.weight_bytes_ += block.upsampler->phase_conv.weight.nbytes() + block.upsampler->phase_conv.bias.nbytes();
  return vae;
}

Tensor AutoencoderKL::to_compute(const Tensor& x, std::string_view what, int64_t channels) const {
  XDIT_CHECK(x.defined() && x.dim() == 4 && x.size(1) == channels && x.size(2) > 0 && x.size(3) > 0,
             "AutoencoderKL::", what, ": expected [B, ", channels, ", H, W], got ",
             x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  XDIT_CHECK(is_floating(x.dtype()), "AutoencoderKL::", what, ": expected a floating tensor, got ",
             dtype_name(x.dtype()));
  return x.to(compute_dtype_);
}

Tensor AutoencoderKL::decode(const Tensor& latent) const {
  Tensor z = to_compute(latent, "decode", config_.latent_channels);
  if (post_quant_conv_) z = (*post_quant_conv_)(z);
  return decoder_.forward(z);
}

AutoencoderKL::Posterior AutoencoderKL::encode(const Tensor& image) const {
  Tensor moments = encoder_.forward(to_compute(image, "encode", config_.in_channels));
  if (quant_conv_) moments = (*quant_conv_)(moments);
  const std::vector<Tensor> halves = moments.chunk(2, 1);
  Posterior posterior;
  posterior.mean = halves[0].to(DType::F32).contiguous();
  posterior.logvar = halves[1].to(DType::F32).clone();  // clamped in place below
  XDIT_CHECK(posterior.logvar.device() == Device::cpu(), "AutoencoderKL::encode: the posterior clamp runs on the CPU");
  float* logvar = posterior.logvar.data<float>();
  for (int64_t i = 0; i < posterior.logvar.numel(); ++i) logvar[i] = std::clamp(logvar[i], kLogvarMin, kLogvarMax);
  return posterior;
}

Tensor to_unit_image(const Tensor& decoded) {
  XDIT_CHECK(decoded.defined() && decoded.dim() == 4, "to_unit_image: expected a decoded image [B, C, H, W], got ",
             decoded.defined() ? shape_str(decoded.shape()) : std::string("an undefined tensor"));
  XDIT_CHECK(is_floating(decoded.dtype()) && decoded.device() == Device::cpu(),
             "to_unit_image: expected a floating CPU tensor, got ", dtype_name(decoded.dtype()), " on ",
             device_str(decoded.device()));
  Tensor image = ops::permute_copy(decoded.to(DType::F32), {0, 2, 3, 1});
  float* pixels = image.data<float>();
  for (int64_t i = 0; i < image.numel(); ++i) pixels[i] = std::clamp(pixels[i] * 0.5f + 0.5f, 0.0f, 1.0f);
  return image;
}

}  // namespace xdit::vae
