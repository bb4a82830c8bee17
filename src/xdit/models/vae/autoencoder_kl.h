// The 2D KL autoencoder shared by FLUX.2 (diffusers' AutoencoderKLFlux2), Z-Image and SD3.5
// (AutoencoderKL): a convolutional Encoder and Decoder (ResnetBlock2D levels with GroupNorm + SiLU,
// a mid block with single-head spatial self-attention), optional 1x1 quant/post-quant convs, a
// diagonal Gaussian posterior, and for FLUX.2 the BatchNorm running statistics its pipelines
// normalise the 2x2-patchified latents with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"
#include "xdit/layers/linear.h"

namespace xdit::vae {

struct AutoencoderKLConfig {
  std::string class_name;  // "AutoencoderKL" or "AutoencoderKLFlux2"
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels;          // encoder levels, shallowest first
  std::vector<int64_t> decoder_block_out_channels;  // block_out_channels unless the config sets it
  int64_t layers_per_block = 0;
  int64_t latent_channels = 0;
  int64_t norm_num_groups = 32;
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  // The pipelines' latent transform: diffusion latent = (raw - shift_factor) * scaling_factor.
  // AutoencoderKLFlux2 has neither (1 and 0 here); its pipelines use the BatchNorm statistics.
  double scaling_factor = 1.0;
  double shift_factor = 0.0;
  double batch_norm_eps = 1e-4;  // AutoencoderKLFlux2 only
  // The picture side the VAE was configured for, when its config says (diffusers' sample_size).
  std::optional<int64_t> sample_size;

  bool has_batch_norm() const { return class_name == "AutoencoderKLFlux2"; }
  // Image pixels per latent pixel along each axis: 2^(levels - 1).
  int64_t spatial_scale() const { return int64_t{1} << (block_out_channels.size() - 1); }

  // Starts from the class's diffusers defaults. Throws naming the field for a missing or invalid
  // value and for options this implementation does not have (other block types or activations,
  // latents_mean/latents_std, a patch size other than 2x2).
  static AutoencoderKLConfig from_json(const JsonConfig& config);
};

// nn.Conv2d: weight [out, in, k, k] and bias [out], symmetric padding.
struct Conv2d {
  Tensor weight;
  Tensor bias;
  int64_t stride = 1;
  int64_t padding = 0;

  void bind(WeightBinder& binder, std::string_view name, int64_t out_channels, int64_t in_channels, int64_t kernel);
  Tensor operator()(const Tensor& x) const;
};

// nn.GroupNorm with affine weight and bias over x [N, C, H, W].
struct GroupNorm {
  Tensor weight;
  Tensor bias;
  int64_t groups = 0;
  float eps = 1e-6f;  // every GroupNorm of the Encoder and Decoder

  void bind(WeightBinder& binder, std::string_view name, int64_t channels, int64_t groups);
  Tensor operator()(const Tensor& x) const;
};

// diffusers' ResnetBlock2D without time embedding: x + conv2(silu(norm2(conv1(silu(norm1(x)))))
// with a 1x1 conv_shortcut on x when the channel count changes.
struct ResnetBlock2D {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2;
  std::optional<Conv2d> conv_shortcut;

  void bind(WeightBinder& binder, int64_t in_channels, int64_t out_channels, int64_t groups);
  Tensor forward(const Tensor& x) const;
};

// Downsample2D as the VAE encoder uses it: pad right and bottom by one, then a 3x3 stride-2 conv.
struct Downsample2D {
  Conv2d conv;

  void bind(WeightBinder& binder, int64_t channels);
  Tensor forward(const Tensor& x) const;
};

// Upsample2D: nearest-neighbour x2, then a 3x3 conv. Run as its sub-pixel equivalent: each of
// the four output phases (row parity a, column parity b) of a 3x3 conv over a nearest-upsampled
// image only ever sees 2x2 distinct input pixels, so one 2x2 conv over the small input with
// 4x the output channels, interleaved, gives the same result with 16/36 of the multiply-adds.
struct Upsample2D {
  Conv2d conv;        // the diffusers weights, [C, C, 3, 3]
  Conv2d phase_conv;  // [4C, C, 2, 2], padding 1: phase 2a + b in output channels [(2a + b) C, (2a + b + 1) C)

  void bind(WeightBinder& binder, int64_t channels);
  // Builds phase_conv from conv once the weights are bound.
  void fold_weights();
  Tensor forward(const Tensor& x) const;
};

// The mid block's Attention: one head as wide as the channels over all H*W positions, applied to
// group-normed x, with a residual connection.
struct SpatialSelfAttention {
  GroupNorm group_norm;
  Linear to_q, to_k, to_v, to_out;  // to_out is diffusers' to_out.0

  void bind(WeightBinder& binder, int64_t channels, int64_t groups);
  Tensor forward(const Tensor& x) const;
};

// UNetMidBlock2D: resnets[0], then (attentions[i], resnets[i + 1]) pairs.
struct UNetMidBlock2D {
  std::vector<ResnetBlock2D> resnets;
  std::optional<SpatialSelfAttention> attention;  // attentions.0 unless mid_block_add_attention is false

  void bind(WeightBinder& binder, int64_t channels, int64_t groups, bool add_attention);
  Tensor forward(const Tensor& x) const;
};

// DownEncoderBlock2D and UpDecoderBlock2D: resnets, then an optional resampler.
struct DownEncoderBlock2D {
  std::vector<ResnetBlock2D> resnets;
  std::optional<Downsample2D> downsampler;  // downsamplers.0
};
struct UpDecoderBlock2D {
  std::vector<ResnetBlock2D> resnets;
  std::optional<Upsample2D> upsampler;  // upsamplers.0
};

struct Encoder {
  Conv2d conv_in;
  std::vector<DownEncoderBlock2D> down_blocks;
  UNetMidBlock2D mid_block;
  GroupNorm conv_norm_out;
  Conv2d conv_out;  // to 2 * latent_channels (mean and logvar)

  void bind(WeightBinder& binder, const AutoencoderKLConfig& config);
  Tensor forward(const Tensor& image) const;
};

struct Decoder {
  Conv2d conv_in;
  UNetMidBlock2D mid_block;
  std::vector<UpDecoderBlock2D> up_blocks;
  GroupNorm conv_norm_out;
  Conv2d conv_out;

  void bind(WeightBinder& binder, const AutoencoderKLConfig& config);
  // Derived weights (the upsamplers' phase convs); call once after the binder's finish().
  void fold_weights();
  Tensor forward(const Tensor& latent) const;
};

class AutoencoderKL {
 public:
  // Binds every tensor of the checkpoint by its diffusers name, converted to `compute_dtype` (F32
  // or BF16) where stored otherwise; the BatchNorm statistics of AutoencoderKLFlux2 stay F32.
  static AutoencoderKL load(const TensorSource& weights, const JsonConfig& config, DType compute_dtype);

  // latent [B, latent_channels, h, w], a raw VAE latent (no scaling, shift or BatchNorm applied)
  // -> image [B, out_channels, h * s, w * s] in the compute dtype, unclamped (about [-1, 1]),
  // s = config().spatial_scale().
  Tensor decode(const Tensor& latent) const;

  // The diagonal Gaussian posterior, F32 [B, latent_channels, H / s, W / s]; logvar clamped to
  // [-30, 20]. `mean` is the latent diffusers' argmax sampling returns.
  struct Posterior {
    Tensor mean;
    Tensor logvar;
  };
  // image [B, in_channels, H, W] in [-1, 1].
  Posterior encode(const Tensor& image) const;

  const AutoencoderKLConfig& config() const { return config_; }
  DType compute_dtype() const { return compute_dtype_; }
  // bn.running_mean / bn.running_var, F32 [4 * latent_channels]; undefined unless has_batch_norm().
  const Tensor& batch_norm_mean() const { return batch_norm_mean_; }
  const Tensor& batch_norm_var() const { return batch_norm_var_; }
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  Tensor to_compute(const Tensor& x, std::string_view what, int64_t channels) const;

  AutoencoderKLConfig config_;
  DType compute_dtype_ = DType::F32;
  Encoder encoder_;
  Decoder decoder_;
  std::optional<Conv2d> quant_conv_, post_quant_conv_;
  Tensor batch_norm_mean_, batch_norm_var_;
  size_t weight_bytes_ = 0;
};

// VaeImageProcessor.postprocess(output_type="np"): decoded [B, C, H, W] (any float dtype, CPU)
// -> F32 [B, H, W, C] with (x / 2 + 0.5) clamped to [0, 1].
Tensor to_unit_image(const Tensor& decoded);

}  // namespace xdit::vae
