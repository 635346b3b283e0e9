// The response side of OpenAI's Responses API: the Response object (returned whole, stored, and
// carried by the stream's lifecycle events), the server-sent events of a streamed response, and
// what a stored response is on the store: the state after its output (a sealed, owner-bound
// session blob, so continuing needs no transcript), the Response object, its input items (text,
// for GET /v1/responses/{id}/input_items) and the number of tokens its state holds. Pure: no HTTP,
// no engine, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/openai/responses_request.h"

namespace tost::service::openai {

// The token counts of one response. input_tokens counts the whole conversation the model saw (the
// state's history and this turn's input, as OpenAI counts it); cached_tokens those of them not
// computed for this response: the history, carried by the state, plus any prefix-state cache hit.
// input_tokens - cached_tokens is what this turn prefilled.
struct ResponseUsage {
  int64_t input_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
};

// The Response object of `request` before any output: status "in_progress", the request's
// parameters echoed, output empty, usage null.
nlohmann::json NewResponseJson(const ResponsesRequest& request, const std::string& id,
                               const std::string& model, int64_t created_at);

// The assistant message item of a response: status "in_progress" while it streams (text so far),
// "completed", or "incomplete" when cut short.
nlohmann::json OutputMessageJson(const std::string& message_id, std::string_view text,
                                 const char* status);

// `response` (NewResponseJson's) completed with its output: status "completed", or "incomplete"
// with incomplete_details.reason "max_output_tokens" when `truncated`.
void CompleteResponseJson(nlohmann::json& response, const std::string& message_id,
                          std::string_view text, bool truncated, const ResponseUsage& usage,
                          int64_t completed_at);
// `response` failed: status "failed" and error {"code", "message"}.
void FailResponseJson(nlohmann::json& response, const absl::Status& status);

// The events of one streamed response, numbered from 0 by sequence_number. Each returns the SSE
// bytes ("event: <type>\ndata: <json>\n\n").
class ResponseEventStream {
 public:
  ResponseEventStream(std::string message_id) : message_id_(std::move(message_id)) {}
  // response.created, response.in_progress, response.output_item.added,
  // response.content_part.added.
  std::string Begin(const nlohmann::json& response);
  // response.output_text.delta ("" for empty text).
  std::string Delta(std::string_view text);
  // response.output_text.done, response.content_part.done, response.output_item.done, then
  // response.completed (or response.incomplete) carrying `response`, which CompleteResponseJson
  // finished.
  std::string Complete(const nlohmann::json& response);
  // response.failed carrying `response` (FailResponseJson's).
  std::string Failed(const nlohmann::json& response);
  // An error event: {"type": "error", "code", "message", "param"}.
  std::string Error(const absl::Status& status);

 private:
  std::string Event(const char* type, nlohmann::json data);
  const std::string message_id_;
  int64_t sequence_ = 0;
  std::string text_;  // what the deltas carried
};

// A stored response, as the record store holds it.
struct StoredResponse {
  nlohmann::json response;     // the Response object, as GET returns it
  nlohmann::json input_items;  // the message items of its input (bounded: kMaxStoredInputBytes)
  int64_t context_tokens = 0;  // tokens the state holds (the next turn's history)
  std::string state_blob;      // sealed by the session codec, bound to its owner and model
};

// Bytes of input item text a stored response keeps for GET .../input_items; the earliest items
// of an input past it are dropped from the listing (the state holds them all the same).
inline constexpr size_t kMaxStoredInputBytes = 64 * 1024;

// The message items of `input`, with new ids, within kMaxStoredInputBytes (the latest kept).
nlohmann::json InputItemsJson(const std::vector<InputMessage>& input);

// MessagePack of {response, input_items, context_tokens, state}: compact on the store.
std::string EncodeStoredResponse(const StoredResponse& stored);
// DATA_LOSS when the record is not one EncodeStoredResponse wrote.
absl::StatusOr<StoredResponse> DecodeStoredResponse(std::string_view record, const std::string& id);

// A new id: `prefix` ("resp_", "msg_", "conv_") and 32 hex digits of the OS's CSPRNG.
std::string NewItemId(std::string_view prefix);

// A cursor-paginated list, as OpenAI lists items: {"object": "list", "data", "first_id",
// "last_id", "has_more"}. `items` in their stored (chronological) order; `order` "asc" or "desc";
// `after` an item id (the page starts after it in that order; NOT_FOUND naming it when absent);
// `limit` in [1, 100].
absl::StatusOr<nlohmann::json> ListPage(const nlohmann::json& items, const std::string& order,
                                        const std::string& after, int64_t limit);

}  // namespace tost::service::openai
