// The text model of Mistral3ForConditionalGeneration (Mistral-Small-3.x, FLUX.2 dev's text
// encoder): the shared decoder LM without q/k norms. Its config is the "text_config" of the
// checkpoint's config.json; the vision tower and projector are never loaded.
#pragma once

#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/text/decoder_lm.h"

namespace xdit {

// MistralConfig from Mistral3ForConditionalGeneration's config.json (its "text_config").
DecoderLMConfig mistral3_text_config(const JsonConfig& config);

// Loads what hidden_states[deepest_tap] needs (see DecoderLM::load). The language model's tensors
// are read under "language_model.model." (what transformers writes) or "model.language_model."
// (the module names of transformers 5), whichever the checkpoint holds.
DecoderLM load_mistral3_text_model(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                                   const DecoderLMOptions& options);

}  // namespace xdit
