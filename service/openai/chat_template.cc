#include "service/openai/chat_template.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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
    case ChatRole::kTool:
      return "tool";
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

namespace {

absl::Status NoToolFormat(const std::string& model_name, const std::string& field) {
  return FieldError(field, absl::StrCat("model ", QuoteClientText(model_name),
                                        " has no tool format in its chat template (config.json "
                                        "chat_template.tools), so it cannot take tools or tool "
                                        "messages: send the request without them"));
}

// The calls as the template shows them after an assistant's content: a JSON array of
// {"name", "arguments"}, the arguments as JSON when they parse (else as the string sent).
std::string CallsJson(absl::Span<const ToolCall> calls) {
  using json = nlohmann::ordered_json;  // as written: "name" first, arguments in their order
  json out = json::array();
  for (const ToolCall& c : calls) {
    json args = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    if (args.is_discarded()) args = c.arguments;
    out.push_back({{"name", c.name}, {"arguments", std::move(args)}});
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<std::string> Render(const model::ChatTemplate& chat_template,
                                   absl::Span<const ChatMessage> messages,
                                   const std::string& model_name) {
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
      case ChatRole::kTool:
        if (!chat_template.tools.has_value()) {
          return NoToolFormat(model_name, absl::StrCat("messages[", i, "].role"));
        }
        turn = &chat_template.tools->result;
        break;
    }
    absl::StrAppend(&out, turn->prefix);
    if (!m.name.empty()) absl::StrAppend(&out, m.name, ": ");
    absl::StrAppend(&out, m.content);
    if (!m.tool_calls.empty()) {
      if (!chat_template.tools.has_value()) {
        return NoToolFormat(model_name, absl::StrCat("messages[", i, "].tool_calls"));
      }
      absl::StrAppend(&out, chat_template.tools->call_begin, CallsJson(m.tool_calls),
                      chat_template.tools->call_end);
    }
    absl::StrAppend(&out, turn->suffix);
  }
  out += chat_template.generation_prompt;
  return out;
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const model::ChatTemplate& chat_template,
                                       absl::Span<const ChatMessage> messages) {
  return Render(chat_template, messages, "");
}

std::string ToolDefinitionsJson(absl::Span<const ToolFunction> tools) {
  using json = nlohmann::ordered_json;  // the parameters as the client wrote them
  json out = json::array();
  for (const ToolFunction& f : tools) {
    json fn = {{"name", f.name}};
    if (!f.description.empty()) fn["description"] = f.description;
    fn["parameters"] = json::parse(f.parameters, nullptr, /*allow_exceptions=*/false);
    out.push_back(std::move(fn));
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<std::string> RenderChatWithTools(const model::ChatTemplate& chat_template,
                                                absl::Span<const ChatMessage> messages,
                                                absl::Span<const ToolFunction> tools,
                                                const std::string& model_name) {
  TOST_ASSIGN_OR_RETURN(std::string chat, Render(chat_template, messages, model_name));
  if (tools.empty()) return chat;
  if (!chat_template.tools.has_value()) return NoToolFormat(model_name, "tools");
  return absl::StrCat(chat_template.tools->definitions_prefix, ToolDefinitionsJson(tools),
                      chat_template.tools->definitions_suffix, chat);
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
