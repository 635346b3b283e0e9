#include "service/api/auth.h"

#include <algorithm>

#include <openssl/crypto.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "service/engine/session_codec.h"

namespace tost::service {
namespace {

std::string Metadata(const grpc::ServerContextBase& context, const std::string& key) {
  const auto& md = context.client_metadata();
  auto it = md.find(key);
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

}  // namespace

absl::StatusOr<Authenticator> Authenticator::FromText(const std::string& text,
                                                      const std::string& source) {
  Authenticator a;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    // After the key, tenant fields (field=value; TenantTable reads them).
    const bool tenant_fields =
        std::all_of(parts.begin() + std::min<size_t>(parts.size(), 2), parts.end(),
                    [](const std::string& p) { return p.find('=') != std::string::npos; });
    if (parts.size() < 2 || !tenant_fields) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": expected \"name key [field=value ...]\", got ",
                       parts.size(), " fields"));
    }
    // "anonymous" is the identity of callers without a key: a key of that name would share it
    // (their sessions, and state blobs bound to no one).
    if (parts[0] == kAnonymousCaller) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": the name \"",
                                                     kAnonymousCaller,
                                                     "\" is reserved for callers without a key"));
    }
    if (parts[1].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": key of \"", parts[0],
                                                     "\" must be at least 16 characters, got ",
                                                     parts[1].size()));
    }
    if (!a.names_by_key_.emplace(parts[1], parts[0]).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": duplicate key"));
    }
  }
  if (a.names_by_key_.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no keys"));
  return a;
}

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  TOST_ASSIGN_OR_RETURN(std::string text, model::ReadFileToString(path));
  return FromText(text, path);
}

absl::StatusOr<std::string> Authenticator::Identify(const grpc::ServerContextBase& context) const {
  const std::string api_key = Metadata(context, "x-api-key");
  const std::string authorization = Metadata(context, "authorization");
  std::string tls_identity;
  const auto auth_context = context.auth_context();
  if (auth_context != nullptr && auth_context->IsPeerAuthenticated()) {
    for (const auto& id : auth_context->GetPeerIdentity()) {
      tls_identity = std::string(id.data(), id.size());
      break;
    }
  }
  return Identify(CallerCredentials{
      .api_key = api_key, .authorization = authorization, .tls_identity = tls_identity});
}

absl::StatusOr<std::string> Authenticator::Identify(const CallerCredentials& credentials) const {
  if (!names_by_key_.empty()) {
    std::string_view key = credentials.api_key;
    const std::string_view auth = credentials.authorization;
    if (key.empty() &&
        absl::StartsWithIgnoreCase(absl::string_view(auth.data(), auth.size()), "bearer ")) {
      key = auth.substr(7);
    }
    if (key.empty()) {
      return absl::UnauthenticatedError(
          "missing API key: send it in the x-api-key metadata or as authorization: Bearer <key>");
    }
    // Compare against every key in constant time per key, so timing does not reveal prefixes.
    for (const auto& [k, name] : names_by_key_) {
      if (k.size() == key.size() && CRYPTO_memcmp(k.data(), key.data(), k.size()) == 0) return name;
    }
    return absl::UnauthenticatedError("unknown API key");
  }
  if (!credentials.tls_identity.empty()) return "tls:" + std::string(credentials.tls_identity);
  return std::string(kAnonymousCaller);
}

}  // namespace tost::service
