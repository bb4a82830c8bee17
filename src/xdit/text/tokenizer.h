// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (the Qwen2 tokenizer used by
// FLUX.2 klein, Z-Image and Qwen-Image; Mistral's Tekken used by FLUX.2 dev). Encoding follows the
// `tokenizers` library: added tokens are split out first, the rest is NFC-normalised when the
// file says so, pre-tokenized (regex Split and/or ByteLevel), mapped through the GPT-2
// byte-to-unicode table and merged by rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/tensor.h"

namespace xdit {

// What a tokenizer_config.json (transformers' side of the tokenizer) says about special tokens
// and padding.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token;
  std::string padding_side = "right";     // "left" or "right"
  std::string truncation_side = "right";  // "left" or "right"
  // The longest input the tokenizer declares; absent for none, or for transformers' "no limit"
  // (it writes int(1e30), beyond any integer type).
  std::optional<int64_t> model_max_length;

  // Reads the token fields, given as strings or as {"content": ...} objects, the sides and
  // model_max_length. Throws naming the path (and the field) for a missing or malformed file.
  static TokenizerConfig load(const std::filesystem::path& path);
};

// Token ids of a batch of texts as transformers' tokenizer(texts, padding="max_length",
// truncation=True, max_length=L) returns them: each row cut to L tokens, then right-padded.
struct PaddedTokens {
  Tensor input_ids;       // [B, L] I64
  Tensor attention_mask;  // [B, L] I64: 1 for tokens, 0 for padding
  std::vector<int64_t> untruncated_tokens;  // each text's token count before truncation
};

class Tokenizer;

// The id of `config`'s pad token (read from config_path), after checking that the tokenizer pads
// and truncates on the right: the text encoders take the positions of right-padded prompts.
int64_t right_padding_id(const Tokenizer& tokenizer, const TokenizerConfig& config,
                         const std::filesystem::path& config_path);

// One warning line on stderr for every text that had more than max_length tokens.
void warn_truncated_prompts(const PaddedTokens& tokens, int64_t max_length);

class Tokenizer {
 public:
  // Throws xdit::Error naming the path and the field for anything unreadable or unsupported.
  static Tokenizer load(const std::filesystem::path& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8 (throws otherwise). Thread-safe.
  std::vector<int64_t> encode(std::string_view text) const;
  // The same ids, cut to at most `max_length`.
  std::vector<int64_t> encode(std::string_view text, size_t max_length) const;
  // `ids` inside the post-processor's single-sequence template (e.g. "<s> $A" for Tekken), as
  // add_special_tokens=True does; unchanged when the tokenizer has no such template.
  std::vector<int64_t> with_special_tokens(std::span<const int64_t> ids) const;
  // encode() of each text (no special tokens, as apply_chat_template tokenizes), truncated to
  // `length` and padded with `pad_id`.
  PaddedTokens encode_padded(const std::vector<std::string>& texts, size_t length, int64_t pad_id) const;
  // Concatenates the tokens' bytes (added tokens as their content); throws on an unknown id or
  // when the bytes are not valid UTF-8.
  std::string decode(std::span<const int64_t> ids) const;

  // The id of a vocabulary or added token; throws naming it when absent.
  int64_t token_id(std::string_view token) const;
  // One past the largest id.
  int64_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace xdit
