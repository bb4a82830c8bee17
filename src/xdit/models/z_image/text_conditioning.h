// Z-Image's text conditioning: prompt strings to the transformer's caption features, as diffusers'
// ZImagePipeline computes them in _encode_prompt. Qwen3's chat template with enable_thinking=True,
// hidden_states[-2] of a Qwen3Model (so its last layer never runs), and only each prompt's valid
// tokens, one [L_i, hidden] tensor per prompt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/diffusers.h"
#include "xdit/text/decoder_lm.h"
#include "xdit/text/tokenizer.h"

namespace xdit::z_image {

struct TextEncoderOptions {
  DType compute_dtype = DType::F32;
  bool fp8_linear = false;  // --use_fp8_text_encoder: every decoder projection as FP8 e4m3 per channel
  int64_t max_sequence_length = 512;
};

// Owns the tokenizer and the encoder. The pipeline destroys it before the transformer runs, which
// releases the encoder weights and the mapping of their file.
class TextConditioning {
 public:
  // The text encoder must be a Qwen3Model or Qwen3ForCausalLM; its weights may be stored with or
  // without the "model." prefix, as transformers accepts both. Reads tokenizer/tokenizer.json and
  // tokenizer/tokenizer_config.json (the pad token) and loads the layers below the last one.
  static TextConditioning load(const DiffusersRepo& repo, const TextEncoderOptions& options);

  // Each prompt's caption features: [valid tokens, hidden] in the compute dtype. A prompt longer
  // than max_sequence_length is truncated, with a one-line warning on stderr naming the prompt's
  // index, its token count and the limit.
  std::vector<Tensor> encode(const std::vector<std::string>& prompts) const;

  // The steps of encode(), for tests and tools:
  // the chat-formatted text the pipeline tokenizes for one prompt;
  std::string format(std::string_view prompt) const;
  // the formatted prompts' ids, truncated and right-padded to max_sequence_length;
  PaddedTokens tokenize(const std::vector<std::string>& prompts) const;
  // hidden_states[-2] of each row's valid tokens. Runs only up to the longest row: with causal
  // attention over right-padded rows, the padding never reaches a valid token.
  std::vector<Tensor> prompt_embeds(const PaddedTokens& tokens) const;

  int hidden_state_index() const { return hidden_state_index_; }  // num_hidden_layers - 1
  int64_t max_sequence_length() const { return max_sequence_length_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const DecoderLM& encoder() const { return encoder_; }
  size_t weight_bytes() const { return encoder_.weight_bytes(); }

 private:
  TextConditioning(Tokenizer tokenizer, int64_t pad_id, DecoderLM encoder, int hidden_state_index,
                   int64_t max_sequence_length);

  Tokenizer tokenizer_;
  int64_t pad_id_;
  DecoderLM encoder_;
  int hidden_state_index_;
  int64_t max_sequence_length_;
};

}  // namespace xdit::z_image
