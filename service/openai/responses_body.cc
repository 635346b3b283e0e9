#include "service/openai/responses_body.h"

#include <algorithm>
#include <utility>

#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"
#include "service/openai/error.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The status code in snake case, as OpenAiErrorBody writes it ("invalid_argument", ...).
std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name;
}

}  // namespace

std::string NewItemId(std::string_view prefix) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();  // an id must never be guessable
  return absl::StrCat(std::string(prefix),
                      absl::BytesToHexString(
                          absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

json NewResponseJson(const ResponsesRequest& request, const std::string& id,
                     const std::string& model, int64_t created_at) {
  const ClientIdentifiers& ids = request.identifiers;
  json r = {
      {"id", id},
      {"object", "response"},
      {"created_at", created_at},
      {"status", "in_progress"},
      {"background", false},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions",
       request.instructions.has_value() ? json(*request.instructions) : json(nullptr)},
      {"max_output_tokens",
       request.max_output_tokens.has_value() ? json(*request.max_output_tokens) : json(nullptr)},
      {"metadata", request.metadata},
      {"model", model},
      {"output", json::array()},
      {"parallel_tool_calls", false},
      {"previous_response_id",
       request.previous_response_id.empty() ? json(nullptr) : json(request.previous_response_id)},
      {"store", request.store},
      // The values sampled with: OpenAI's defaults when unset.
      {"temperature", request.temperature.value_or(1.f)},
      {"text", {{"format", request.text_format}}},
      {"tool_choice", "none"},
      {"tools", json::array()},
      {"top_p", request.top_p.value_or(1.f)},
      {"truncation", "disabled"},
      {"usage", nullptr},
      {"user", ids.user.empty() ? json(nullptr) : json(ids.user)}};
  if (!request.conversation_id.empty()) r["conversation"] = {{"id", request.conversation_id}};
  if (!ids.safety_identifier.empty()) r["safety_identifier"] = ids.safety_identifier;
  if (!ids.prompt_cache_key.empty()) r["prompt_cache_key"] = ids.prompt_cache_key;
  return r;
}

json OutputMessageJson(const std::string& message_id, std::string_view text, const char* status) {
  return {{"id", message_id},
          {"type", "message"},
          {"role", "assistant"},
          {"status", status},
          {"content", json::array({{{"type", "output_text"},
                                    {"text", std::string(text)},
                                    {"annotations", json::array()},
                                    {"logprobs", json::array()}}})}};
}

void CompleteResponseJson(json& response, const std::string& message_id, std::string_view text,
                          bool truncated, const ResponseUsage& usage, int64_t completed_at) {
  response["status"] = truncated ? "incomplete" : "completed";
  response["incomplete_details"] =
      truncated ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  response["completed_at"] = completed_at;
  response["output"] =
      json::array({OutputMessageJson(message_id, text, truncated ? "incomplete" : "completed")});
  response["usage"] = {{"input_tokens", usage.input_tokens},
                       {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                       {"output_tokens", usage.output_tokens},
                       {"output_tokens_details", {{"reasoning_tokens", 0}}},
                       {"total_tokens", usage.input_tokens + usage.output_tokens}};
}

void FailResponseJson(json& response, const absl::Status& status) {
  response["status"] = "failed";
  response["error"] = {{"code", CodeName(status.code())},
                       {"message", std::string(status.message())}};
}

std::string ResponseEventStream::Event(const char* type, json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type, "\ndata: ", Dump(data), "\n\n");
}

// Each event is appended in its own statement: the order of a function's arguments' evaluation
// is unspecified, and the sequence numbers must follow the events' order.
std::string ResponseEventStream::Begin(const json& response) {
  std::string out = Event("response.created", {{"response", response}});
  out += Event("response.in_progress", {{"response", response}});
  out += Event("response.output_item.added",
               {{"output_index", 0}, {"item", OutputMessageJson(message_id_, "", "in_progress")}});
  out += Event("response.content_part.added",
               {{"item_id", message_id_},
                {"output_index", 0},
                {"content_index", 0},
                {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  return out;
}

std::string ResponseEventStream::Delta(std::string_view text) {
  if (text.empty()) return "";
  text_.append(text.data(), text.size());
  return Event("response.output_text.delta", {{"item_id", message_id_},
                                              {"output_index", 0},
                                              {"content_index", 0},
                                              {"delta", std::string(text)},
                                              {"logprobs", json::array()}});
}

std::string ResponseEventStream::Complete(const json& response) {
  const json& item = response["output"][0];
  const std::string& text = item["content"][0]["text"].get_ref<const std::string&>();
  std::string out;
  // Text released only at the end (a stop string's withheld bytes that were not one) is a last
  // delta, so that the deltas add up to the done event's text.
  if (text.size() > text_.size()) out += Delta(std::string_view(text).substr(text_.size()));
  out += Event("response.output_text.done", {{"item_id", message_id_},
                                             {"output_index", 0},
                                             {"content_index", 0},
                                             {"text", text},
                                             {"logprobs", json::array()}});
  out += Event("response.content_part.done", {{"item_id", message_id_},
                                              {"output_index", 0},
                                              {"content_index", 0},
                                              {"part", item["content"][0]}});
  out += Event("response.output_item.done", {{"output_index", 0}, {"item", item}});
  out += Event(response["status"] == "incomplete" ? "response.incomplete" : "response.completed",
               {{"response", response}});
  return out;
}

std::string ResponseEventStream::Failed(const json& response) {
  return Event("response.failed", {{"response", response}});
}

std::string ResponseEventStream::Error(const absl::Status& status) {
  const std::string param = ErrorParam(status);
  return Event("error", {{"code", CodeName(status.code())},
                         {"message", std::string(status.message())},
                         {"param", param.empty() ? json(nullptr) : json(param)}});
}

json InputItemsJson(const std::vector<InputMessage>& input) {
  json items = json::array();
  size_t bytes = 0;
  // The latest items first, until the bound; then back in order.
  for (auto it = input.rbegin(); it != input.rend(); ++it) {
    bytes += it->message.content.size();
    if (bytes > kMaxStoredInputBytes && !items.empty()) break;
    items.push_back(MessageItemJson(NewItemId("msg_"), *it));
  }
  std::reverse(items.begin(), items.end());
  return items;
}

std::string EncodeStoredResponse(const StoredResponse& stored) {
  const json record = {{"response", stored.response},
                       {"input_items", stored.input_items},
                       {"context_tokens", stored.context_tokens},
                       {"state", json::binary(std::vector<uint8_t>(stored.state_blob.begin(),
                                                                   stored.state_blob.end()))}};
  std::vector<uint8_t> packed = json::to_msgpack(record);
  return std::string(packed.begin(), packed.end());
}

absl::StatusOr<StoredResponse> DecodeStoredResponse(std::string_view record,
                                                    const std::string& id) {
  try {
    const json j = json::from_msgpack(record);
    StoredResponse s;
    s.response = j.at("response");
    s.input_items = j.at("input_items");
    s.context_tokens = j.at("context_tokens").get<int64_t>();
    const auto& blob = j.at("state").get_binary();
    s.state_blob.assign(blob.begin(), blob.end());
    if (!s.response.is_object() || !s.input_items.is_array()) {
      return absl::DataLossError(absl::StrCat("stored response ", QuoteClientText(id),
                                              " is not a record this server wrote: bad shape"));
    }
    return s;
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("stored response ", QuoteClientText(id),
                                            " is not a record this server wrote: ", e.what()));
  }
}

absl::StatusOr<json> ListPage(const json& items, const std::string& order, const std::string& after,
                              int64_t limit) {
  std::vector<const json*> ordered;
  ordered.reserve(items.size());
  for (const json& item : items) ordered.push_back(&item);
  if (order == "desc") std::reverse(ordered.begin(), ordered.end());
  size_t start = 0;
  if (!after.empty()) {
    auto it = std::find_if(ordered.begin(), ordered.end(),
                           [&](const json* item) { return (*item)["id"] == after; });
    if (it == ordered.end()) {
      return WithParam(absl::NotFoundError(absl::StrCat("after: no item ", QuoteClientText(after),
                                                        " in this list")),
                       "after");
    }
    start = static_cast<size_t>(it - ordered.begin()) + 1;
  }
  json data = json::array();
  for (size_t i = start; i < ordered.size() && static_cast<int64_t>(data.size()) < limit; ++i) {
    data.push_back(*ordered[i]);
  }
  const bool has_more = start + data.size() < ordered.size();
  return json{{"object", "list"},
              {"data", data},
              {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
              {"last_id", data.empty() ? json(nullptr) : data.back()["id"]},
              {"has_more", has_more}};
}

}  // namespace tost::service::openai
