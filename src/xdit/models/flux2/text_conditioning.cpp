#include "xdit/models/flux2/text_conditioning.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "xdit/core/error.h"
#include "xdit/io/json_config.h"
#include "xdit/models/flux2/position_ids.h"
#include "xdit/text/chat_template.h"
#include "xdit/text/mistral3.h"
#include "xdit/text/qwen3.h"

namespace xdit::flux2 {
namespace {

// The pipelines' text_encoder_out_layers defaults.
const std::vector<int> kQwen3Taps = {9, 18, 27};
const std::vector<int> kMistral3Taps = {10, 20, 30};

// format_input drops "[IMG]" from prompts so that truncation cannot change the image-token count.
std::string without_image_tokens(std::string_view prompt) {
  constexpr std::string_view kImage = "[IMG]";
  std::string out;
  for (size_t pos = 0;;) {
    const size_t hit = prompt.find(kImage, pos);
    out.append(prompt.substr(pos, hit - pos));
    if (hit == std::string_view::npos) return out;
    pos = hit + kImage.size();
  }
}

}  // namespace

TextConditioning::TextConditioning(Encoder kind, Tokenizer tokenizer, int64_t pad_id, std::string bos_token,
                                   DecoderLM encoder, std::vector<int> taps, int64_t max_sequence_length)
    : kind_(kind),
      tokenizer_(std::move(tokenizer)),
      pad_id_(pad_id),
      bos_token_(std::move(bos_token)),
      encoder_(std::move(encoder)),
      taps_(std::move(taps)),
      max_sequence_length_(max_sequence_length) {}

TextConditioning TextConditioning::load(const DiffusersRepo& repo, const TextEncoderOptions& options) {
  const std::string& class_name = repo.component("text_encoder").class_name;
  Encoder kind;
  if (class_name == "Qwen3ForCausalLM") {
    kind = Encoder::Qwen3;
  } else if (class_name == "Mistral3ForConditionalGeneration") {
    kind = Encoder::Mistral3;
  } else {
    fail(repo.folder(), ": FLUX.2 text encoder class ", quote(class_name),
         " is not supported (Qwen3ForCausalLM or Mistral3ForConditionalGeneration)");
  }
  XDIT_CHECK(options.max_sequence_length > 0, "FLUX.2 text encoder: max_sequence_length must be > 0, got ",
             options.max_sequence_length);

  Tokenizer tokenizer = Tokenizer::load(repo.component_file("tokenizer", "tokenizer.json"));
  const std::string config_path = repo.component_file("tokenizer", "tokenizer_config.json");
  const TokenizerConfig special = TokenizerConfig::load(config_path);
  const int64_t pad_id = right_padding_id(tokenizer, special, config_path);
  std::string bos_token;
  if (kind == Encoder::Mistral3) {
    if (!special.bos_token) fail(config_path, ": field \"bos_token\" is missing; the chat template starts with it");
    bos_token = *special.bos_token;
  }

  const JsonConfig config = repo.component_config("text_encoder");
  const int layers = static_cast<int>(kind == Encoder::Qwen3 ? qwen3_config(config).num_hidden_layers
                                                             : mistral3_text_config(config).num_hidden_layers);
  std::vector<int> taps = options.taps.empty() ? (kind == Encoder::Qwen3 ? kQwen3Taps : kMistral3Taps) : options.taps;
  for (int t : taps) {
    XDIT_CHECK(t >= 0 && t <= layers, "FLUX.2 text encoder: hidden state ", t, " does not exist (", config.label(),
               " has ", layers, " layers)");
  }
  const int deepest = *std::max_element(taps.begin(), taps.end());

  const std::unique_ptr<TensorSource> weights = repo.component_weights("text_encoder");
  const DecoderLMOptions lm_options{options.compute_dtype, options.fp8_linear};
  DecoderLM encoder = kind == Encoder::Qwen3 ? load_qwen3(*weights, config, deepest, lm_options)
                                             : load_mistral3_text_model(*weights, config, deepest, lm_options);
  return TextConditioning(kind, std::move(tokenizer), pad_id, std::move(bos_token), std::move(encoder), std::move(taps),
                          options.max_sequence_length);
}

std::string TextConditioning::format(std::string_view prompt) const {
  if (kind_ == Encoder::Qwen3)
    return chat::qwen({{"user", std::string(prompt)}}, /*add_generation_prompt=*/true, /*enable_thinking=*/false);
  return chat::mistral({{"system", std::string(kSystemMessage)}, {"user", without_image_tokens(prompt)}}, bos_token_);
}

PaddedTokens TextConditioning::tokenize(const std::vector<std::string>& prompts) const {
  std::vector<std::string> texts;
  texts.reserve(prompts.size());
  for (const std::string& p : prompts) texts.push_back(format(p));
  return tokenizer_.encode_padded(texts, static_cast<size_t>(max_sequence_length_), pad_id_);
}

Tensor TextConditioning::prompt_embeds(const PaddedTokens& tokens) const {
  return encoder_.hidden_states_stacked(tokens.input_ids, tokens.attention_mask, taps_);
}

TextConditioning::Encoded TextConditioning::encode(const std::vector<std::string>& prompts) const {
  XDIT_CHECK(!prompts.empty(), "FLUX.2 text encoder: no prompts to encode");
  PaddedTokens tokens = tokenize(prompts);
  warn_truncated_prompts(tokens, max_sequence_length_);
  Tensor embeds = prompt_embeds(tokens);
  const int64_t batch = embeds.size(0), length = embeds.size(1);
  return {std::move(embeds), prepare_text_ids(batch, length), std::move(tokens.untruncated_tokens)};
}

}  // namespace xdit::flux2
