#include "xdit/text/mistral3.h"

#include <string>

namespace xdit {

DecoderLMConfig mistral3_text_config(const JsonConfig& config) {
  const JsonConfig text = config.get_object("text_config");
  const std::string type = text.get_string("model_type", "mistral");
  if (type != "mistral") text.fail_field("model_type", "is " + quote(type) + "; only \"mistral\" is supported");
  // Mistral applies a sliding window whenever one is set.
  if (text.has("sliding_window"))
    text.fail_field("sliding_window", "is set; sliding-window attention is not supported");
  return DecoderLMConfig::from_json(text, /*qk_norm=*/false);
}

DecoderLM load_mistral3_text_model(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                                   const DecoderLMOptions& options) {
  const bool module_names = weights.contains("model.language_model.embed_tokens.weight");
  DecoderLMCheckpoint checkpoint;
  if (module_names) {
    checkpoint = {"model.language_model.", {"model.vision_tower.", "model.multi_modal_projector.", "lm_head."}};
  } else {
    checkpoint = {"language_model.model.", {"vision_tower.", "multi_modal_projector.", "language_model.lm_head."}};
  }
  return DecoderLM::load(weights, mistral3_text_config(config), checkpoint, deepest_tap, options);
}

}  // namespace xdit
