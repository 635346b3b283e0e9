// What a conversation of the Conversations API is on the record store: the state after its last
// response (a sealed, owner-bound session blob: continuing needs no transcript), its items as
// text for listing, and the items added since that response (through POST .../items or at
// creation), which the next response prefills before its own input. Pure: no HTTP, no engine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "service/openai/responses_request.h"

namespace tost::service::openai {

// Bytes of item text a conversation keeps for listing; past it the earliest items already in the
// state are dropped from the list (the state still holds them). Items not yet in the state are
// never dropped: adding more than this is refused.
inline constexpr size_t kMaxConversationItemBytes = 256 * 1024;

struct StoredConversation {
  int64_t created_at = 0;
  nlohmann::json metadata = nlohmann::json::object();
  std::string model;  // "" until its first response; then every response must use it
  nlohmann::json items = nlohmann::json::array();  // message items, oldest first
  int64_t pending = 0;  // the last `pending` items are not in the state yet
  int64_t context_tokens = 0;
  std::string state_blob;  // "" until its first response
};

// {"id", "object": "conversation", "created_at", "metadata"}.
nlohmann::json ConversationJson(const std::string& id, const StoredConversation& c);

// Appends `messages` as items not yet in the state (new ids); INVALID_ARGUMENT naming `field` when
// the pending items would exceed kMaxConversationItemBytes. Returns the new items.
absl::StatusOr<nlohmann::json> AddPendingItems(StoredConversation& c,
                                               const std::vector<InputMessage>& messages,
                                               const std::string& field);
// The items not yet in the state, as messages to prefill.
std::vector<InputMessage> PendingMessages(const StoredConversation& c);
// After a response: every item is in the state, `turn_items` (its input and output items) are
// appended, and the earliest items are dropped past kMaxConversationItemBytes.
void RecordTurn(StoredConversation& c, const nlohmann::json& turn_items);

std::string EncodeStoredConversation(const StoredConversation& c);
// DATA_LOSS when the record is not one EncodeStoredConversation wrote.
absl::StatusOr<StoredConversation> DecodeStoredConversation(std::string_view record,
                                                            const std::string& id);

}  // namespace tost::service::openai
