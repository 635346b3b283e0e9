// The request bodies of OpenAI's Responses API (POST /v1/responses) and of its Conversations API
// (POST /v1/conversations, POST /v1/conversations/{id}, POST /v1/conversations/{id}/items), parsed
// and validated. Pure: no HTTP, no engine, no LibTorch; fuzzed (tests/fuzz).
//
// Unlike the chat routes, these parsers refuse every field they do not know, by name: the
// Responses API carries tools, reasoning and background modes that change what a caller gets, and
// a server that ignored them would answer something other than what was asked. Fields this server
// knows but cannot honour (tools, reasoning, background, include, ...) are refused unless they
// hold their default. Every refusal is INVALID_ARGUMENT whose message starts with the field's path
// ("input[2].content[0].type") and carries it as the error body's "param".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "service/openai/chat_template.h"
#include "service/openai/client_identifiers.h"
#include "service/structured/constraint.h"

namespace tost::service::openai {

// Bounds of OpenAI's metadata: at most 16 pairs, keys of at most 64 characters, values of at most
// 512.
inline constexpr size_t kMaxMetadataPairs = 16;
inline constexpr size_t kMaxMetadataKeyChars = 64;
inline constexpr size_t kMaxMetadataValueChars = 512;
// Input items in one request (OpenAI's own limit on a conversation's items per request is 20; a
// turn here may bring more, but not without bound).
inline constexpr size_t kMaxInputItems = 256;
// Ids this server hands out are a prefix and 32 hex digits; a longer one cannot be ours.
inline constexpr size_t kMaxIdBytes = 64;

// One message of `input` or of a conversation's items: OpenAI's EasyInputMessage ({"role",
// "content"}) or a message item ({"type": "message", ...}), text only.
struct InputMessage {
  ChatMessage message;
  // "user", "system", "developer" or "assistant", as sent (developer and system render alike).
  std::string role;
};

struct ResponsesRequest {
  std::string model;
  // `input`: a string (one user message) or message items.
  std::vector<InputMessage> input;
  std::optional<std::string> instructions;
  // At most one of the two (OpenAI refuses both too).
  std::string previous_response_id;
  std::string conversation_id;
  bool store = true;
  std::optional<int32_t> max_output_tokens;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<uint64_t> seed;
  nlohmann::json metadata = nlohmann::json::object();  // string -> string, within the bounds above
  // text.format: unset for "text"; "json_object" and "json_schema" as constraints, reported under
  // `constraint_field` ("text.format" or "text.format.schema").
  std::optional<structured::Constraint> constraint;
  std::string constraint_field;
  nlohmann::json text_format = {{"type", "text"}};  // echoed in the response's "text"
  bool stream = false;
  // ToST extensions, as on the chat routes: continue a state blob (base64 in the body), and ask
  // for the response's final state as base64 ("state" in the response).
  std::optional<std::string> state;
  bool return_state = false;
  int32_t priority = 0;  // as on the chat routes: lower runs sooner (the engine bounds it)
  // user, safety_identifier and prompt_cache_key: read as on the chat routes
  // (client_identifiers.h), and echoed in the response.
  ClientIdentifiers identifiers;
};

absl::StatusOr<ResponsesRequest> ParseResponsesRequest(std::string_view body);

// The items of a conversation request (`field` names them in errors: "items").
absl::StatusOr<std::vector<InputMessage>> ParseInputMessages(const nlohmann::json& v,
                                                             const std::string& field);
// OpenAI's metadata: an object of at most kMaxMetadataPairs strings (null: empty).
absl::StatusOr<nlohmann::json> ParseMetadata(const nlohmann::json& v, const std::string& field);

// POST /v1/conversations: {"items"?, "metadata"?}; POST /v1/conversations/{id}: {"metadata"};
// POST /v1/conversations/{id}/items: {"items"}. Unknown fields refused.
struct ConversationRequest {
  std::vector<InputMessage> items;
  std::optional<nlohmann::json> metadata;
};
enum class ConversationBody { kCreate, kUpdate, kAddItems };
absl::StatusOr<ConversationRequest> ParseConversationRequest(ConversationBody kind,
                                                             std::string_view body);

// The JSON of one message item as the API lists it: {"type": "message", "id", "status":
// "completed", "role", "content": [{"type": "input_text" or "output_text", "text", ...}]}.
nlohmann::json MessageItemJson(const std::string& id, const InputMessage& message);

}  // namespace tost::service::openai
