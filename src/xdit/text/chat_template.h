// The chat templates the pipelines apply to a prompt, as plain string building that equals the
// Jinja output of the checkpoints' chat_template.jinja for the messages these pipelines send.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace xdit::chat {

struct Message {
  std::string role;  // "system" or "user"
  std::string content;
};

// Qwen's ChatML (Qwen3, Qwen2.5): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
// with add_generation_prompt "<|im_start|>assistant\n", followed by the empty thinking block
// "<think>\n\n</think>\n\n" when enable_thinking is false (Qwen3's switch; FLUX.2 klein passes
// false, Z-Image true). Throws for roles other than system and user.
std::string qwen(const std::vector<Message>& messages, bool add_generation_prompt, bool enable_thinking);

// Mistral-Small-3.x: bos_token, then "[SYSTEM_PROMPT]{content}[/SYSTEM_PROMPT]" for a system
// message and "[INST]{content}[/INST]" for a user message, in order. Throws for other roles.
std::string mistral(const std::vector<Message>& messages, std::string_view bos_token);

}  // namespace xdit::chat
