// Exported session blobs: a GenerationState serialised with the model's identity (name, SHA-256 of
// its weights, dimensions) and authenticated with HMAC-SHA256 under a server key, so any replica
// holding the same model and key can continue the session exactly, and a tampered, truncated,
// foreign or mismatched blob is refused with a message saying which.
//
// Layout (version 1):  "TOSTSESS" | u32 version | u32 payload length | payload | HMAC-SHA256(key,
// all before) with the payload a tost.v1.internal.SessionState protobuf. Integers little-endian.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "service/engine/generation_state.h"

namespace tost::service {

// What a blob must match to be continued here.
struct ModelIdentity {
  const model::ModelConfig* config = nullptr;  // tost_lm
  std::string weights_sha256;                  // 32 raw bytes
};

class SessionCodec {
 public:
  // `key`: at least 16 bytes of secret (tost_server reads it from --session_key_file).
  static absl::StatusOr<SessionCodec> Create(std::string key);
  // A codec with a random key: blobs verify only within this process (no key file configured).
  static SessionCodec WithRandomKey();

  std::string Encode(const GenerationState& state, const ModelIdentity& model) const;

  // Verifies and decodes. INVALID_ARGUMENT for a malformed, truncated or tampered blob (or one
  // signed with another key); FAILED_PRECONDITION for a valid blob of another model, other
  // weights or other dimensions.
  absl::StatusOr<GenerationState> Decode(const std::string& blob, const ModelIdentity& model) const;

  // The model a blob claims to belong to (after authentication), to route it before decoding.
  absl::StatusOr<std::string> PeekModel(const std::string& blob) const;

 private:
  explicit SessionCodec(std::string key) : key_(std::move(key)) {}
  absl::StatusOr<std::string> VerifiedPayload(const std::string& blob) const;

  std::string key_;
};

// SHA-256 of a file's bytes (raw 32 bytes), for ModelIdentity.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace tost::service
