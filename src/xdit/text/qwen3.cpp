#include "xdit/text/qwen3.h"

namespace xdit {

DecoderLMConfig qwen3_config(const JsonConfig& config) { return DecoderLMConfig::from_json(config, /*qk_norm=*/true); }

DecoderLM load_qwen3(const TensorSource& weights, const JsonConfig& config, int deepest_tap,
                     const DecoderLMOptions& options) {
  // lm_head is tied to embed_tokens in klein's checkpoints (absent then) and never used here.
  return DecoderLM::load(weights, qwen3_config(config), {"model.", {"lm_head."}}, deepest_tap, options);
}

}  // namespace xdit
