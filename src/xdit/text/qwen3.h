// Qwen3ForCausalLM as a text encoder (FLUX.2 klein, Z-Image): the shared decoder LM with per-head
// q/k RMSNorm, its weights under "model." and an LM head that is not needed.
#pragma once

#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/text/decoder_lm.h"

namespace xdit {

// Qwen3Config from the text encoder's config.json.
DecoderLMConfig qwen3_config(const JsonConfig& config);

// Loads what hidden_states[deepest_tap] needs (see DecoderLM::load).
DecoderLM load_qwen3(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                     const DecoderLMOptions& options);

}  // namespace xdit
