// The Qwen3 decoder LM used as a text encoder (FLUX.2 klein): transformers' Qwen3Model run over
// right-padded prompts, returning selected hidden states instead of logits.
#pragma once

#include <cstdint>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/ops/ops.h"

namespace xdit {

struct Qwen3Config {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads when the config omits it
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;  // rope_parameters.rope_theta (transformers 5) or top-level rope_theta

  // Throws naming the field for missing values and for features this encoder does not implement
  // (attention bias, sliding windows, scaled RoPE).
  static Qwen3Config from_json(const JsonConfig& config);
};

class Qwen3Encoder {
 public:
  // Binds the weights that hidden_states[deepest_tap] needs: the embeddings, layers
  // 0..deepest_tap-1, and the final norm only when deepest_tap == num_hidden_layers. The other
  // tensors (later layers, lm_head) are accepted and left unloaded. Weights are converted to
  // `compute_dtype` (F32 or BF16) where stored otherwise.
  static Qwen3Encoder load(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                           DType compute_dtype);

  const Qwen3Config& config() const { return config_; }

  // ids [B, S] I64/I32, mask [B, S] I32/I64 (1 = token, 0 = padding). Returns hidden_states[t]
  // for each t of `taps` (HF numbering: 0 = embeddings, k = output of layer k-1, and
  // num_hidden_layers = the final-normed output), concatenated per token: [B, S, taps * hidden].
  Tensor hidden_states_stacked(const Tensor& ids, const Tensor& mask, const std::vector<int>& taps) const;

 private:
  struct Layer {
    Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    Tensor post_attention_norm, gate_proj, up_proj, down_proj;
  };

  Tensor embed(const Tensor& ids) const;
  Tensor run_layer(const Layer& layer, const Tensor& x, const ops::RopeTable& rope, const Tensor& mask) const;

  Qwen3Config config_;
  DType compute_dtype_ = DType::F32;
  Tensor embed_tokens_;
  std::vector<Layer> layers_;
  Tensor final_norm_;  // undefined unless loaded
};

}  // namespace xdit
