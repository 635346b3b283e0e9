// Exported session blobs: a GenerationState serialised with the model's identity (name, SHA-256 of
// its weights, dimensions), the caller it belongs to and when it expires, authenticated with
// HMAC-SHA256 under a server key, so any replica holding the same model and key can continue the
// session exactly, and a tampered, truncated, foreign, expired, mismatched or someone else's blob
// is refused with a message saying which.
//
// Layout:  "TOSTSESS" | u32 version | u32 payload length | payload | HMAC-SHA256(key, all before)
// with the payload a tost.v1.internal.SessionState protobuf. Integers little-endian.
//
// Versions. 3 is written for a state in the middle of a constrained output: version 2 plus the
// constraint and the output it accepted (GenerationState::constraint). Every other state is still
// written as 2, so that during a rolling upgrade replicas that predate constraints keep reading
// them; a version 3 blob is refused there as an unknown version rather than continued
// unconstrained. 2 records in the payload the owner (the caller identity that exported it;
// empty when authentication is off) and its issue and expiry times. 1 (written before expiry
// and owners existed) has the same layout without them. A version 1 blob is still read
// when neither of those protections applies, that is this codec's TTL is 0 and the caller is
// kAnonymousCaller; otherwise it is refused (FAILED_PRECONDITION) with a message asking to export
// the session again: it cannot prove whose it is or how old it is. The version was bumped, not
// just fields added, so that a server too old to check owners and expiry refuses new blobs
// instead of silently ignoring those fields.
//
// Keys. Several keys may be configured: the first signs, every one verifies, so a key is rotated
// by listing the new one first beside the old one until the old one's blobs are no longer wanted,
// then dropping the old one. A blob signed by a key not in the list is refused as forged.
//
// Codes. INVALID_ARGUMENT: not an authentic blob of this server (malformed, truncated, tampered,
// signed by another or retired key, unknown version). FAILED_PRECONDITION: an authentic blob that
// cannot be continued here as things stand (another model, weights or dimensions; expired; a
// version 1 blob where owners or expiry are enforced); the request itself is well formed and
// authentic, the server's model, clock or policy refuse it, and exporting again (or asking the
// replica of the right model) fixes it, which retrying the same call never does.
// PERMISSION_DENIED: an authentic blob of another caller. Unlike the session store, which answers
// NOT_FOUND for another owner's session id so that ids cannot be probed, nothing is looked up here:
// the caller already holds the blob, so saying it is someone else's reveals nothing and tells a
// legitimate user what to do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/config/config.h"
#include "service/engine/clock.h"
#include "service/engine/generation_state.h"

namespace tost::service {

// The identity Authenticator::Identify (service/api/auth.h) gives every caller when authentication
// is off. Blobs exported under it are not bound to anyone: whoever holds one may continue it, as
// anyone may call such a server. Blobs exported under any other identity (an API key's name, a
// client certificate's identity) are continued only under that same identity. An API key named
// "anonymous" would therefore mint unbound blobs: do not give a key that name.
inline constexpr char kAnonymousCaller[] = "anonymous";

namespace internal_session {
struct OpenedPayload;  // the parsed payload (session_codec.cc)
}  // namespace internal_session

// A blob whose signature and format were checked and whose payload was parsed, once: the model it
// claims routes it (to the scheduler and identity it must match) before it is decoded for a caller.
class OpenedBlob {
 public:
  const std::string& model() const;

 private:
  friend class SessionCodec;
  OpenedBlob(uint32_t version, std::shared_ptr<const internal_session::OpenedPayload> payload)
      : version_(version), payload_(std::move(payload)) {}
  uint32_t version_;
  std::shared_ptr<const internal_session::OpenedPayload> payload_;
};

// What a blob must match to be continued here.
struct ModelIdentity {
  const model::ModelConfig* config = nullptr;  // tost_lm
  std::string weights_sha256;                  // 32 raw bytes
};

struct SessionCodecOptions {
  // How long a blob stays valid after it is exported; zero: blobs do not expire. Decode also
  // refuses a blob older than its own TTL, whatever TTL the exporting replica had.
  absl::Duration ttl = absl::ZeroDuration();
  // Issue times and expiry are read on it; not owned, must outlive the codec.
  Clock* clock = RealClock::Get();
};

class SessionCodec {
 public:
  // `keys`: at least one; each at least 16 bytes of secret. keys[0] signs, all of them verify
  // (tost_server reads them from --session_key_file, see ParseSessionKeys). INVALID_ARGUMENT for
  // no key, a short key, a negative TTL or no clock.
  static absl::StatusOr<SessionCodec> Create(std::vector<std::string> keys,
                                             SessionCodecOptions options = {});
  // A codec with a random key: blobs verify only within this process (no key file configured).
  static SessionCodec WithRandomKey(SessionCodecOptions options = {});

  // `caller`: the identity exporting the blob (Authenticator::Identify); the blob is bound to it
  // unless it is kAnonymousCaller.
  std::string Encode(const GenerationState& state, const ModelIdentity& model,
                     const std::string& caller) const;

  // Verifies and decodes for `caller`. Codes as in the file comment.
  absl::StatusOr<GenerationState> Decode(const std::string& blob, const ModelIdentity& model,
                                         const std::string& caller) const;

  // Authenticates a blob and parses its payload (INVALID_ARGUMENT as in the file comment), so that
  // the model it claims can route it before Decode checks it for a caller: one verification and
  // one parse per blob, however it is routed.
  absl::StatusOr<OpenedBlob> Open(const std::string& blob) const;
  // Decode of an opened blob: the owner, expiry, model, weights and dimensions checks.
  absl::StatusOr<GenerationState> Decode(const OpenedBlob& blob, const ModelIdentity& model,
                                         const std::string& caller) const;

  // The model a blob claims to belong to (after authentication only: no owner or expiry check).
  absl::StatusOr<std::string> PeekModel(const std::string& blob) const;

  // Other records this server keeps where others could write (the shared prefix-state cache's
  // entries): `data` followed by HMAC-SHA256 under the signing key of `purpose` and `data`, so a
  // record of one purpose never verifies as another's, nor as a session blob.
  std::string Seal(std::string_view purpose, std::string_view data) const;
  // The data of a sealed record, verified with every key; INVALID_ARGUMENT when it is not one this
  // server's keys sealed for `purpose`.
  absl::StatusOr<std::string> Unseal(std::string_view purpose, std::string_view sealed) const;

 private:
  SessionCodec(std::vector<std::string> keys, SessionCodecOptions options)
      : keys_(std::move(keys)), options_(options) {}
  struct Verified {
    uint32_t version;
    std::string payload;
  };
  absl::StatusOr<Verified> VerifiedPayload(const std::string& blob) const;

  std::vector<std::string> keys_;  // keys_[0] signs
  SessionCodecOptions options_;
};

// The keys of a --session_key_file, in one of two formats:
//
//   - A single key: the file's whole content, byte for byte (trailing newline included), is the
//     secret. This is the original format (e.g. `head -c 32 /dev/urandom > session.key`) and
//     every file not in the second format is read this way.
//   - A key list: the first line is exactly "tost-session-keys" (surrounding whitespace ignored).
//     Every further line that is not blank and does not start with '#' holds one key, surrounding
//     whitespace trimmed, either as "base64:" followed by its standard base64 encoding (any bytes;
//     e.g. an existing single-key file: echo "base64:$(base64 -w0 session.key)") or as its literal
//     text. The first key signs new blobs; all of them verify. Example:
//
//         tost-session-keys
//         # new key, signs
//         base64:q83vASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4k=
//         # the previous key: verifies blobs exported before the rotation
//         an-older-secret-of-at-least-16-bytes
//
// INVALID_ARGUMENT, naming the line, for a list without keys, bad base64, a key shorter than 16
// bytes or a key listed twice.
absl::StatusOr<std::vector<std::string>> ParseSessionKeys(const std::string& contents);

// SHA-256 of a weights file's bytes (raw 32 bytes), for ModelIdentity. The file must be a regular
// one of at most the host's memory (model::ReadRegularFile): it is read whole.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace tost::service
