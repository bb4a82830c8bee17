// FLUX.2's text conditioning: prompt strings to the transformer's encoder_hidden_states, as
// diffusers' Flux2KleinPipeline (Qwen3, hidden states 9, 18, 27) and Flux2Pipeline (Mistral3's
// text model, hidden states 10, 20, 30) compute them in encode_prompt.
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

namespace xdit::flux2 {

// Flux2Pipeline's SYSTEM_MESSAGE (diffusers pipelines/flux2/system_messages.py), line break included.
inline constexpr std::string_view kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

struct TextEncoderOptions {
  DType compute_dtype = DType::F32;
  bool fp8_linear = false;  // --use_fp8_text_encoder: every decoder projection as FP8 e4m3 per channel
  int64_t max_sequence_length = 512;
  std::vector<int> taps;  // hidden states to stack; empty = the family default
};

// Owns the tokenizer and the encoder. The pipeline destroys it before the transformer runs, which
// releases the encoder weights and the mapping of their file.
class TextConditioning {
 public:
  enum class Encoder { Qwen3, Mistral3 };

  // Picks Qwen3 (klein) or Mistral3 (dev) by the text_encoder class in model_index.json; other
  // classes are refused naming the class. Reads tokenizer/tokenizer.json and
  // tokenizer/tokenizer_config.json (pad and bos tokens) and the text encoder's config and
  // weights, loading only the layers the deepest tap needs.
  static TextConditioning load(const DiffusersRepo& repo, const TextEncoderOptions& options);

  struct Encoded {
    Tensor prompt_embeds;                     // [B, L, taps * hidden] in the compute dtype; L = max_sequence_length
    Tensor text_ids;                          // [B, L, 4] I64: (0, 0, 0, l), prepare_text_ids (position_ids.h)
    std::vector<int64_t> untruncated_tokens;  // each prompt's token count before truncation
  };

  // A prompt longer than max_sequence_length is truncated, with a one-line warning on stderr
  // naming the prompt's index, its token count and the limit.
  Encoded encode(const std::vector<std::string>& prompts) const;

  // The steps of encode(), for tests and tools:
  // the chat-formatted text the pipeline tokenizes for one prompt;
  std::string format(std::string_view prompt) const;
  // the formatted prompts' ids, truncated and right-padded to max_sequence_length;
  PaddedTokens tokenize(const std::vector<std::string>& prompts) const;
  // the encoder's stacked hidden states for those ids: [B, L, taps * hidden].
  Tensor prompt_embeds(const PaddedTokens& tokens) const;

  Encoder encoder_kind() const { return kind_; }
  const std::vector<int>& taps() const { return taps_; }
  int64_t max_sequence_length() const { return max_sequence_length_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const DecoderLM& encoder() const { return encoder_; }
  size_t weight_bytes() const { return encoder_.weight_bytes(); }

 private:
  TextConditioning(Encoder kind, Tokenizer tokenizer, int64_t pad_id, std::string bos_token, DecoderLM encoder,
                   std::vector<int> taps, int64_t max_sequence_length);

  Encoder kind_;
  Tokenizer tokenizer_;
  int64_t pad_id_;
  std::string bos_token_;  // Mistral's template starts with it
  DecoderLM encoder_;
  std::vector<int> taps_;
  int64_t max_sequence_length_;
};

}  // namespace xdit::flux2
