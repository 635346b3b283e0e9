#include "service/openai/conversation_record.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"
#include "service/openai/error.h"
#include "service/openai/responses_body.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

size_t ItemBytes(const json& item) {
  size_t n = 0;
  for (const json& part : item["content"]) n += part["text"].get_ref<const std::string&>().size();
  return n;
}

size_t TotalBytes(const json& items, size_t from) {
  size_t n = 0;
  for (size_t i = from; i < items.size(); ++i) n += ItemBytes(items[i]);
  return n;
}

ChatRole RoleOf(const std::string& role) {
  if (role == "assistant") return ChatRole::kAssistant;
  if (role == "user") return ChatRole::kUser;
  return ChatRole::kSystem;
}

}  // namespace

json ConversationJson(const std::string& id, const StoredConversation& c) {
  return {{"id", id},
          {"object", "conversation"},
          {"created_at", c.created_at},
          {"metadata", c.metadata}};
}

absl::StatusOr<json> AddPendingItems(StoredConversation& c,
                                     const std::vector<InputMessage>& messages,
                                     const std::string& field) {
  const size_t first_pending = c.items.size() - static_cast<size_t>(c.pending);
  size_t bytes = TotalBytes(c.items, first_pending);
  for (const InputMessage& m : messages) bytes += m.message.content.size();
  if (bytes > kMaxConversationItemBytes) {
    return FieldError(field,
                      absl::StrCat("the conversation's items not yet answered would hold ", bytes,
                                   " bytes of text, past its bound of ", kMaxConversationItemBytes,
                                   ": create a response to take them in first"));
  }
  json added = json::array();
  for (const InputMessage& m : messages) {
    json item = MessageItemJson(NewItemId("msg_"), m);
    added.push_back(item);
    c.items.push_back(std::move(item));
    ++c.pending;
  }
  // Items already in the state make room for the new ones.
  while (TotalBytes(c.items, 0) > kMaxConversationItemBytes &&
         c.items.size() > static_cast<size_t>(c.pending)) {
    c.items.erase(c.items.begin());
  }
  return added;
}

std::vector<InputMessage> PendingMessages(const StoredConversation& c) {
  std::vector<InputMessage> out;
  for (size_t i = c.items.size() - static_cast<size_t>(c.pending); i < c.items.size(); ++i) {
    const json& item = c.items[i];
    InputMessage m;
    m.role = item["role"].get<std::string>();
    m.message.role = RoleOf(m.role);
    for (const json& part : item["content"]) m.message.content += part["text"].get<std::string>();
    out.push_back(std::move(m));
  }
  return out;
}

void RecordTurn(StoredConversation& c, const json& turn_items) {
  c.pending = 0;
  for (const json& item : turn_items) c.items.push_back(item);
  while (TotalBytes(c.items, 0) > kMaxConversationItemBytes && c.items.size() > 1) {
    c.items.erase(c.items.begin());
  }
}

std::string EncodeStoredConversation(const StoredConversation& c) {
  const json record = {
      {"created_at", c.created_at},
      {"metadata", c.metadata},
      {"model", c.model},
      {"items", c.items},
      {"pending", c.pending},
      {"context_tokens", c.context_tokens},
      {"state", json::binary(std::vector<uint8_t>(c.state_blob.begin(), c.state_blob.end()))}};
  std::vector<uint8_t> packed = json::to_msgpack(record);
  return std::string(packed.begin(), packed.end());
}

absl::StatusOr<StoredConversation> DecodeStoredConversation(std::string_view record,
                                                            const std::string& id) {
  try {
    const json j = json::from_msgpack(record);
    StoredConversation c;
    c.created_at = j.at("created_at").get<int64_t>();
    c.metadata = j.at("metadata");
    c.model = j.at("model").get<std::string>();
    c.items = j.at("items");
    c.pending = j.at("pending").get<int64_t>();
    c.context_tokens = j.at("context_tokens").get<int64_t>();
    const auto& blob = j.at("state").get_binary();
    c.state_blob.assign(blob.begin(), blob.end());
    if (!c.items.is_array() || c.pending < 0 || static_cast<size_t>(c.pending) > c.items.size()) {
      return absl::DataLossError(absl::StrCat("stored conversation ", QuoteClientText(id),
                                              " is not a record this server wrote: bad items"));
    }
    return c;
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("stored conversation ", QuoteClientText(id),
                                            " is not a record this server wrote: ", e.what()));
  }
}

}  // namespace tost::service::openai
