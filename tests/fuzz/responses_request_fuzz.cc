// libFuzzer target: the request bodies of OpenAI's Responses API and of its Conversations API
// (service/openai/responses_request.h), and what the server builds from an accepted one
// (service/openai/responses_body.h, conversation_record.h). The first byte picks the parser (mod
// 4: POST /v1/responses, then the conversation bodies create, update and add-items), the rest is
// the body. Whatever the bytes: a refusal is INVALID_ARGUMENT whose message starts with its param
// (the field's path), in valid UTF-8, with a valid JSON error body. An accepted request keeps every
// bound the parser promises; its items listed as the API lists them parse back as the same
// messages; its Response object, completed and streamed (deltas cut at character boundaries), is
// valid UTF-8 JSON whose events are numbered from 0 and whose deltas add up to the text; and the
// stored response and conversation records decode to what was encoded.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "service/openai/conversation_record.h"
#include "service/openai/error.h"
#include "service/openai/responses_body.h"
#include "service/openai/responses_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;
using tost::model::FirstInvalidUtf8;
using namespace tost::service::openai;

bool ValidJson(const std::string& s) {
  if (FirstInvalidUtf8(s).has_value()) return false;
  return json::accept(s);
}

void CheckRefusal(const absl::Status& status) {
  TOST_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  TOST_FUZZ_CHECK(!FirstInvalidUtf8(message).has_value());
  const std::string param = ErrorParam(status);
  TOST_FUZZ_CHECK(!param.empty());
  // FieldError's "<param>: ..."; the body's UTF-8 check names the "request body".
  TOST_FUZZ_CHECK(message.compare(0, param.size() + 2, param + ": ") == 0 ||
                  (param == "body" && message.find("body") != std::string::npos));
  TOST_FUZZ_CHECK(ValidJson(OpenAiErrorBody(status)));
}

bool Utf8Boundary(std::string_view s, size_t i) {
  return i == 0 || i >= s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

void CheckMessages(const std::vector<InputMessage>& messages) {
  TOST_FUZZ_CHECK(messages.size() <= kMaxInputItems);
  for (const InputMessage& m : messages) {
    TOST_FUZZ_CHECK(!FirstInvalidUtf8(m.message.content).has_value());
    if (m.role == "user") {
      TOST_FUZZ_CHECK(m.message.role == ChatRole::kUser);
    } else if (m.role == "assistant") {
      TOST_FUZZ_CHECK(m.message.role == ChatRole::kAssistant);
    } else {
      TOST_FUZZ_CHECK(m.role == "system" || m.role == "developer");
      TOST_FUZZ_CHECK(m.message.role == ChatRole::kSystem);
    }
  }
  // Listed as the API lists them, the items parse back as the same messages.
  json items = json::array();
  for (const InputMessage& m : messages) items.push_back(MessageItemJson("msg_fuzz", m));
  if (items.empty()) return;
  TOST_FUZZ_CHECK(ValidJson(items.dump()));
  const absl::StatusOr<std::vector<InputMessage>> back = ParseInputMessages(items, "items");
  TOST_FUZZ_CHECK(back.ok());
  TOST_FUZZ_CHECK(back->size() == messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    TOST_FUZZ_CHECK((*back)[i].role == messages[i].role);
    TOST_FUZZ_CHECK((*back)[i].message.role == messages[i].message.role);
    TOST_FUZZ_CHECK((*back)[i].message.content == messages[i].message.content);
  }
}

void CheckMetadata(const json& metadata) {
  TOST_FUZZ_CHECK(metadata.is_object());
  TOST_FUZZ_CHECK(metadata.size() <= kMaxMetadataPairs);
  for (const auto& [key, value] : metadata.items()) {
    TOST_FUZZ_CHECK(!key.empty());
    TOST_FUZZ_CHECK(value.is_string());
  }
}

// The stream's SSE bytes: "event: <type>\ndata: <json>\n\n" each, numbered from `*next`.
void CheckEvents(const std::string& sse, int64_t* next, std::string* deltas, std::string* done_text,
                 std::string* last_type) {
  TOST_FUZZ_CHECK(!FirstInvalidUtf8(sse).has_value());
  size_t at = 0;
  while (at < sse.size()) {
    TOST_FUZZ_CHECK(sse.compare(at, 7, "event: ") == 0);
    const size_t nl = sse.find('\n', at);
    const size_t end = sse.find("\n\n", at);
    TOST_FUZZ_CHECK(nl != std::string::npos && end != std::string::npos && nl < end);
    const std::string type = sse.substr(at + 7, nl - at - 7);
    TOST_FUZZ_CHECK(sse.compare(nl + 1, 6, "data: ") == 0);
    const std::string payload = sse.substr(nl + 7, end - nl - 7);
    TOST_FUZZ_CHECK(json::accept(payload));
    const json data = json::parse(payload);
    TOST_FUZZ_CHECK(data.at("type") == type);
    TOST_FUZZ_CHECK(data.at("sequence_number") == *next);
    ++*next;
    if (type == "response.output_text.delta") *deltas += data.at("delta").get<std::string>();
    if (type == "response.output_text.done") *done_text = data.at("text").get<std::string>();
    *last_type = type;
    at = end + 2;
  }
}

void CheckResponse(const ResponsesRequest& r) {
  TOST_FUZZ_CHECK(!r.model.empty());
  TOST_FUZZ_CHECK(!r.input.empty());
  CheckMessages(r.input);
  TOST_FUZZ_CHECK(r.previous_response_id.size() <= kMaxIdBytes);
  TOST_FUZZ_CHECK(r.conversation_id.size() <= kMaxIdBytes);
  TOST_FUZZ_CHECK(r.previous_response_id.empty() || r.conversation_id.empty());
  TOST_FUZZ_CHECK(r.store || r.conversation_id.empty());
  TOST_FUZZ_CHECK(!r.state.has_value() ||
                  (r.previous_response_id.empty() && r.conversation_id.empty()));
  TOST_FUZZ_CHECK(!r.max_output_tokens.has_value() || *r.max_output_tokens >= 1);
  TOST_FUZZ_CHECK(!r.temperature.has_value() ||
                  (*r.temperature == 0.f || (*r.temperature >= 0.01f && *r.temperature <= 2.f)));
  TOST_FUZZ_CHECK(!r.top_p.has_value() || (*r.top_p > 0.f && *r.top_p <= 1.f));
  CheckMetadata(r.metadata);
  TOST_FUZZ_CHECK(r.constraint.has_value() != (r.text_format["type"] == "text"));
  if (r.constraint.has_value()) {
    if (r.constraint->kind == tost::structured::Constraint::Kind::kJsonSchema) {
      TOST_FUZZ_CHECK(r.constraint_field == "text.format.schema");
      TOST_FUZZ_CHECK(json::accept(r.constraint->text));
      TOST_FUZZ_CHECK(json::parse(r.constraint->text).is_object());
      TOST_FUZZ_CHECK(r.text_format["type"] == "json_schema");
    } else {
      TOST_FUZZ_CHECK(r.constraint->kind == tost::structured::Constraint::Kind::kJsonObject);
      TOST_FUZZ_CHECK(r.constraint_field == "text.format");
    }
  }

  // The response, completed with the input's text as output and streamed in pieces cut at
  // character boundaries (as the text stream releases them).
  std::string text;
  for (const InputMessage& m : r.input) text += m.message.content;
  if (text.size() > 256) {
    size_t cut = 256;
    while (!Utf8Boundary(text, cut)) --cut;
    text.resize(cut);
  }
  const bool truncated = r.max_output_tokens.has_value() && *r.max_output_tokens < 3;
  json response = NewResponseJson(r, "resp_fuzz", r.model, 1);
  TOST_FUZZ_CHECK(ValidJson(response.dump(-1, ' ', false, json::error_handler_t::strict)));
  ResponseEventStream stream("msg_fuzz");
  int64_t next = 0;
  std::string deltas, done_text, last_type;
  CheckEvents(stream.Begin(response), &next, &deltas, &done_text, &last_type);
  // Deltas of 1 to 8 bytes, stretched to the next character boundary; the last few bytes only
  // in the final text (withheld, as a stop string's prefix is).
  const size_t streamed = text.size() - std::min<size_t>(text.size(), text.size() % 5);
  size_t at = 0;
  while (at < streamed) {
    size_t end = std::min(streamed, at + 1 + (static_cast<unsigned char>(text[at]) % 8));
    while (!Utf8Boundary(text, end)) ++end;
    CheckEvents(stream.Delta(std::string_view(text).substr(at, end - at)), &next, &deltas,
                &done_text, &last_type);
    at = end;
  }
  CompleteResponseJson(response, "msg_fuzz", text, truncated, {7, 3, 2}, 2);
  CheckEvents(stream.Complete(response), &next, &deltas, &done_text, &last_type);
  TOST_FUZZ_CHECK(deltas == text);
  TOST_FUZZ_CHECK(done_text == text);
  TOST_FUZZ_CHECK(last_type == (truncated ? "response.incomplete" : "response.completed"));
  TOST_FUZZ_CHECK(response["usage"]["total_tokens"] == 9);

  // The stored record decodes to what was encoded.
  StoredResponse stored;
  stored.response = response;
  stored.input_items = InputItemsJson(r.input);
  TOST_FUZZ_CHECK(!stored.input_items.empty() && stored.input_items.size() <= r.input.size());
  stored.context_tokens = 12;
  stored.state_blob = r.state.value_or(std::string("\0blob", 5));
  const absl::StatusOr<StoredResponse> back =
      DecodeStoredResponse(EncodeStoredResponse(stored), "resp_fuzz");
  TOST_FUZZ_CHECK(back.ok());
  TOST_FUZZ_CHECK(back->response == stored.response);
  TOST_FUZZ_CHECK(back->input_items == stored.input_items);
  TOST_FUZZ_CHECK(back->context_tokens == 12);
  TOST_FUZZ_CHECK(back->state_blob == stored.state_blob);

  // The listing pages through every item once, either way.
  for (const char* order : {"asc", "desc"}) {
    std::string after;
    size_t seen = 0;
    for (;;) {
      const absl::StatusOr<json> page = ListPage(stored.input_items, order, after, 2);
      TOST_FUZZ_CHECK(page.ok());
      seen += (*page)["data"].size();
      if (!(*page)["has_more"].get<bool>()) break;
      after = (*page)["last_id"].get<std::string>();
    }
    TOST_FUZZ_CHECK(seen == stored.input_items.size());
  }
}

void CheckConversation(ConversationBody kind, const ConversationRequest& r) {
  CheckMessages(r.items);
  if (r.metadata.has_value()) CheckMetadata(*r.metadata);
  switch (kind) {
    case ConversationBody::kCreate:
      break;
    case ConversationBody::kUpdate:
      TOST_FUZZ_CHECK(r.items.empty());
      TOST_FUZZ_CHECK(r.metadata.has_value());
      break;
    case ConversationBody::kAddItems:
      TOST_FUZZ_CHECK(!r.items.empty());
      TOST_FUZZ_CHECK(!r.metadata.has_value());
      break;
  }

  // The items as a stored conversation's pending items, a turn, and the record round trip.
  StoredConversation c;
  c.metadata = r.metadata.value_or(json::object());
  const absl::StatusOr<json> added = AddPendingItems(c, r.items, "items");
  if (!added.ok()) {
    CheckRefusal(added.status());
    return;
  }
  TOST_FUZZ_CHECK(added->size() == r.items.size());
  TOST_FUZZ_CHECK(c.pending == static_cast<int64_t>(r.items.size()));
  const std::vector<InputMessage> pending = PendingMessages(c);
  TOST_FUZZ_CHECK(pending.size() == r.items.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    TOST_FUZZ_CHECK(pending[i].role == r.items[i].role);
    TOST_FUZZ_CHECK(pending[i].message.role == r.items[i].message.role);
    TOST_FUZZ_CHECK(pending[i].message.content == r.items[i].message.content);
  }
  const absl::StatusOr<StoredConversation> back =
      DecodeStoredConversation(EncodeStoredConversation(c), "conv_fuzz");
  TOST_FUZZ_CHECK(back.ok());
  TOST_FUZZ_CHECK(back->items == c.items);
  TOST_FUZZ_CHECK(back->pending == c.pending);
  TOST_FUZZ_CHECK(back->metadata == c.metadata);
  RecordTurn(c, *added);
  TOST_FUZZ_CHECK(c.pending == 0);
  TOST_FUZZ_CHECK(PendingMessages(c).empty());
  TOST_FUZZ_CHECK(ValidJson(ConversationJson("conv_fuzz", c).dump()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int parser = data[0] % 4;
  const std::string_view body = tost::fuzz::Bytes(data + 1, size - 1);
  if (parser == 0) {
    const absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body);
    if (!r.ok()) {
      CheckRefusal(r.status());
      return 0;
    }
    TOST_FUZZ_CHECK(!FirstInvalidUtf8(body).has_value());
    CheckResponse(*r);
    return 0;
  }
  const ConversationBody kind = parser == 1   ? ConversationBody::kCreate
                                : parser == 2 ? ConversationBody::kUpdate
                                              : ConversationBody::kAddItems;
  const absl::StatusOr<ConversationRequest> r = ParseConversationRequest(kind, body);
  if (!r.ok()) {
    CheckRefusal(r.status());
    return 0;
  }
  TOST_FUZZ_CHECK(!FirstInvalidUtf8(body).has_value());
  CheckConversation(kind, *r);
  return 0;
}
