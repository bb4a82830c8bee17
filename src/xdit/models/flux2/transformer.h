// FLUX.2 DiT: diffusers' Flux2Transformer2DModel (klein without, dev with the guidance embedder).
//
//   temb = timestep_embedder(sinusoid(1000 t)) [+ guidance_embedder(sinusoid(1000 g))]
//   img = x_embedder(latents), txt = context_embedder(text features)
//   double blocks (separate img/txt weights, joint attention over [txt; img]), then single blocks
//   over the concatenated stream, then the image tokens through norm_out (AdaLN) and proj_out.
//
// Modulation is global: one projection of temb per stream type, shared by every block. Nothing
// has a bias. Text tokens are attended without a mask (diffusers passes none, padding included).
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"
#include "xdit/layers/linear.h"
#include "xdit/ops/ops.h"

namespace xdit::flux2 {

// The fields of diffusers' config.json, with diffusers' defaults.
struct TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;  // in_channels when the config gives null
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope{32, 32, 32, 32};
  double rope_theta = 2000.0;
  double eps = 1e-6;
  bool guidance_embeds = true;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t mlp_hidden_dim() const;  // int(inner_dim * mlp_ratio), as diffusers truncates it
  int64_t proj_out_channels() const { return patch_size * patch_size * out_channels; }

  // Throws naming the field for missing, ill-typed or unsupported values.
  static TransformerConfig from_json(const JsonConfig& config);
};

struct TransformerLoadOptions {
  DType compute_dtype = DType::F32;  // F32 or BF16; weights stored otherwise are converted
  // Quantizes the Linears of the blocks and of x_embedder/context_embedder to FP8 e4m3 with
  // per-output-channel scales. The conditioning path (time/guidance embedding, modulation,
  // norm_out, proj_out) keeps the compute dtype: it runs on a single row (or the output) and its
  // error would scale every block.
  bool fp8_linear = false;
};

// The sizes a block needs.
struct BlockShape {
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t mlp_hidden_dim = 0;
  float eps = 1e-6f;
};

// One shift/scale/gate set, each [B, 1, D] (views of the modulation projection).
struct ModulationParams {
  Tensor shift, scale, gate;
};

// Flux2TimestepGuidanceEmbeddings' TimestepEmbedding: linear_2(silu(linear_1(x))).
struct TimestepEmbedding {
  Linear linear_1, linear_2;
  void bind(WeightBinder& binder, int64_t in_channels, int64_t dim);
  Tensor operator()(const Tensor& projection) const;
};

// Flux2Modulation: linear(silu(temb)) -> [B, 3 * D * param_sets], chunked shift, scale, gate.
struct Modulation {
  Linear linear;
  int64_t param_sets = 1;
  void bind(WeightBinder& binder, int64_t dim, int64_t sets);
  std::vector<ModulationParams> operator()(const Tensor& temb) const;
};

// Flux2FeedForward: linear_out(SwiGLU(linear_in(x))), linear_in producing [gate | value].
struct FeedForward {
  Linear linear_in, linear_out;
  void bind(WeightBinder& binder, int64_t dim, int64_t hidden);
  Tensor operator()(const Tensor& x) const;
  void quantize_fp8();
};

// Flux2TransformerBlock: image and text streams with their own weights, one joint attention.
struct TransformerBlock {
  struct Attention {                  // Flux2Attention with added (text) projections
    Linear to_q, to_k, to_v, to_out;  // to_out is diffusers' to_out.0
    Tensor norm_q, norm_k;            // per-head RMSNorm weights [head_dim]
    Linear add_q_proj, add_k_proj, add_v_proj, to_add_out;
    Tensor norm_added_q, norm_added_k;
  };
  Attention attn;
  FeedForward ff, ff_context;
  BlockShape shape;

  void bind(WeightBinder& binder, const BlockShape& block_shape);
  void quantize_fp8();
  // hidden_states [B, N_img, D], encoder_hidden_states [B, N_txt, D]; `img` and `txt` hold the
  // attention and feed-forward modulation of each stream; rope covers [txt; img].
  // Returns {encoder_hidden_states, hidden_states} like diffusers.
  std::pair<Tensor, Tensor> forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states,
                                    const std::array<ModulationParams, 2>& img,
                                    const std::array<ModulationParams, 2>& txt, const ops::RopeTable& rope) const;
};

// Flux2SingleTransformerBlock: attention and SwiGLU MLP in parallel, fused input and output projections.
struct SingleTransformerBlock {
  struct Attention {         // Flux2ParallelSelfAttention
    Linear to_qkv_mlp_proj;  // D -> 3D (q, k, v) + 2 * mlp_hidden (SwiGLU gate and value)
    Tensor norm_q, norm_k;
    Linear to_out;  // D + mlp_hidden -> D
  };
  Attention attn;
  BlockShape shape;

  void bind(WeightBinder& binder, const BlockShape& block_shape);
  void quantize_fp8();
  // hidden_states [B, N_txt + N_img, D] (text first); rope covers the same tokens.
  Tensor forward(const Tensor& hidden_states, const ModulationParams& mod, const ops::RopeTable& rope) const;
  // The same block when only the image rows of its output are used (the last block: the model
  // drops the text rows after it). The text rows then contribute keys and values only, which
  // skips their queries, MLP and output projection. Returns [B, N_img, D].
  Tensor forward_image_rows(const Tensor& hidden_states, int64_t text_tokens, const ModulationParams& mod,
                            const ops::RopeTable& rope) const;
};

// The per-forward conditioning: temb and the global modulation derived from it.
struct Conditioning {
  Tensor temb;                               // [B, D]
  std::array<ModulationParams, 2> img, txt;  // double blocks: attention, then feed-forward
  ModulationParams single;                   // single blocks
};

class Transformer {
 public:
  // Binds every tensor by its diffusers name (all problems reported at once, naming the tensor).
  // `weights` may be a checkpoint or tensors in memory (TensorMap); tensors already in the
  // compute dtype are held as zero-copy views of it.
  static Transformer load(const TensorSource& weights, const JsonConfig& config, const TransformerLoadOptions& options);

  const TransformerConfig& config() const { return config_; }
  DType compute_dtype() const { return compute_dtype_; }

  // RoPE tables for the joint sequence [txt; img], computed once per generation. ids are
  // [S, 4] or [B, S, 4] I64/I32 as the pipeline builds them; like diffusers, only batch row 0 is used.
  ops::RopeTable rope(const Tensor& txt_ids, const Tensor& img_ids) const;

  // hidden_states [B, N_img, in_channels], encoder_hidden_states [B, N_txt, joint_attention_dim],
  // timestep [B] (sigma: the pipeline passes t / 1000), guidance [B] or undefined (required iff
  // the config has a guidance embedder). Returns [B, N_img, patch_size² · out_channels] in the
  // compute dtype.
  Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& timestep,
                 const Tensor& guidance, const ops::RopeTable& rope) const;

  // The pieces of forward, for benchmarks and tools.
  Conditioning condition(const Tensor& timestep, const Tensor& guidance) const;
  const std::vector<TransformerBlock>& transformer_blocks() const { return transformer_blocks_; }
  const std::vector<SingleTransformerBlock>& single_transformer_blocks() const { return single_transformer_blocks_; }

  size_t weight_bytes() const;  // resident weight bytes as held now

 private:
  Tensor time_guidance_embed(const Tensor& timestep, const Tensor& guidance) const;

  TransformerConfig config_;
  DType compute_dtype_ = DType::F32;
  TimestepEmbedding timestep_embedder_;
  TimestepEmbedding guidance_embedder_;  // unbound without guidance_embeds
  Modulation double_stream_modulation_img_, double_stream_modulation_txt_, single_stream_modulation_;
  Linear x_embedder_, context_embedder_;
  std::vector<TransformerBlock> transformer_blocks_;
  std::vector<SingleTransformerBlock> single_transformer_blocks_;
  Linear norm_out_linear_;  // AdaLayerNormContinuous: emb -> [scale | shift]
  Linear proj_out_;
};

}  // namespace xdit::flux2
