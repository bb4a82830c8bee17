#include "xdit/models/z_image/text_conditioning.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "xdit/core/error.h"
#include "xdit/io/json_config.h"
#include "xdit/text/chat_template.h"
#include "xdit/text/qwen3.h"

namespace xdit::z_image {

TextConditioning::TextConditioning(Tokenizer tokenizer, int64_t pad_id, DecoderLM encoder, int hidden_state_index,
                                   int64_t max_sequence_length)
    : tokenizer_(std::move(tokenizer)),
      pad_id_(pad_id),
      encoder_(std::move(encoder)),
      hidden_state_index_(hidden_state_index),
      max_sequence_length_(max_sequence_length) {}

TextConditioning TextConditioning::load(const DiffusersRepo& repo, const TextEncoderOptions& options) {
  const std::string& class_name = repo.component("text_encoder").class_name;
  if (class_name != "Qwen3Model" && class_name != "Qwen3ForCausalLM") {
    fail(repo.folder(), ": Z-Image text encoder class ", quote(class_name),
         " is not supported (Qwen3Model or Qwen3ForCausalLM)");
  }
  XDIT_CHECK(options.max_sequence_length > 0, "Z-Image text encoder: max_sequence_length must be > 0, got ",
             options.max_sequence_length);

  Tokenizer tokenizer = Tokenizer::load(repo.component_file("tokenizer", "tokenizer.json"));
  const std::string config_path = repo.component_file("tokenizer", "tokenizer_config.json");
  const int64_t pad_id = right_padding_id(tokenizer, TokenizerConfig::load(config_path), config_path);

  const JsonConfig config = repo.component_config("text_encoder");
  const DecoderLMConfig lm_config = qwen3_config(config);
  // hidden_states[-2]: the output of the second-to-last layer, before the final norm.
  const int hidden_state_index = static_cast<int>(lm_config.num_hidden_layers) - 1;
  XDIT_CHECK(hidden_state_index >= 0, config.label(), ": field \"num_hidden_layers\" must be >= 1");

  const std::unique_ptr<TensorSource> weights = repo.component_weights("text_encoder");
  // Qwen3ForCausalLM checkpoints hold the Qwen3Model under "model."; a saved Qwen3Model has no prefix.
  const std::string prefix = weights->contains("model.embed_tokens.weight") ? "model." : "";
  DecoderLM encoder = DecoderLM::load(*weights, lm_config, {prefix, {"lm_head."}}, hidden_state_index,
                                      DecoderLMOptions{options.compute_dtype, options.fp8_linear});
  return TextConditioning(std::move(tokenizer), pad_id, std::move(encoder), hidden_state_index,
                          options.max_sequence_length);
}

std::string TextConditioning::format(std::string_view prompt) const {
  return chat::qwen({{"user", std::string(prompt)}}, /*add_generation_prompt=*/true, /*enable_thinking=*/true);
}

PaddedTokens TextConditioning::tokenize(const std::vector<std::string>& prompts) const {
  std::vector<std::string> texts;
  texts.reserve(prompts.size());
  for (const std::string& p : prompts) texts.push_back(format(p));
  return tokenizer_.encode_padded(texts, static_cast<size_t>(max_sequence_length_), pad_id_);
}

std::vector<Tensor> TextConditioning::prompt_embeds(const PaddedTokens& tokens) const {
  const Tensor mask = tokens.attention_mask.to(DType::I64).contiguous();
  XDIT_CHECK(mask.dim() == 2 && tokens.input_ids.shape() == mask.shape(),
             "Z-Image text encoder: ids and mask must be [B, L] of one shape, got ",
             shape_str(tokens.input_ids.shape()), " and ", shape_str(mask.shape()));
  const int64_t batch = mask.size(0), length = mask.size(1);
  std::vector<int64_t> valid(static_cast<size_t>(batch), 0);
  const int64_t* m = mask.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < length; ++s) valid[static_cast<size_t>(b)] += m[b * length + s] != 0 ? 1 : 0;
  }
  const int64_t longest = *std::max_element(valid.begin(), valid.end());
  // The encoder checks that each row is right-padded, so the first `valid` tokens are the kept ones.
  const Tensor states = encoder_.hidden_states_stacked(tokens.input_ids.narrow(1, 0, longest).contiguous(),
                                                       mask.narrow(1, 0, longest).contiguous(), {hidden_state_index_});
  std::vector<Tensor> embeds;
  embeds.reserve(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    embeds.push_back(states.select(0, b).narrow(0, 0, valid[static_cast<size_t>(b)]));
  return embeds;
}

std::vector<Tensor> TextConditioning::encode(const std::vector<std::string>& prompts) const {
  XDIT_CHECK(!prompts.empty(), "Z-Image text encoder: no prompts to encode");
  const PaddedTokens tokens = tokenize(prompts);
  warn_truncated_prompts(tokens, max_sequence_length_);
  return prompt_embeds(tokens);
}

}  // namespace xdit::z_image
