// libFuzzer target: exported session blobs (service/engine/session_codec.h: Decode, Open,
// PeekModel) and session key files (ParseSessionKeys).
//
// Each input is tried as a blob twice:
//   1. as it is: the envelope checks (magic, version, length, HMAC) on bytes an attacker sends;
//   2. re-signed: its last 32 bytes replaced by the HMAC-SHA256 of the rest under the codec's key,
//      so that mutations of the header and the protobuf payload get past authentication and reach
//      the payload's parsing and validation (owner, expiry, model, dimensions, sampling), which is
//      what a replica with the same key, or an attacker holding the key, can send.
// Both go to a codec without TTL and one with a 1-hour TTL (on a fake clock), for an anonymous and
// an authenticated caller. A blob that decodes is encoded again and must decode to the same state:
// "any replica holding the same model and key can continue the session exactly".
//
// Each input is also read as a key file: the keys of one that parses are a non-empty list without
// repeats, which a codec takes when each key is at least 16 bytes long.
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "model/config/config.h"
#include "service/engine/clock.h"
#include "service/engine/session_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::service::GenerationState;
using tost::service::ModelIdentity;
using tost::service::SessionCodec;

// tests/fuzz/make_seeds.py signs the seed blobs with the first key and writes them as exported a
// minute before the fake clock's time.
constexpr char kKey[] = "tost-fuzz-session-key-0123456789";
constexpr char kRetiredKey[] = "tost-fuzz-retired-key-0123456789";
constexpr int64_t kNowUnixSeconds = 1'763'000'000;
constexpr size_t kMacBytes = 32;

std::string Hmac(std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), kKey, static_cast<int>(std::strlen(kKey)),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

SessionCodec MakeCodec(absl::Duration ttl) {
  static tost::service::FakeClock* const clock =
      new tost::service::FakeClock(absl::FromUnixSeconds(kNowUnixSeconds));
  auto codec = SessionCodec::Create({kKey, kRetiredKey}, {.ttl = ttl, .clock = clock});
  TOST_FUZZ_CHECK(codec.ok());
  return *std::move(codec);
}

template <typename T>
bool SameBits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

bool SameState(const GenerationState& a, const GenerationState& b) {
  const auto& x = a.sampling;
  const auto& y = b.sampling;
  return a.model == b.model && a.sequence.position == b.sequence.position &&
         a.sequence.stats.size() == b.sequence.stats.size() &&
         std::memcmp(a.sequence.stats.data(), b.sequence.stats.data(),
                     a.sequence.stats.size() * sizeof(float)) == 0 &&
         a.pending_token == b.pending_token && SameBits(x.temperature, y.temperature) &&
         x.top_k == y.top_k && SameBits(x.top_p, y.top_p) && SameBits(x.min_p, y.min_p) &&
         SameBits(x.repetition_penalty, y.repetition_penalty) &&
         x.repetition_window == y.repetition_window && x.seed == y.seed &&
         a.stop_strings == b.stop_strings && a.stop_token_ids == b.stop_token_ids &&
         a.recent_tokens == b.recent_tokens && a.utf8_pending == b.utf8_pending &&
         a.held_text == b.held_text && a.generated_tokens == b.generated_tokens;
}

// The model the seed blobs were made for (tests/fuzz/make_seeds.py): 2 layers × (2·4 + 2) floats.
const tost::model::ModelConfig& Config() {
  static const tost::model::ModelConfig* const config = [] {
    auto* c = new tost::model::ModelConfig();
    c->name = "fuzz-lm";
    c->architecture = tost::model::Architecture::kLanguage;
    c->language.n_layer = 2;
    c->language.n_embd = 4;
    c->language.n_head = 2;
    c->language.vocab_size = 300;
    c->language.context_length = 64;
    c->language.eos_token_id = 256;
    return c;
  }();
  return *config;
}

void TryBlob(const SessionCodec& codec, const std::string& blob) {
  const ModelIdentity model{&Config(), std::string(32, '\xab')};
  (void)codec.PeekModel(blob);
  const absl::StatusOr<tost::service::OpenedBlob> opened = codec.Open(blob);
  for (const std::string caller : {tost::service::kAnonymousCaller, "alice"}) {
    const absl::StatusOr<GenerationState> state = codec.Decode(blob, model, caller);
    // Opening first (as an admission does, to route the blob) decides the same way.
    TOST_FUZZ_CHECK(opened.ok() || state.status().code() == opened.status().code());
    if (opened.ok()) {
      const absl::StatusOr<GenerationState> via_open = codec.Decode(*opened, model, caller);
      TOST_FUZZ_CHECK(via_open.status().code() == state.status().code());
      TOST_FUZZ_CHECK(!via_open.ok() || SameState(*via_open, *state));
    }
    if (!state.ok()) continue;
    TOST_FUZZ_CHECK(state->model == Config().name);
    TOST_FUZZ_CHECK(state->sequence.stats.size() ==
                    static_cast<size_t>(Config().language.n_layer *
                                        Config().language.state_floats_per_layer()));
    const std::string again = codec.Encode(*state, model, caller);
    const absl::StatusOr<GenerationState> decoded = codec.Decode(again, model, caller);
    TOST_FUZZ_CHECK(decoded.ok());
    TOST_FUZZ_CHECK(SameState(*state, *decoded));
    const absl::StatusOr<std::string> peeked = codec.PeekModel(again);
    TOST_FUZZ_CHECK(peeked.ok() && *peeked == Config().name);
  }
}

void TryKeyFile(const std::string& text) {
  const absl::StatusOr<std::vector<std::string>> keys = tost::service::ParseSessionKeys(text);
  if (!keys.ok()) return;
  TOST_FUZZ_CHECK(!keys->empty());
  bool long_enough = true;
  for (size_t i = 0; i < keys->size(); ++i) {
    long_enough = long_enough && (*keys)[i].size() >= 16;
    for (size_t j = 0; j < i; ++j) TOST_FUZZ_CHECK((*keys)[i] != (*keys)[j]);
  }
  if (long_enough) TOST_FUZZ_CHECK(SessionCodec::Create(*keys).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const SessionCodec plain = MakeCodec(absl::ZeroDuration());
  static const SessionCodec expiring = MakeCodec(absl::Hours(1));
  const std::string input(tost::fuzz::Bytes(data, size));
  std::string resigned;
  if (input.size() >= kMacBytes) {
    const std::string_view body = std::string_view(input).substr(0, input.size() - kMacBytes);
    resigned = std::string(body) + Hmac(body);
  }
  for (const SessionCodec* codec : {&plain, &expiring}) {
    TryBlob(*codec, input);
    if (!resigned.empty()) TryBlob(*codec, resigned);
  }
  TryKeyFile(input);
  return 0;
}
