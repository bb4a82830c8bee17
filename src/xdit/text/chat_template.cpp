#include "xdit/text/chat_template.h"

#include "xdit/core/error.h"
#include "xdit/io/json_config.h"

namespace xdit::chat {
namespace {

void check_role(const Message& m, std::string_view template_name) {
  if (m.role != "system" && m.role != "user")
    fail(template_name, " chat template: role ", quote(m.role), " is not supported (only \"system\" and \"user\")");
}

}  // namespace

std::string qwen(const std::vector<Message>& messages, bool add_generation_prompt, bool enable_thinking) {
  std::string text;
  for (const Message& m : messages) {
    check_role(m, "Qwen");
    text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) {
    text += "<|im_start|>assistant\n";
    if (!enable_thinking) text += "<think>\n\n</think>\n\n";
  }
  return text;
}

std::string mistral(const std::vector<Message>& messages, std::string_view bos_token) {
  std::string text(bos_token);
  for (const Message& m : messages) {
    check_role(m, "Mistral");
    text += m.role == "system" ? "[SYSTEM_PROMPT]" + m.content + "[/SYSTEM_PROMPT]" : "[INST]" + m.content + "[/INST]";
  }
  return text;
}

}  // namespace xdit::chat
