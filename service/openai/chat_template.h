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

enum class ChatRole { kSystem, kUser, kAssistant, kTool };
const char* ChatRoleName(ChatRole role);

// A call an assistant message made (OpenAI's tool_calls[i]): `arguments` is the JSON text the
// call carried.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// A function the request offers (OpenAI's tools[i].function); `parameters` is its JSON schema's
// text (compact), "{}" when the request gives none.
struct ToolFunction {
  std::string name;
  std::string description;
  std::string parameters;
};

struct ChatMessage {
  // Brace-initialised as {role, content} or {role, content, name}.
  ChatMessage(ChatRole role = ChatRole::kUser, std::string content = {}, std::string name = {})
      : role(role), content(std::move(content)), name(std::move(name)) {}

  ChatRole role = ChatRole::kUser;
  std::string content;  // the text parts joined
  // OpenAI's "name" of the participant (1 to 64 of [a-zA-Z0-9_-]), or empty: rendered before the
  // content as "<name>: ".
  std::string name;
  std::vector<ToolCall> tool_calls;  // an assistant's calls, rendered after its content
  std::string tool_call_id;          // a tool message: the call it answers
};

// Each message as its role's prefix + ("<name>: " when it has a name) + content + suffix, in order,
// then the template's generation_prompt. INVALID_ARGUMENT (param "model") when the model has no
// chat template, and (param "messages[i].role") for a system message when the template has no
// system role.
absl::StatusOr<std::string> RenderChat(const model::ModelConfig& config,
                                       absl::Span<const ChatMessage> messages);
absl::StatusOr<std::string> RenderChat(const model::ChatTemplate& chat_template,
                                       absl::Span<const ChatMessage> messages);

// With tools: the template's tool definitions (the functions as a JSON array) first, assistant
// calls as call_begin + [{"name", "arguments"}, ...] + call_end after the content, tool messages
// as result turns. INVALID_ARGUMENT naming `field` (param) when the template has no tool format,
// and for a tool message when it has none.
absl::StatusOr<std::string> RenderChatWithTools(const model::ChatTemplate& chat_template,
                                                absl::Span<const ChatMessage> messages,
                                                absl::Span<const ToolFunction> tools,
                                                const std::string& model_name);

// The JSON array of the functions as the template's definitions show them (compact):
// [{"name", "description", "parameters"}].
std::string ToolDefinitionsJson(absl::Span<const ToolFunction> tools);

// The stop strings of a chat request: the template's, then the request's own that are not already
// among them.
std::vector<std::string> ChatStopStrings(const model::ChatTemplate& chat_template,
                                         absl::Span<const std::string> request_stop);

}  // namespace tost::service::openai
