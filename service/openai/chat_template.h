// Rendering a chat into a prompt with a model's chat template (model::ChatTemplate, config.json
// "chat_template"; format in docs/models.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config/config.h"

namespace tost::service::openai {

enum class ChatRole { kSystem, kUser, kAssistant };
const char* ChatRoleName(ChatRole role);

struct ChatMessage {
  // Brace-initialised as {role, content} or {role, content, name}.
  ChatMessage(ChatRole role = ChatRole::kUser, std::string content = {}, std::string name = {})
      : role(role), content(std::move(content)), name(std::move(name)) {}

  ChatRole role = ChatRole::kUser;
  std::string content;  // the text parts joined
  // OpenAI's "name" of the participant (1 to 64 of [a-zA-Z0-9_-]), or empty: rendered before the
  // content as "<name>: ".
  std::string name;
};

// Each message as its role's prefix + ("<name>: " when it has a name) + content + suffix, in order,
// then the template's generation_prompt. INVALID_ARGUMENT (param "model") when the model has no
// chat template, and (param "messages[i].role") for a system message when the template has no
// system role.
absl::StatusOr<std::string> RenderChat(const model::ModelConfig& config,
                                       absl::Span<const ChatMessage> messages);
absl::StatusOr<std::string> RenderChat(const model::ChatTemplate& chat_template,
                                       absl::Span<const ChatMessage> messages);

// The stop strings of a chat request: the template's, then the request's own that are not already
// among them.
std::vector<std::string> ChatStopStrings(const model::ChatTemplate& chat_template,
                                         absl::Span<const std::string> request_stop);

}  // namespace tost::service::openai
