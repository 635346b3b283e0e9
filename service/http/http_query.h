// Percent-decoding (RFC 3986) of the parts of a request target that handlers read: the path
// parameters the router captures and the query string of REST routes such as
// GET /v1/responses/{response_id}/input_items?limit=20&order=asc&after=msg_x.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::http {

using QueryParams = std::vector<std::pair<std::string, std::string>>;

// A query may repeat a key; beyond this many pairs it is refused, so a client cannot make a
// handler scan an arbitrarily long list on every lookup.
inline constexpr size_t kMaxQueryPairs = 64;

// `s` with every %XX replaced by its byte, and with `plus_is_space` every '+' by a space (the
// form encoding of a query; in a path '+' is itself). Nullopt when a '%' is not followed by two
// hex digits. The result may hold any byte, '/' and NUL included: the caller decides what it
// accepts.
std::optional<std::string> PercentDecode(std::string_view s, bool plus_is_space = false);

// The pairs of `query` (the target after '?', without it) in the order sent: split on '&', each
// piece "key=value" (split at its first '=') or "key" (value ""), both percent-decoded with '+' as
// a space; empty pieces ("a=1&&b=2") are skipped. INVALID_ARGUMENT naming the piece for a bad %XX
// escape, and for more than kMaxQueryPairs pairs.
absl::StatusOr<QueryParams> ParseQuery(std::string_view query);

// The last value of `key` in `query` (a repeated key: the last one wins), nullopt if absent.
std::optional<std::string> QueryValue(const QueryParams& query, std::string_view key);

}  // namespace tost::http
