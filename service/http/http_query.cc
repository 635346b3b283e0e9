#include "service/http/http_query.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"

namespace tost::http {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '%') {
      const int hi = i + 1 < s.size() ? HexValue(s[i + 1]) : -1;
      const int lo = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<QueryParams> ParseQuery(std::string_view query) {
  // Counted before anything is decoded, so an oversized query costs no allocations.
  size_t pairs = 0;
  for (size_t start = 0; start <= query.size();) {
    const size_t end = std::min(query.find('&', start), query.size());
    if (end > start) ++pairs;
    start = end + 1;
  }
  if (pairs > kMaxQueryPairs) {
    return absl::InvalidArgumentError(absl::StrCat("query has ", pairs, " parameters; at most ",
                                                   kMaxQueryPairs, " are accepted"));
  }
  QueryParams out;
  out.reserve(pairs);
  for (size_t start = 0; start <= query.size();) {
    const size_t end = std::min(query.find('&', start), query.size());
    const std::string_view piece = query.substr(start, end - start);
    start = end + 1;
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    std::optional<std::string> key = PercentDecode(piece.substr(0, eq), /*plus_is_space=*/true);
    std::optional<std::string> value =
        eq == std::string_view::npos ? std::optional<std::string>("")
                                     : PercentDecode(piece.substr(eq + 1), /*plus_is_space=*/true);
    if (!key || !value) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter ", service::QuoteClientText(piece),
                       ": invalid percent-encoding (expected '%' and two hex digits)"));
    }
    out.emplace_back(*std::move(key), *std::move(value));
  }
  return out;
}

std::optional<std::string> QueryValue(const QueryParams& query, std::string_view key) {
  for (auto it = query.rbegin(); it != query.rend(); ++it) {
    if (it->first == key) return it->second;
  }
  return std::nullopt;
}

}  // namespace tost::http
