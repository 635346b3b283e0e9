// OpenAI's request identifiers of the client's own end user and of its cache grouping, read alike
// by the chat, completions and Responses routes:
//   - `user` and `safety_identifier` (which replaces it): who the end user is, for abuse
//     monitoring. Here they go to the request's access-log line, as fields of the same names
//     (service/observability/logging.h escapes them, so no value can forge a field or a line).
//   - `prompt_cache_key`: requests that share a long prefix share the key. Here requests of one key
//     (and one caller) keep the state at the prefix they have in common in the prefix-state cache
//     (service/engine/prefix_groups.h), so the next one of the key starts from it.
// Each is a string of bounded length (characters, as OpenAI counts them); an empty one is as
// absent.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "service/generation/generation_input.h"

namespace tost::service::openai {

// OpenAI's documented bound on safety_identifier.
inline constexpr size_t kMaxSafetyIdentifierChars = 64;
// This server's bound on `user` (OpenAI documents none): an email address or a hash fits.
inline constexpr size_t kMaxUserChars = 256;
// The engine's bound on prompt_cache_key, checked here first under OpenAI's field name.
inline constexpr size_t kMaxPromptCacheKeyChars = service::kMaxPromptCacheKeyChars;

struct ClientIdentifiers {
  std::string user;
  std::string safety_identifier;
  std::string prompt_cache_key;
};

// The three fields of a parsed request body (absent or null: empty). INVALID_ARGUMENT naming the
// field for a value that is not a string or is longer than its bound.
absl::StatusOr<ClientIdentifiers> ParseClientIdentifiers(const nlohmann::json& body);

// The access-log fields of `ids`: ("user", ...) and ("safety_identifier", ...), each when set.
std::vector<std::pair<std::string, std::string>> AccessLogFields(const ClientIdentifiers& ids);

}  // namespace tost::service::openai
