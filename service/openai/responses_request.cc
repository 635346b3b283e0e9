#include "service/openai/responses_request.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "service/engine/client_text.h"
#include "service/openai/error.h"
#include "service/openai/json_fields.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

// Characters (code points) of a valid UTF-8 string.
size_t Chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// An unknown key as its path names it: as sent when it looks like a field name, else quoted
// (bounded, escaped): the key is the client's text, and may be empty, long or anything.
std::string KeyPath(absl::string_view prefix, const std::string& key) {
  const bool plain =
      !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
      });
  return absl::StrCat(prefix, plain ? key : QuoteClientText(key));
}

absl::StatusOr<std::string> Id(const json& v, const std::string& field) {
  TOST_ASSIGN_OR_RETURN(std::string id, String(v, field));
  if (id.empty() || id.size() > kMaxIdBytes) {
    return Expected(field, absl::StrCat("an id of 1 to ", kMaxIdBytes, " bytes"), v);
  }
  return id;
}

// One content part of a message with role `role`.
absl::StatusOr<std::string> PartText(const json& part, const std::string& at, bool assistant) {
  if (!part.is_object()) {
    return Expected(at, R"(an object {"type": "input_text", "text": ...})", part);
  }
  const json& type = Field(part, "type");
  const char* want = assistant ? "output_text" : "input_text";
  if (!type.is_string()) return Expected(at + ".type", absl::StrCat("\"", want, "\""), type);
  const std::string& t = type.get_ref<const std::string&>();
  if (t == "input_image" || t == "input_file" || t == "input_audio") {
    return Unsupported(at + ".type", "the models take text only", type);
  }
  // An assistant's earlier output may come back as either kind of text part.
  if (t != want && !(assistant && t == "input_text")) {
    return Expected(at + ".type", absl::StrCat("\"", want, "\""), type);
  }
  return String(Field(part, "text"), at + ".text");
}

absl::StatusOr<InputMessage> Message(const json& item, const std::string& at) {
  if (!item.is_object()) return Expected(at, R"(a message item {"role", "content"})", item);
  if (const json& type = Field(item, "type"); !type.is_null()) {
    if (!type.is_string()) return Expected(at + ".type", "\"message\"", type);
    if (type.get_ref<const std::string&>() != "message") {
      return Unsupported(
          at + ".type",
          "input items are messages only: no tool calls, tool outputs, reasoning or item "
          "references",
          type);
    }
  }
  InputMessage m;
  const json& role = Field(item, "role");
  const std::string* name = role.is_string() ? &role.get_ref<const std::string&>() : nullptr;
  if (name != nullptr && (*name == "system" || *name == "developer")) {
    m.message.role = ChatRole::kSystem;
  } else if (name != nullptr && *name == "user") {
    m.message.role = ChatRole::kUser;
  } else if (name != nullptr && *name == "assistant") {
    m.message.role = ChatRole::kAssistant;
  } else {
    return Expected(at + ".role", R"(one of "user", "system", "developer", "assistant")", role);
  }
  m.role = *name;
  for (const auto& [key, value] : item.items()) {
    if (key != "type" && key != "role" && key != "content" && key != "id" && key != "status") {
      return FieldError(KeyPath(at + ".", key),
                        "unknown field of a message item (expected type, role, content, id, "
                        "status)");
    }
  }
  const json& content = Field(item, "content");
  const bool assistant = m.message.role == ChatRole::kAssistant;
  if (content.is_string()) {
    m.message.content = content.get<std::string>();
  } else if (content.is_array()) {
    for (size_t i = 0; i < content.size(); ++i) {
      TOST_ASSIGN_OR_RETURN(std::string text,
                            PartText(content[i], absl::StrCat(at, ".content[", i, "]"), assistant));
      m.message.content += text;
    }
  } else {
    return Expected(at + ".content", "a string or an array of text parts", content);
  }
  return m;
}

absl::Status ParseInput(const json& v, ResponsesRequest& r) {
  if (v.is_null()) return FieldError("input", "missing: expected a string or an array of messages");
  if (v.is_string()) {
    r.input.push_back(InputMessage{ChatMessage{ChatRole::kUser, v.get<std::string>()}, "user"});
    return absl::OkStatus();
  }
  TOST_ASSIGN_OR_RETURN(r.input, ParseInputMessages(v, "input"));
  return absl::OkStatus();
}

absl::Status ParseTextFormat(std::string_view raw_body, const json& text, ResponsesRequest& r) {
  if (text.is_null()) return absl::OkStatus();
  if (!text.is_object()) return Expected("text", R"(an object {"format": {...}})", text);
  for (const auto& [key, value] : text.items()) {
    if (key == "format") continue;
    if (key == "verbosity") {
      if (!value.is_null() && value != "medium") {
        return Unsupported("text.verbosity", "the models have no verbosity setting; \"medium\"",
                           value);
      }
      continue;
    }
    return FieldError(KeyPath("text.", key), "unknown field (expected format, verbosity)");
  }
  const json& format = Field(text, "format");
  if (format.is_null()) return absl::OkStatus();
  constexpr absl::string_view kTypes = R"(one of "text", "json_object", "json_schema")";
  if (!format.is_object())
    return Expected("text.format", absl::StrCat("an object of type ", kTypes), format);
  const json& type = Field(format, "type");
  if (!type.is_string()) return Expected("text.format.type", kTypes, type);
  const std::string& t = type.get_ref<const std::string&>();
  // The text and json_object formats have nothing but their type: a field meant for json_schema
  // (say, a schema under json_object) would otherwise be ignored, not enforced.
  if (t == "text" || t == "json_object") {
    for (const auto& [key, value] : format.items()) {
      if (key != "type") {
        return FieldError(KeyPath("text.format.", key),
                          absl::StrCat("unknown field of a \"", t, "\" format (expected type)"));
      }
    }
  }
  if (t == "text") return absl::OkStatus();
  structured::Constraint c;
  if (t == "json_object") {
    c.kind = structured::Constraint::Kind::kJsonObject;
    r.constraint = std::move(c);
    r.constraint_field = "text.format";
    r.text_format = {{"type", "json_object"}};
    return absl::OkStatus();
  }
  if (t != "json_schema") return Expected("text.format.type", kTypes, type);
  const std::string what_name = absl::StrCat("a string of 1 to ", kMaxSchemaNameBytes,
                                             " characters from a-z, A-Z, 0-9, _ and -");
  const json& name = Field(format, "name");
  if (name.is_null())
    return FieldError("text.format.name", absl::StrCat("missing: expected ", what_name));
  if (!name.is_string() || !ValidSchemaName(name.get_ref<const std::string&>())) {
    return Expected("text.format.name", what_name, name);
  }
  if (const json& d = Field(format, "description"); !d.is_null() && !d.is_string()) {
    return Expected("text.format.description", "a string", d);
  }
  bool strict = true;
  // strict: false is enforced all the same: the schema is always a constraint here, never a hint.
  if (const json& s = Field(format, "strict"); !s.is_null()) {
    TOST_ASSIGN_OR_RETURN(strict, Bool(s, "text.format.strict"));
  }
  const json& schema = Field(format, "schema");
  if (schema.is_null())
    return FieldError("text.format.schema", "missing: expected a JSON schema (an object)");
  if (!schema.is_object())
    return Expected("text.format.schema", "a JSON schema (an object)", schema);
  for (const auto& [key, value] : format.items()) {
    if (key != "type" && key != "name" && key != "description" && key != "strict" &&
        key != "schema") {
      return FieldError(KeyPath("text.format.", key),
                        "unknown field (expected type, name, schema, description, strict)");
    }
  }
  c.kind = structured::Constraint::Kind::kJsonSchema;
  c.text = OrderedSchemaText(raw_body, {"text", "format", "schema"}, schema);
  r.constraint = std::move(c);
  r.constraint_field = "text.format.schema";
  r.text_format = {{"type", "json_schema"},
                   {"name", name},
                   {"schema", json::parse(r.constraint->text)},
                   {"strict", strict}};
  if (const json& d = Field(format, "description"); d.is_string()) r.text_format["description"] = d;
  return absl::OkStatus();
}

// A field this server knows and cannot honour, accepted only at a value that asks for nothing.
struct Refused {
  const char* key;
  const char* why;
  bool (*harmless)(const json& v);
};

bool IsNull(const json& v) { return v.is_null(); }
bool IsFalseOrNull(const json& v) { return v.is_null() || v == false; }
bool IsEmptyArrayOrNull(const json& v) { return v.is_null() || (v.is_array() && v.empty()); }
bool IsNoToolChoice(const json& v) { return v.is_null() || v == "none" || v == "auto"; }
bool IsBoolOrNull(const json& v) { return v.is_null() || v.is_boolean(); }
bool IsDisabledOrNull(const json& v) { return v.is_null() || v == "disabled"; }
bool IsDefaultTier(const json& v) { return v.is_null() || v == "auto" || v == "default"; }

constexpr Refused kRefused[] = {
    {"tools", "no tool calling", IsEmptyArrayOrNull},
    {"tool_choice", "no tool calling; \"none\" and \"auto\" (without tools) are accepted",
     IsNoToolChoice},
    {"parallel_tool_calls", "no tool calling; a boolean is accepted and has no effect",
     IsBoolOrNull},
    {"max_tool_calls", "no tool calling", IsNull},
    {"background", "no background mode: responses are answered while the request waits",
     IsFalseOrNull},
    {"reasoning", "the models do not reason", IsNull},
    {"include", "no extra output data (logprobs, sources, encrypted reasoning)",
     IsEmptyArrayOrNull},
    {"prompt", "no stored prompt templates", IsNull},
    {"top_logprobs", "no logprobs on this route (the chat routes have them)", IsNull},
    {"truncation",
     "no truncation: the state holds the whole conversation, and an input past the context is "
     "refused; \"disabled\" is accepted",
     IsDisabledOrNull},
    {"service_tier", "one tier; \"auto\" and \"default\" are accepted", IsDefaultTier},
    {"prompt_cache_retention", "the prefix-state cache's retention is the server's", IsNull},
    {"context_management", "the state holds the whole conversation", IsNull},
    {"stream_options", "no stream options", IsNull},
};

absl::Status ParseBody(std::string_view raw_body, const json& body, ResponsesRequest& r) {
  if (!body.is_object()) return Expected("body", "a JSON object", body);
  for (const auto& [key, value] : body.items()) {
    static constexpr const char* kKnown[] = {"model",
                                             "input",
                                             "instructions",
                                             "previous_response_id",
                                             "conversation",
                                             "store",
                                             "max_output_tokens",
                                             "temperature",
                                             "top_p",
                                             "seed",
                                             "metadata",
                                             "text",
                                             "stream",
                                             "state",
                                             "return_state",
                                             "priority",
                                             "user",
                                             "safety_identifier",
                                             "prompt_cache_key"};
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    for (const Refused& f : kRefused) {
      if (key != f.key) continue;
      known = true;
      if (!f.harmless(value)) return Unsupported(key, f.why, value);
    }
    if (!known) {
      return FieldError(KeyPath("", key),
                        "unknown parameter of POST /v1/responses (docs/api.md lists them)");
    }
  }
  {
    const json& model = Field(body, "model");
    if (model.is_null()) return FieldError("model", "missing: expected the name of a model");
    if (!model.is_string() || model.get_ref<const std::string&>().empty()) {
      return Expected("model", "a non-empty string", model);
    }
    r.model = model.get<std::string>();
  }
  TOST_RETURN_IF_ERROR(ParseInput(Field(body, "input"), r));
  if (const json& v = Field(body, "instructions"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.instructions, String(v, "instructions"));
  }
  if (const json& v = Field(body, "previous_response_id"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.previous_response_id, Id(v, "previous_response_id"));
  }
  if (const json& v = Field(body, "conversation"); !v.is_null()) {
    // A conversation id, or {"id": ...}.
    if (v.is_object()) {
      for (const auto& [key, value] : v.items()) {
        if (key != "id") {
          return FieldError(KeyPath("conversation.", key), "unknown field (expected id)");
        }
      }
      TOST_ASSIGN_OR_RETURN(r.conversation_id, Id(Field(v, "id"), "conversation.id"));
    } else {
      TOST_ASSIGN_OR_RETURN(r.conversation_id, Id(v, "conversation"));
    }
  }
  if (!r.previous_response_id.empty() && !r.conversation_id.empty()) {
    return FieldError("conversation",
                      "set previous_response_id or conversation, not both: each names the state "
                      "to continue");
  }
  if (const json& v = Field(body, "store"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.store, Bool(v, "store"));
  }
  if (!r.store && !r.conversation_id.empty()) {
    return FieldError("store",
                      "a response in a conversation is stored with it: send store true (or leave "
                      "it out), or leave out conversation");
  }
  if (const json& v = Field(body, "max_output_tokens"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t n,
                          Int(v, "max_output_tokens", 1, std::numeric_limits<int32_t>::max()));
    r.max_output_tokens = static_cast<int32_t>(n);
  }
  TOST_RETURN_IF_ERROR(ParseSampling(body, r.temperature, r.top_p, r.seed));
  TOST_ASSIGN_OR_RETURN(r.metadata, ParseMetadata(Field(body, "metadata"), "metadata"));
  TOST_RETURN_IF_ERROR(ParseTextFormat(raw_body, Field(body, "text"), r));
  if (const json& v = Field(body, "stream"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.stream, Bool(v, "stream"));
  }
  TOST_RETURN_IF_ERROR(ParseStateBlob(body, r.state));
  if (r.state.has_value() && (!r.previous_response_id.empty() || !r.conversation_id.empty())) {
    return FieldError("state",
                      "set one of state, previous_response_id and conversation: each names the "
                      "state to continue");
  }
  if (const json& v = Field(body, "return_state"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.return_state, Bool(v, "return_state"));
  }
  if (const json& v = Field(body, "priority"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t p, Int(v, "priority", std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max()));
    r.priority = static_cast<int32_t>(p);
  }
  TOST_ASSIGN_OR_RETURN(r.identifiers, ParseClientIdentifiers(body));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<InputMessage>> ParseInputMessages(const json& v,
                                                             const std::string& field) {
  if (!v.is_array() || v.empty()) {
    return Expected(field, "a non-empty array of message items", v);
  }
  if (v.size() > kMaxInputItems) {
    return Expected(field, absl::StrCat("at most ", kMaxInputItems, " items"), v);
  }
  std::vector<InputMessage> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    TOST_ASSIGN_OR_RETURN(InputMessage m, Message(v[i], absl::StrCat(field, "[", i, "]")));
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<json> ParseMetadata(const json& v, const std::string& field) {
  if (v.is_null()) return json::object();
  if (!v.is_object()) return Expected(field, "an object of string values", v);
  if (v.size() > kMaxMetadataPairs) {
    return Expected(field, absl::StrCat("at most ", kMaxMetadataPairs, " pairs"), v);
  }
  for (const auto& [key, value] : v.items()) {
    const std::string at = absl::StrCat(field, ".", QuoteClientText(key));
    if (key.empty() || Chars(key) > kMaxMetadataKeyChars) {
      return FieldError(
          at, absl::StrCat("expected a key of 1 to ", kMaxMetadataKeyChars, " characters"));
    }
    if (!value.is_string() || Chars(value.get_ref<const std::string&>()) > kMaxMetadataValueChars) {
      return Expected(
          at, absl::StrCat("a string of at most ", kMaxMetadataValueChars, " characters"), value);
    }
  }
  return v;
}

absl::StatusOr<ResponsesRequest> ParseResponsesRequest(std::string_view body) {
  return ParseJsonBody(body, [&](const json& parsed) -> absl::StatusOr<ResponsesRequest> {
    ResponsesRequest r;
    TOST_RETURN_IF_ERROR(ParseBody(body, parsed, r));
    return r;
  });
}

absl::StatusOr<ConversationRequest> ParseConversationRequest(ConversationBody kind,
                                                             std::string_view body) {
  return ParseJsonBody(body, [&](const json& parsed) -> absl::StatusOr<ConversationRequest> {
    if (!parsed.is_object()) return Expected("body", "a JSON object", parsed);
    const bool items_allowed = kind != ConversationBody::kUpdate;
    const bool metadata_allowed = kind != ConversationBody::kAddItems;
    for (const auto& [key, value] : parsed.items()) {
      if ((key == "items" && items_allowed) || (key == "metadata" && metadata_allowed)) continue;
      return FieldError(KeyPath("", key),
                        absl::StrCat("unknown parameter (expected ",
                                     items_allowed && metadata_allowed ? "items, metadata"
                                     : items_allowed                   ? "items"
                                                                       : "metadata",
                                     ")"));
    }
    ConversationRequest r;
    if (const json& v = Field(parsed, "items");
        !v.is_null() || kind == ConversationBody::kAddItems) {
      if (v.is_null()) return FieldError("items", "missing: expected an array of message items");
      // A conversation may start empty; adding nothing is a mistake worth reporting.
      if (!(kind == ConversationBody::kCreate && v.is_array() && v.empty())) {
        TOST_ASSIGN_OR_RETURN(r.items, ParseInputMessages(v, "items"));
      }
    }
    if (const json& v = Field(parsed, "metadata");
        !v.is_null() || kind == ConversationBody::kUpdate) {
      if (v.is_null()) return FieldError("metadata", "missing: expected an object of strings");
      TOST_ASSIGN_OR_RETURN(r.metadata, ParseMetadata(v, "metadata"));
    }
    return r;
  });
}

json MessageItemJson(const std::string& id, const InputMessage& message) {
  const bool assistant = message.message.role == ChatRole::kAssistant;
  json part = {{"type", assistant ? "output_text" : "input_text"},
               {"text", message.message.content}};
  if (assistant) part["annotations"] = json::array();
  return {{"type", "message"},
          {"id", id},
          {"status", "completed"},
          {"role", message.role},
          {"content", json::array({std::move(part)})}};
}

}  // namespace tost::service::openai
