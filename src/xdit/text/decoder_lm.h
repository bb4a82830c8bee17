// The decoder-only LM used as a text encoder: transformers' Qwen3Model (FLUX.2 klein, Z-Image) and
// MistralModel (the text model of Mistral3ForConditionalGeneration, FLUX.2 dev) run over
// right-padded prompts, returning selected hidden states instead of logits. The two differ only
// in Qwen3's per-head RMSNorm of q and k, and in their configs and weight prefixes (qwen3.h,
// mistral3.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"
#include "xdit/layers/linear.h"
#include "xdit/ops/ops.h"

namespace xdit {

struct DecoderLMConfig {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads when the config omits it
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;  // rope_parameters.rope_theta (transformers 5) or top-level rope_theta
  bool qk_norm = false;     // Qwen3: RMSNorm over each head of q and k before RoPE

  // Reads the fields Qwen3Config and MistralConfig share. Throws naming the field for missing
  // values and for features this encoder does not implement (an activation other than SiLU,
  // attention bias, sliding windows, scaled RoPE).
  static DecoderLMConfig from_json(const JsonConfig& config, bool qk_norm);
};

struct DecoderLMOptions {
  DType compute_dtype = DType::F32;  // F32 or BF16; weights stored otherwise are converted
  bool fp8_linear = false;           // every projection as FP8 e4m3 with per-channel scales
};

// Where the decoder's tensors sit in a checkpoint.
struct DecoderLMCheckpoint {
  std::string model_prefix;                  // "model." (Qwen3ForCausalLM), "language_model.model." (Mistral3)
  std::vector<std::string> unused_prefixes;  // the checkpoint's other tensors, accepted and left unloaded
};

// transformers' Qwen3DecoderLayer / MistralDecoderLayer: pre-norm attention and SwiGLU MLP.
struct DecoderLayer {
  struct SelfAttention {
    Linear q_proj, k_proj, v_proj, o_proj;
    Tensor q_norm, k_norm;  // [head_dim], only with qk_norm
  };
  struct Mlp {
    Linear gate_proj, up_proj, down_proj;
  };
  Tensor input_layernorm, post_attention_layernorm;
  SelfAttention self_attn;
  Mlp mlp;

  void bind(WeightBinder& layer, const DecoderLMConfig& config);
  // x [B, S, hidden]; mask [B, S] I32 (1 = token). Causal attention over the unmasked keys.
  Tensor forward(const Tensor& x, const ops::RopeTable& rope, const Tensor& mask, const DecoderLMConfig& config) const;
  size_t weight_bytes() const;
};

class DecoderLM {
 public:
  // Binds what hidden_states[deepest_tap] needs: the embeddings, layers 0..deepest_tap-1, and the
  // final norm only when deepest_tap == num_hidden_layers. The checkpoint's later layers and its
  // unused prefixes are accepted and not loaded; anything else is reported by name.
  static DecoderLM load(const TensorSource& weights, const DecoderLMConfig& config,
                        const DecoderLMCheckpoint& checkpoint, int deepest_tap, const DecoderLMOptions& options);

  const DecoderLMConfig& config() const { return config_; }
  DType compute_dtype() const { return options_.compute_dtype; }
  int loaded_layers() const { return static_cast<int>(layers_.size()); }
  size_t weight_bytes() const;  // the weights as held now (after any conversion or FP8)

  // ids [B, S] I64/I32, mask [B, S] I32/I64 (1 = token, 0 = padding; right padding only). Returns
  // hidden_states[t] for each t of `taps` (HF numbering: 0 = embeddings, k = output of layer k-1,
  // num_hidden_layers = the final-normed output), concatenated per token: [B, S, taps * hidden] in
  // the compute dtype.
  Tensor hidden_states_stacked(const Tensor& ids, const Tensor& mask, const std::vector<int>& taps) const;

 private:
  Tensor embed(const Tensor& ids) const;

  DecoderLMConfig config_;
  DecoderLMOptions options_;
  Tensor embed_tokens_;
  std::vector<DecoderLayer> layers_;
  Tensor norm_;  // undefined unless loaded
};

}  // namespace xdit
