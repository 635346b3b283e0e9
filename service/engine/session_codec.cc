#include "service/engine/session_codec.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/little_endian.h"
#include "base/status_macros.h"
#include "tost/v1/session_state.pb.h"

namespace tost::service {
namespace {

constexpr char kMagic[8] = {'T', 'O', 'S', 'T', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kConstrainedVersion = 3;  // kVersion plus a constraint in progress
constexpr uint32_t kUnboundVersion = 1;      // no owner, no expiry: read only where neither applies
constexpr size_t kMinKeyBytes = 16;
constexpr char kKeyListHeader[] = "tost-session-keys";
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4 + 4;
constexpr size_t kMacBytes = 32;

void PutU32(std::string& out, uint32_t v) { base::AppendLittleEndian(out, v, 4); }

uint32_t GetU32(const char* p) { return static_cast<uint32_t>(base::ReadLittleEndian(p, 4)); }

std::string Hmac(const std::string& key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

absl::Status Mismatch(const std::string& what, const std::string& blob_value,
                      const std::string& here) {
  return absl::FailedPreconditionError(
      absl::StrCat("state blob was made with ", what, " ", blob_value, " but this server's is ",
                   here, "; continue it on a replica serving the same model"));
}

using ProtoKind = tost::v1::internal::ConstraintProgress;

ProtoKind::Kind ToProto(structured::Constraint::Kind kind) {
  switch (kind) {
    case structured::Constraint::Kind::kJsonSchema:
      return ProtoKind::JSON_SCHEMA;
    case structured::Constraint::Kind::kJsonObject:
      return ProtoKind::JSON_OBJECT;
    case structured::Constraint::Kind::kRegex:
      return ProtoKind::REGEX;
    case structured::Constraint::Kind::kGrammar:
      return ProtoKind::GRAMMAR;
    case structured::Constraint::Kind::kChoice:
      return ProtoKind::CHOICE;
    case structured::Constraint::Kind::kStructuralTag:
      return ProtoKind::STRUCTURAL_TAG;
  }
  return ProtoKind::KIND_UNSPECIFIED;
}

absl::StatusOr<ConstraintProgress> FromProto(const tost::v1::internal::ConstraintProgress& p,
                                             int64_t vocab_size) {
  ConstraintProgress c;
  switch (p.kind()) {
    case ProtoKind::JSON_SCHEMA:
      c.spec.kind = structured::Constraint::Kind::kJsonSchema;
      break;
    case ProtoKind::JSON_OBJECT:
      c.spec.kind = structured::Constraint::Kind::kJsonObject;
      break;
    case ProtoKind::REGEX:
      c.spec.kind = structured::Constraint::Kind::kRegex;
      break;
    case ProtoKind::GRAMMAR:
      c.spec.kind = structured::Constraint::Kind::kGrammar;
      break;
    case ProtoKind::CHOICE:
      c.spec.kind = structured::Constraint::Kind::kChoice;
      break;
    case ProtoKind::STRUCTURAL_TAG:
      c.spec.kind = structured::Constraint::Kind::kStructuralTag;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("state blob is inconsistent: its constraint has unknown kind ", p.kind()));
  }
  c.spec.text = p.text();
  c.spec.choices.assign(p.choices().begin(), p.choices().end());
  for (int32_t id : p.output()) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("state blob is inconsistent: its constraint's output holds token id ", id,
                       ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  c.output.assign(p.output().begin(), p.output().end());
  return c;
}

std::string Rfc3339Ms(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<SessionCodec> SessionCodec::Create(std::vector<std::string> keys,
                                                  SessionCodecOptions options) {
  if (keys.empty()) return absl::InvalidArgumentError("session codec needs at least one key");
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].size() < kMinKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("session key ", i + 1, " of ", keys.size(),
                                                     " must hold at least ", kMinKeyBytes,
                                                     " bytes of secret, got ", keys[i].size()));
    }
  }
  if (options.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session blob TTL must be >= 0 (0: no expiry), got ", absl::FormatDuration(options.ttl)));
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("session codec needs a clock");
  return SessionCodec(std::move(keys), options);
}

SessionCodec SessionCodec::WithRandomKey(SessionCodecOptions options) {
  std::string key(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1)
    std::abort();
  if (options.clock == nullptr) options.clock = RealClock::Get();
  if (options.ttl < absl::ZeroDuration()) options.ttl = absl::ZeroDuration();
  return SessionCodec({std::move(key)}, options);
}

std::string SessionCodec::Encode(const GenerationState& s, const ModelIdentity& model,
                                 const std::string& caller) const {
  const model::LanguageConfig& c = model.config->language;
  tost::v1::internal::SessionState p;
  p.set_model(s.model);
  p.set_weights_sha256(model.weights_sha256);
  p.set_n_layer(c.n_layer);
  p.set_n_embd(c.n_embd);
  p.set_n_head(c.n_head);
  p.set_vocab_size(c.vocab_size);
  p.set_context_length(c.context_length);
  p.set_position(s.sequence.position);
  p.set_stats(std::string(reinterpret_cast<const char*>(s.sequence.stats.data()),
                          s.sequence.stats.size() * sizeof(float)));
  p.set_pending_token(s.pending_token);
  auto* sp = p.mutable_sampling();
  sp->set_temperature(s.sampling.temperature);
  sp->set_top_k(s.sampling.top_k);
  sp->set_top_p(s.sampling.top_p);
  sp->set_min_p(s.sampling.min_p);
  sp->set_repetition_penalty(s.sampling.repetition_penalty);
  sp->set_repetition_window(s.sampling.repetition_window);
  sp->set_seed(s.sampling.seed);
  for (const auto& stop : s.stop_strings) p.add_stop_strings(stop);
  for (int32_t t : s.stop_token_ids) p.add_stop_token_ids(t);
  for (int32_t t : s.recent_tokens) p.add_recent_tokens(t);
  p.set_utf8_pending(s.utf8_pending);
  p.set_held_text(s.held_text);
  p.set_generated_tokens(s.generated_tokens);
  const absl::Time now = options_.clock->Now();
  p.set_exported_unix_ms(absl::ToUnixMillis(now));
  if (options_.ttl > absl::ZeroDuration())
    p.set_expires_unix_ms(absl::ToUnixMillis(now + options_.ttl));
  if (caller != kAnonymousCaller) p.set_owner(caller);
  if (s.constraint.has_value()) {
    auto* cp = p.mutable_constraint();
    cp->set_kind(ToProto(s.constraint->spec.kind));
    cp->set_text(s.constraint->spec.text);
    for (const auto& choice : s.constraint->spec.choices) cp->add_choices(choice);
    cp->mutable_output()->Add(s.constraint->output.begin(), s.constraint->output.end());
  }
  const std::string payload = p.SerializeAsString();

  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, s.constraint.has_value() ? kConstrainedVersion : kVersion);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  out += Hmac(keys_.front(), out);
  return out;
}

namespace internal_session {
struct OpenedPayload {
  tost::v1::internal::SessionState state;
};
}  // namespace internal_session

const std::string& OpenedBlob::model() const { return payload_->state.model(); }

absl::StatusOr<SessionCodec::Verified> SessionCodec::VerifiedPayload(
    const std::string& blob) const {
  if (blob.size() < kHeaderBytes + kMacBytes ||
      std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("state blob is not a tost-serve session (",
                                                   blob.size(),
                                                   " bytes, expected the TOSTSESS header)"));
  }
  const uint32_t version = GetU32(blob.data() + 8);
  if (version != kVersion && version != kUnboundVersion && version != kConstrainedVersion) {
    return absl::InvalidArgumentError(absl::StrCat("state blob has format version ", version,
                                                   "; this server reads versions ", kUnboundVersion,
                                                   " to ", kConstrainedVersion));
  }
  const uint32_t len = GetU32(blob.data() + 12);
  if (blob.size() != kHeaderBytes + len + kMacBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("state blob is truncated or padded: ", blob.size(),
                     " bytes, its header announces ", kHeaderBytes + len + kMacBytes));
  }
  const std::string_view body(blob.data(), kHeaderBytes + len);
  // Every key verifies: blobs signed before a rotation stay valid while their key is listed.
  for (const std::string& key : keys_) {
    const std::string mac = Hmac(key, body);
    if (CRYPTO_memcmp(mac.data(), blob.data() + body.size(), kMacBytes) == 0)
      return Verified{version, std::string(blob.data() + kHeaderBytes, len)};
  }
  return absl::InvalidArgumentError(
      "state blob failed authentication: it was modified, or signed with a session key that is "
      "not one of this server's (another server's key, or one since retired from "
      "--session_key_file)");
}

namespace {
std::string SealedBody(std::string_view purpose, std::string_view data) {
  // The purpose, length-prefixed, then the data: no (purpose, data) pair reads as another.
  std::string body = "TOSTSEAL";
  PutU32(body, static_cast<uint32_t>(purpose.size()));
  body.append(purpose);
  body.append(data);
  return body;
}
}  // namespace

std::string SessionCodec::Seal(std::string_view purpose, std::string_view data) const {
  std::string sealed(data);
  sealed += Hmac(keys_.front(), SealedBody(purpose, data));
  return sealed;
}

absl::StatusOr<std::string> SessionCodec::Unseal(std::string_view purpose,
                                                 std::string_view sealed) const {
  if (sealed.size() < kMacBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sealed ", absl::string_view(purpose.data(), purpose.size()), " record of ",
                     sealed.size(), " bytes is shorter than its MAC"));
  }
  const std::string_view data = sealed.substr(0, sealed.size() - kMacBytes);
  const std::string body = SealedBody(purpose, data);
  for (const std::string& key : keys_) {
    const std::string mac = Hmac(key, body);
    if (CRYPTO_memcmp(mac.data(), sealed.data() + data.size(), kMacBytes) == 0) {
      return std::string(data);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("a ", absl::string_view(purpose.data(), purpose.size()),
                   " record failed authentication: modified, or sealed with a key that is not "
                   "one of this server's"));
}

absl::StatusOr<OpenedBlob> SessionCodec::Open(const std::string& blob) const {
  TOST_ASSIGN_OR_RETURN(Verified verified, VerifiedPayload(blob));
  auto payload = std::make_shared<internal_session::OpenedPayload>();
  if (!payload->state.ParseFromString(verified.payload))
    return absl::InvalidArgumentError("state blob payload does not parse");
  return OpenedBlob(verified.version, std::move(payload));
}

absl::StatusOr<std::string> SessionCodec::PeekModel(const std::string& blob) const {
  TOST_ASSIGN_OR_RETURN(OpenedBlob opened, Open(blob));
  return opened.model();
}

absl::StatusOr<GenerationState> SessionCodec::Decode(const std::string& blob,
                                                     const ModelIdentity& model,
                                                     const std::string& caller) const {
  TOST_ASSIGN_OR_RETURN(OpenedBlob opened, Open(blob));
  return Decode(opened, model, caller);
}

absl::StatusOr<GenerationState> SessionCodec::Decode(const OpenedBlob& blob,
                                                     const ModelIdentity& model,
                                                     const std::string& caller) const {
  const tost::v1::internal::SessionState& p = blob.payload_->state;
  if (blob.version_ == kUnboundVersion) {
    // It proves neither whose it is nor how old it is: only where neither matters.
    const bool bound = caller != kAnonymousCaller;
    const bool expiring = options_.ttl > absl::ZeroDuration();
    if (bound || expiring) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state blob has format version ", kUnboundVersion,
          ", which records neither owner nor expiry, and this server needs ",
          bound && expiring ? "both (the call is authenticated and --session_blob_ttl_s is set)"
          : bound           ? "its owner (the call is authenticated)"
                            : "its expiry (--session_blob_ttl_s is set)",
          "; export the session again to get a version ", kVersion, " blob"));
    }
  } else {
    // The owner first: another caller learns nothing more about the blob than that.
    if (!p.owner().empty() && p.owner() != caller) {
      return absl::PermissionDeniedError(
          caller == kAnonymousCaller
              ? "state blob belongs to an authenticated caller and this call carries no identity; "
                "continue it under the identity that exported it"
              : "state blob belongs to another caller; only the identity that exported it may "
                "continue it");
    }
    // The blob's own expiry, and this server's TTL counted from its issue time: a replica with a
    // longer (or no) TTL cannot mint blobs that outlive this one's policy. absl::Time arithmetic
    // saturates, so no recorded time, however far off, overflows.
    absl::Time expires = p.expires_unix_ms() == 0 ? absl::InfiniteFuture()
                                                  : absl::FromUnixMillis(p.expires_unix_ms());
    if (options_.ttl > absl::ZeroDuration())
      expires = std::min(expires, absl::FromUnixMillis(p.exported_unix_ms()) + options_.ttl);
    const absl::Time now = options_.clock->Now();
    if (now >= expires) {
      return absl::FailedPreconditionError(
          absl::StrCat("state blob expired at ", Rfc3339Ms(expires), " (exported at ",
                       Rfc3339Ms(absl::FromUnixMillis(p.exported_unix_ms())), ", now ",
                       Rfc3339Ms(now), "); export the session again, or continue it sooner"));
    }
  }
  const model::ModelConfig& cfg = *model.config;
  const model::LanguageConfig& c = cfg.language;
  if (p.model() != cfg.name)
    return Mismatch("model", "\"" + p.model() + "\"", "\"" + cfg.name + "\"");
  if (p.weights_sha256() != model.weights_sha256) {
    return Mismatch("weights of model", "\"" + p.model() + "\" (other SHA-256)", "different");
  }
  if (p.n_layer() != c.n_layer || p.n_embd() != c.n_embd || p.n_head() != c.n_head ||
      p.vocab_size() != c.vocab_size || p.context_length() != c.context_length) {
    return Mismatch("dimensions", absl::StrCat(p.n_layer(), "x", p.n_embd(), "x", p.n_head()),
                    absl::StrCat(c.n_layer, "x", c.n_embd, "x", c.n_head));
  }
  const size_t floats = static_cast<size_t>(c.n_layer * c.state_floats_per_layer());
  if (p.stats().size() != floats * sizeof(float) || p.position() < 0 ||
      p.position() > c.context_length || p.pending_token() < -1 ||
      p.pending_token() >= c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("state blob is inconsistent: ", p.stats().size(), " stats bytes (expected ",
                     floats * sizeof(float), "), position ", p.position(), ", pending token ",
                     p.pending_token()));
  }
  GenerationState s;
  s.model = p.model();
  s.sequence.position = p.position();
  s.sequence.stats.resize(floats);
  std::memcpy(s.sequence.stats.data(), p.stats().data(), p.stats().size());
  s.pending_token = p.pending_token();
  const auto& sp = p.sampling();
  s.sampling.temperature = sp.temperature();
  s.sampling.top_k = sp.top_k();
  s.sampling.top_p = sp.top_p();
  s.sampling.min_p = sp.min_p();
  s.sampling.repetition_penalty = sp.repetition_penalty();
  s.sampling.repetition_window = sp.repetition_window();
  s.sampling.seed = sp.seed();
  TOST_RETURN_IF_ERROR(model::ValidateSamplingParams(s.sampling));
  s.stop_strings.assign(p.stop_strings().begin(), p.stop_strings().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.recent_tokens.assign(p.recent_tokens().begin(), p.recent_tokens().end());
  s.utf8_pending = p.utf8_pending();
  s.held_text = p.held_text();
  s.generated_tokens = p.generated_tokens();
  if (p.has_constraint() != (blob.version_ == kConstrainedVersion)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state blob is inconsistent: format version ", blob.version_,
        p.has_constraint() ? " carries a constraint" : " without the constraint it announces"));
  }
  if (p.has_constraint()) {
    TOST_ASSIGN_OR_RETURN(s.constraint, FromProto(p.constraint(), c.vocab_size));
    const int64_t tokens = s.sequence.position + (s.pending_token >= 0 ? 1 : 0);
    if (static_cast<int64_t>(s.constraint->output.size()) > tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state blob is inconsistent: its constraint accepted ", s.constraint->output.size(),
          " token(s), more than the ", tokens, " its sequence holds"));
    }
  }
  return s;
}

absl::StatusOr<std::vector<std::string>> ParseSessionKeys(const std::string& contents) {
  std::vector<absl::string_view> lines = absl::StrSplit(contents, '\n');
  if (absl::StripAsciiWhitespace(lines.front()) != kKeyListHeader) {
    // The original format: the whole file is the key, exactly as servers before key lists read it.
    if (contents.size() < kMinKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the session key (the whole file, as it does not start with a \"", kKeyListHeader,
          "\" line) must hold at least ", kMinKeyBytes, " bytes, got ", contents.size()));
    }
    return std::vector<std::string>{contents};
  }
  std::vector<std::string> keys;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = absl::StripAsciiWhitespace(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat("line ", i + 1, ": ");
    std::string key;
    if (absl::StartsWith(line, "base64:")) {
      if (!absl::Base64Unescape(line.substr(7), &key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "expected standard base64 after \"base64:\""));
      }
    } else {
      key = std::string(line);
    }
    if (key.size() < kMinKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, "a session key must hold at least ",
                                                     kMinKeyBytes, " bytes, got ", key.size()));
    }
    for (const std::string& k : keys) {
      if (k == key) return absl::InvalidArgumentError(absl::StrCat(where, "key listed twice"));
    }
    keys.push_back(std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the \"", kKeyListHeader, "\" list holds no key; expected one per line"));
  }
  return keys;
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  TOST_ASSIGN_OR_RETURN(std::string contents,
                        model::ReadRegularFile(path, model::MaxWeightsFileBytes(), "weights file"));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(contents.data(), contents.size(), digest, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), len);
}

}  // namespace tost::service
