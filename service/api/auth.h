// Caller identity for session ownership and access control.
//
// With --api_keys_file, every call must carry one of the configured keys in the `x-api-key`
// metadata (or `authorization: Bearer <key>`; the same headers on the HTTP front end); its name is
// the caller's identity. Without keys, a TLS client certificate's identity is used when mTLS is on,
// and "anonymous" otherwise (then a session id alone grants access, which is why ids are 128
// random bits). Both front ends call the same check (Identify with CallerCredentials).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"

namespace tost::service {

// What a call presents, whichever front end it came through.
struct CallerCredentials {
  std::string_view api_key;        // x-api-key
  std::string_view authorization;  // the whole Authorization value ("Bearer <key>")
  // The verified TLS client certificate's identity (mTLS); empty without one.
  std::string_view tls_identity;
};

class Authenticator {
 public:
  // No keys: identities come from TLS or are "anonymous".
  Authenticator() = default;
  // Reads "name key" lines (# comments allowed); keys must be ≥ 16 characters.
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);
  static absl::StatusOr<Authenticator> FromText(const std::string& text, const std::string& source);

  // UNAUTHENTICATED when keys are configured and the call carries none or an unknown one.
  absl::StatusOr<std::string> Identify(const grpc::ServerContextBase& context) const;
  absl::StatusOr<std::string> Identify(const CallerCredentials& credentials) const;
  bool keys_configured() const { return !names_by_key_.empty(); }

 private:
  std::map<std::string, std::string> names_by_key_;
};

}  // namespace tost::service
