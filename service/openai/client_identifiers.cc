#include "service/openai/client_identifiers.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/openai/error.h"
#include "service/openai/json_fields.h"

namespace tost::service::openai {
namespace {

using json = nlohmann::json;

// Code points of UTF-8 text (the body was checked to be UTF-8): bytes that do not continue one.
size_t Chars(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

absl::Status Read(const json& body, const char* key, size_t max_chars, std::string& out) {
  const json& v = Field(body, key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_string()) return Expected(key, "a string", v);
  std::string s = v.get<std::string>();
  if (const size_t chars = Chars(s); chars > max_chars) {
    return FieldError(key, absl::StrCat("expected a string of at most ", max_chars,
                                        " characters, got one of ", chars));
  }
  out = std::move(s);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientIdentifiers> ParseClientIdentifiers(const json& body) {
  ClientIdentifiers ids;
  TOST_RETURN_IF_ERROR(Read(body, "user", kMaxUserChars, ids.user));
  TOST_RETURN_IF_ERROR(
      Read(body, "safety_identifier", kMaxSafetyIdentifierChars, ids.safety_identifier));
  TOST_RETURN_IF_ERROR(
      Read(body, "prompt_cache_key", kMaxPromptCacheKeyChars, ids.prompt_cache_key));
  return ids;
}

std::vector<std::pair<std::string, std::string>> AccessLogFields(const ClientIdentifiers& ids) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!ids.user.empty()) out.emplace_back("user", ids.user);
  if (!ids.safety_identifier.empty()) out.emplace_back("safety_identifier", ids.safety_identifier);
  return out;
}

}  // namespace tost::service::openai
