#include "service/engine/session_codec.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "model/file_util.h"
#include "model/status_macros.h"
#include "tost/v1/session_state.pb.h"

namespace tost::service {
namespace {

constexpr char kMagic[8] = {'T', 'O', 'S', 'T', 'S', 'E', 'S', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4 + 4;
constexpr size_t kMacBytes = 32;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

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

}  // namespace

absl::StatusOr<SessionCodec> SessionCodec::Create(std::string key) {
  if (key.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("session key must hold at least 16 bytes of secret, got ", key.size()));
  }
  return SessionCodec(std::move(key));
}

SessionCodec SessionCodec::WithRandomKey() {
  std::string key(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1)
    std::abort();
  return SessionCodec(std::move(key));
}

std::string SessionCodec::Encode(const GenerationState& s, const ModelIdentity& model) const {
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
  p.set_exported_unix_ms(absl::ToUnixMillis(absl::Now()));
  const std::string payload = p.SerializeAsString();

  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, kVersion);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  out += Hmac(key_, out);
  return out;
}

absl::StatusOr<std::string> SessionCodec::VerifiedPayload(const std::string& blob) const {
  if (blob.size() < kHeaderBytes + kMacBytes ||
      std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("state blob is not a tost-serve session (",
                                                   blob.size(),
                                                   " bytes, expected the TOSTSESS header)"));
  }
  const uint32_t version = GetU32(blob.data() + 8);
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("state blob has format version ", version,
                                                   "; this server reads version ", kVersion));
  }
  const uint32_t len = GetU32(blob.data() + 12);
  if (blob.size() != kHeaderBytes + len + kMacBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("state blob is truncated or padded: ", blob.size(),
                     " bytes, its header announces ", kHeaderBytes + len + kMacBytes));
  }
  const std::string_view body(blob.data(), kHeaderBytes + len);
  const std::string mac = Hmac(key_, body);
  if (CRYPTO_memcmp(mac.data(), blob.data() + body.size(), kMacBytes) != 0) {
    return absl::InvalidArgumentError(
        "state blob failed authentication: it was modified, or signed by a server with another "
        "session key");
  }
  return std::string(blob.data() + kHeaderBytes, len);
}

absl::StatusOr<std::string> SessionCodec::PeekModel(const std::string& blob) const {
  TOST_ASSIGN_OR_RETURN(std::string payload, VerifiedPayload(blob));
  tost::v1::internal::SessionState p;
  if (!p.ParseFromString(payload))
    return absl::InvalidArgumentError("state blob payload does not parse");
  return p.model();
}

absl::StatusOr<GenerationState> SessionCodec::Decode(const std::string& blob,
                                                     const ModelIdentity& model) const {
  TOST_ASSIGN_OR_RETURN(std::string payload, VerifiedPayload(blob));
  tost::v1::internal::SessionState p;
  if (!p.ParseFromString(payload))
    return absl::InvalidArgumentError("state blob payload does not parse");
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
  return s;
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  TOST_ASSIGN_OR_RETURN(std::string contents, model::ReadFileToString(path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(contents.data(), contents.size(), digest, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), len);
}

}  // namespace tost::service
