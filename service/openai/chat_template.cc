#include "service/openai/chat_template.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"
#include "service/openai/error.h"

namespace tost::service::openai {

const char* ChatRoleName(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
  }
  return "?";
}

absl::StatusOr<std::string> RenderChat(const model::ModelConfig& config,
                                       absl::Span<const ChatMessage> messages) {
  if (!config.chat_template.has_value()) {
    return WithParam(
        absl::InvalidArgumentError(absl::StrCat(
            "model: ", QuoteClientText(config.name),
            " has no chat template (config.json \"chat_template\"), so it cannot serve "
            "/v1/chat/completions: send the prompt to /v1/completions instead")),
        "model");
  }
  return RenderChat(*config.chat_template, messages);
}

absl::StatusOr<std::string> RenderChat(const model::ChatTemplate& chat_template,
                                       absl::Span<const ChatMessage> messages) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const model::ChatTemplate::Turn* turn = nullptr;
    switch (m.role) {
      case ChatRole::kSystem:
        if (!chat_template.system.has_value()) {
          return FieldError(absl::StrCat("messages[", i, "].role"),
                            "this model's chat template has no \"system\" role: send the "
                            "instructions as a \"user\" message");
        }
        turn = &*chat_template.system;
        break;
      case ChatRole::kUser:
        turn = &chat_template.user;
        break;
      case ChatRole::kAssistant:
        turn = &chat_template.assistant;
        break;
    }
    absl::StrAppend(&out, turn->prefix);
    if (!m.name.empty()) absl::StrAppend(&out, m.name, ": ");
    absl::StrAppend(&out, m.content, turn->suffix);
  }
  out += chat_template.generation_prompt;
  return out;
}

std::vector<std::string> ChatStopStrings(const model::ChatTemplate& chat_template,
                                         absl::Span<const std::string> request_stop) {
  std::vector<std::string> out = chat_template.stop;
  for (const std::string& s : request_stop) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

}  // namespace tost::service::openai
