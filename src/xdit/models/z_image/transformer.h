// Z-Image DiT: diffusers' ZImageTransformer2DModel (basic mode: one image per batch item).
//
//   adaln   = t_embedder(sinusoid(t_scale · t))   256 wide; no SiLU before the blocks' modulation
//   img     = all_x_embedder["2-1"](patches), padded to a multiple of 32 with x_pad_token
//   img     = noise_refiner(img)                  modulated blocks
//   cap     = cap_embedder(cap_feats), padded to a multiple of 32 with cap_pad_token
//   cap     = context_refiner(cap)                unmodulated blocks
//   unified = layers([img; cap])                  single stream, modulated
//   out     = all_final_layer["2-1"](unified)[image tokens], unpatchified
//
// Every block uses sandwich RMSNorms: x += tanh(g) · norm2(f(norm1(x) · (1 + s))). Pad tokens are attended; only the
// batch padding (items of different lengths) is masked out of attention.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"
#include "xdit/layers/linear.h"
#include "xdit/ops/ops.h"

namespace xdit::z_image {

// The fields of diffusers' config.json, with diffusers' defaults.
struct TransformerConfig {
  std::vector<int64_t> all_patch_size{2};
  std::vector<int64_t> all_f_patch_size{1};
  int64_t in_channels = 16;
  int64_t dim = 3840;
  int64_t n_layers = 30;
  int64_t n_refiner_layers = 2;
  int64_t n_heads = 30;
  int64_t n_kv_heads = 30;  // read but unused, like diffusers: keys and values have n_heads heads
  double norm_eps = 1e-5;
  bool qk_norm = true;
  int64_t cap_feat_dim = 2560;
  double rope_theta = 256.0;
  double t_scale = 1000.0;
  std::vector<int64_t> axes_dims{32, 48, 48};
  std::vector<int64_t> axes_lens{1024, 512, 512};

  int64_t patch_size() const { return all_patch_size.front(); }
  int64_t f_patch_size() const { return all_f_patch_size.front(); }
  int64_t head_dim() const { return dim / n_heads; }
  int64_t ffn_hidden_dim() const;                                    // int(dim / 3 * 8), as diffusers truncates it
  int64_t adaln_embed_dim() const { return dim < 256 ? dim : 256; }  // min(dim, ADALN_EMBED_DIM)
  int64_t out_channels() const { return in_channels; }
  int64_t patch_features() const { return f_patch_size() * patch_size() * patch_size() * in_channels; }

  // Throws naming the field for missing, ill-typed or unsupported values.
  static TransformerConfig from_json(const JsonConfig& config);
};

struct TransformerLoadOptions {
  DType compute_dtype = DType::F32;  // F32 or BF16; weights stored otherwise are converted
  // Quantizes the Linears of the blocks and the x/caption embedders to FP8 e4m3 with per-output-channel scales. The
  // conditioning path (t_embedder, adaLN modulations, final layer) keeps the compute dtype: it is tiny and its error
  // would scale every block.
  bool fp8_linear = false;
};

// The sizes a block needs.
struct BlockShape {
  int64_t dim = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_hidden_dim = 0;
  float norm_eps = 1e-5f;
  bool qk_norm = true;
};

// One block's adaLN output as used: 1 + scale and tanh(gate), each [B, 1, D] in the compute dtype.
struct BlockModulation {
  Tensor scale_msa, gate_msa, scale_mlp, gate_mlp;
};

// The positions of one batch of sequences: per item, a [S_max, head_dim / 2] RoPE table (rows past the item's length
// are zero, like diffusers' padded freqs_cis), and the key mask when the lengths differ.
struct SequenceLayout {
  std::vector<int64_t> lengths;      // tokens of each item
  std::vector<ops::RopeTable> rope;  // one table per item
  Tensor key_padding_mask;           // [B, S_max] I32, undefined when every item is S_max
                                     // long
};

// FeedForward: w2(silu(w1 x) · w3 x). w1 and w3 stay separate so that bf16 checkpoints bind as zero-copy views of the
// file (a fused copy would pin ~5 GB of the full model in anonymous memory).
struct FeedForward {
  Linear w1, w2, w3;
  void bind(WeightBinder& binder, int64_t dim, int64_t hidden);
  void quantize_fp8();
  Tensor operator()(const Tensor& x) const;
};

// ZImageTransformerBlock; `modulation` false for the context refiner.
struct TransformerBlock {
  struct Attention {                  // diffusers Attention with ZSingleStreamAttnProcessor
    Linear to_q, to_k, to_v, to_out;  // to_out is diffusers' to_out.0
    Tensor norm_q, norm_k;            // per-head RMSNorm weights [head_dim], undefined
                                      // without qk_norm
  };
  Attention attention;
  FeedForward feed_forward;
  Tensor attention_norm1, attention_norm2, ffn_norm1,
      ffn_norm2;            // RMSNorm weights [D]
  Linear adaLN_modulation;  // adaLN_modulation.0: adaln_embed_dim -> 4D, unbound
                            // without modulation
  bool modulation = true;
  BlockShape shape;

  void bind(WeightBinder& binder, const BlockShape& block_shape, int64_t adaln_embed_dim, bool modulated);
  void quantize_fp8();
  // adaln_input [B, adaln_embed_dim] -> the block's scale/gate set (modulated blocks only).
  BlockModulation modulate(const Tensor& adaln_input) const;
  // x [B, S, D]; `mod` is null for unmodulated blocks.
  Tensor forward(const Tensor& x, const SequenceLayout& layout, const BlockModulation* mod) const;
};

class Transformer {
 public:
  // Binds every tensor by its diffusers name (all problems reported at once, naming the tensor).
  static Transformer load(const TensorSource& weights, const JsonConfig& config, const TransformerLoadOptions& options);

  const TransformerConfig& config() const { return config_; }
  DType compute_dtype() const { return compute_dtype_; }

  // Mirrors diffusers' forward(x, t, cap_feats): x[i] is one latent [C, F, H, W] (F = 1 for images), cap_feats[i]
  // its caption features [L_i, cap_feat_dim] (valid tokens only), t [B] f32 as the pipeline passes it,
  // (1000 - timestep) / 1000. Returns one [C, F, H, W] per item in the compute dtype (the pipeline negates it).
  std::vector<Tensor> forward(const std::vector<Tensor>& x, const Tensor& t,
                              const std::vector<Tensor>& cap_feats) const;

  // The pieces of forward, for benchmarks and tools.
  Tensor t_embed(const Tensor& t) const;  // [B] -> adaln_input [B, adaln_embed_dim]
  // A layout for sequences whose token i of item b sits at positions[b][i] (f, h, w).
  SequenceLayout layout(const std::vector<std::vector<std::array<int64_t, 3>>>& positions) const;
  const std::vector<TransformerBlock>& layers() const { return layers_; }

  size_t weight_bytes() const;  // resident weight bytes as held now

 private:
  TransformerConfig config_;
  DType compute_dtype_ = DType::F32;
  Linear t_embedder_mlp_0_, t_embedder_mlp_2_;  // t_embedder.mlp.{0,2}
  Tensor cap_embedder_norm_;                    // cap_embedder.0 (RMSNorm weight)
  Linear cap_embedder_linear_;                  // cap_embedder.1
  Linear x_embedder_;                           // all_x_embedder.<p>-<f>
  Tensor x_pad_token_, cap_pad_token_;          // [1, D]
  std::vector<TransformerBlock> noise_refiner_, context_refiner_, layers_;
  Linear final_adaLN_modulation_;  // all_final_layer.<p>-<f>.adaLN_modulation.1 (after a SiLU)
  Linear final_linear_;            // all_final_layer.<p>-<f>.linear
};

}  // namespace xdit::z_image
