// Caller identity for session ownership and access control.
//
// With --api_keys_file, every call must carry one of the configured keys in the `x-api-key`
// metadata (or `authorization: Bearer <key>`); its name is the caller's identity. Without keys, a
// TLS client certificate's identity is used when mTLS is on, and "anonymous" otherwise (then a
// session id alone grants access, which is why ids are 128 random bits).
#pragma once

#include <map>
#include <string>

#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"

namespace tost::service {

class Authenticator {
 public:
  // No keys: identities come from TLS or are "anonymous".
  Authenticator() = default;
  // Reads "name key" lines (# comments allowed); keys must be ≥ 16 characters.
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);
  static absl::StatusOr<Authenticator> FromText(const std::string& text, const std::string& source);

  // UNAUTHENTICATED when keys are configured and the call carries none or an unknown one.
  absl::StatusOr<std::string> Identify(const grpc::ServerContextBase& context) const;
  bool keys_configured() const { return !names_by_key_.empty(); }

 private:
  std::map<std::string, std::string> names_by_key_;
};

}  // namespace tost::service
