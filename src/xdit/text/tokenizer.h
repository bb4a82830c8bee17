// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (the Qwen2 tokenizer used by
// FLUX.2 klein, Z-Image and Qwen-Image). Encoding follows the `tokenizers` library: added tokens
// are split out first, the rest is NFC-normalised, pre-tokenized (regex Split and/or ByteLevel),
// mapped through the GPT-2 byte-to-unicode table and merged by rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xdit {

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
