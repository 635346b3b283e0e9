// Client-supplied text in error messages and logs. A message that repeats a client's string whole
// can be as large as the request (a 300 KB model name comes back as a 300 KB status, which clients
// reject and logs fill with), and control characters in it can forge log lines. So a message
// quotes at most a short prefix, escaped, and says how long the whole was.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tost::service {

inline constexpr size_t kMaxQuotedClientBytes = 64;

// "name" for short printable text; "first 64 bytes…" (300000 bytes) for long text. Bytes outside
// printable ASCII (control characters, quotes, backslashes, UTF-8) are C-escaped.
inline std::string QuoteClientText(std::string_view text) {
  const std::string_view shown = text.substr(0, kMaxQuotedClientBytes);
  std::string out =
      absl::StrCat("\"", absl::CHexEscape(absl::string_view(shown.data(), shown.size())));
  if (shown.size() < text.size()) {
    absl::StrAppend(&out, "...\" (", text.size(), " bytes)");
  } else {
    out += "\"";
  }
  return out;
}

}  // namespace tost::service
