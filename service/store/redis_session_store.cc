#include "service/store/redis_session_store.h"

#include <openssl/sha.h>

#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/error_detail.h"
#include "base/little_endian.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "service/engine/client_text.h"
#include "service/observability/logging.h"

namespace tost::store {
namespace {

using service::GenerationState;
using service::SessionBusy;
using service::SessionNotFound;
using service::SessionUse;

// Every script answers {code, ...}: 0 not found (or another owner's), 1 busy, 2 done.
constexpr int64_t kNotFound = 0;
constexpr int64_t kBusy = 1;
constexpr int64_t kOverQuota = 5;

// Every script that sets a session's expiry sets its owner's index's too (KEYS[3] below; PEXPIRE
// of a key that does not exist does nothing), so that the index outlives each of its sessions.

// KEYS: session, owner index. ARGV: blob, owner digest, ttl ms, model, id, state bytes, the owner's
// max_sessions and max_session_bytes ("" none: the owner has no index), the session keys' prefix.
// Answers {2, 1}, or {5, sessions held, bytes held} when one more would pass a quota. The index
// entries whose session is gone (closed elsewhere, expired) are dropped as they are counted: a
// session that expired in the store gives its room back with no replica's help.
const RedisScript& AddScript() {
  static const RedisScript* script = new RedisScript(R"lua(
if ARGV[7] ~= '' or ARGV[8] ~= '' then
  local index = redis.call('HGETALL', KEYS[2])
  local held, held_bytes = 0, 0
  for i = 1, #index, 2 do
    if redis.call('EXISTS', ARGV[9] .. index[i]) == 1 then
      held = held + 1
      held_bytes = held_bytes + tonumber(index[i + 1])
    else
      redis.call('HDEL', KEYS[2], index[i])
    end
  end
  if (ARGV[7] ~= '' and held >= tonumber(ARGV[7])) or
     (ARGV[8] ~= '' and held_bytes + tonumber(ARGV[6]) > tonumber(ARGV[8])) then
    return {5, held, held_bytes}
  end
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[6])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('HSET', KEYS[1], 'blob', ARGV[1], 'ver', 1, 'owner', ARGV[2], 'model', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {2, 1}
)lua");
  return *script;
}

// KEYS: session, lease, owner index. ARGV: owner digest, lease token ("" reads without a lease: it
// must be free), lease ms, ttl ms, the version held hot ("" none). Answers {2, version[, sealed
// state]}: the state only when the hot version is not current.
const RedisScript& ReadScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or owner ~= ARGV[1] then return {0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {1} end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
local ver = redis.call('HGET', KEYS[1], 'ver')
if ver == ARGV[5] then return {2, ver} end
return {2, ver, redis.call('HGET', KEYS[1], 'blob')}
)lua");
  return *script;
}

// KEYS: session, lease, owner index. ARGV: token, sealed state, ttl ms, the version checked out,
// the new version (sealed into the state), id, state bytes (the index's figure, when the owner
// has one). Answers {2, new version}, or {3} when the lease is not ours any more
// (expired; maybe taken by another replica), {0} when the session is gone, {4, version} when the
// version is not the one checked out although the lease is still ours: the state was written by
// something that held no lease (the store was tampered with or rolled back), and the new state,
// sealed for a version that is not next, is not written over it.
const RedisScript& CheckinScript() {
  static const RedisScript* script = new RedisScript(R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {3} end
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local ver = redis.call('HGET', KEYS[1], 'ver')
if ver ~= ARGV[4] then return {4, ver or ''} end
redis.call('HSET', KEYS[1], 'blob', ARGV[2], 'ver', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('HEXISTS', KEYS[3], ARGV[6]) == 1 then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return {2, ARGV[5]}
)lua");
  return *script;
}
constexpr int64_t kLeaseLost = 3;
constexpr int64_t kVersionMoved = 4;

// KEYS: session, lease, owner index. ARGV: token, lease ms, ttl ms ("" releases instead of
// renewing).
const RedisScript& LeaseScript() {
  static const RedisScript* script = new RedisScript(R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {0} end
if ARGV[2] == '' then redis.call('DEL', KEYS[2]); return {2} end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {2}
)lua");
  return *script;
}

// KEYS: session, lease, owner index. ARGV: owner digest, id.
const RedisScript& CloseScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or owner ~= ARGV[1] then return {0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {1} end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[2])
return {2}
)lua");
  return *script;
}

// The owner as the store sees it: a digest, so that the store holds no caller names (API key
// names may say more than they should). The authenticated blob carries the owner itself.
std::string OwnerDigest(const std::string& owner) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  const std::string tagged = absl::StrCat("tost-session-owner", std::string(1, '\0'), owner);
  SHA256(reinterpret_cast<const unsigned char*>(tagged.data()), tagged.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

// What a replica writes to a session's "blob" field: the state sealed (SessionCodec::Seal) with
// the session's id, the version it is written as and its owner's digest, so that a value moved to
// another id, handed to another owner or written back under a later version never verifies as what
// the hash around it claims. The state blob inside is ExportSession's (bound to the owner, the
// model and its weights); its own format is not changed, so exported blobs stay portable.
//   u32 id length | id | u64 version | u32 owner digest length | owner digest | state blob
constexpr char kSealPurpose[] = "session-store";

struct Sealed {
  std::string id;
  int64_t version = 0;
  std::string owner_digest;
  std::string blob;
};

std::string SealedData(const std::string& id, int64_t version, const std::string& owner_digest,
                       const std::string& blob) {
  std::string data;
  data.reserve(16 + id.size() + owner_digest.size() + blob.size());
  base::AppendLittleEndian(data, id.size(), 4);
  data += id;
  base::AppendLittleEndian(data, static_cast<uint64_t>(version), 8);
  base::AppendLittleEndian(data, owner_digest.size(), 4);
  data += owner_digest;
  data += blob;
  return data;
}

// nullopt when `data` is not in SealedData's layout.
std::optional<Sealed> ParseSealedData(std::string_view data) {
  auto take = [&data](size_t n) -> std::optional<std::string_view> {
    if (data.size() < n) return std::nullopt;
    std::string_view out = data.substr(0, n);
    data.remove_prefix(n);
    return out;
  };
  auto length = [&]() -> std::optional<size_t> {
    auto bytes = take(4);
    if (!bytes) return std::nullopt;
    return static_cast<size_t>(base::ReadLittleEndian(bytes->data(), 4));
  };
  Sealed out;
  auto id_length = length();
  if (!id_length) return std::nullopt;
  auto id = take(*id_length);
  auto version = take(8);
  if (!id || !version) return std::nullopt;
  out.id = std::string(*id);
  out.version = static_cast<int64_t>(base::ReadLittleEndian(version->data(), 8));
  auto owner_length = length();
  if (!owner_length) return std::nullopt;
  auto owner = take(*owner_length);
  if (!owner) return std::nullopt;
  out.owner_digest = std::string(*owner);
  out.blob = std::string(data);
  return out;
}

absl::StatusOr<int64_t> ReplyCode(const RedisReply& reply, const char* script) {
  if (reply.type != RedisReply::Type::kArray || reply.elements.empty() ||
      reply.elements[0].type != RedisReply::Type::kInteger) {
    return absl::InternalError(
        absl::StrCat("session store: the ", script, " script answered an unexpected reply shape"));
  }
  return reply.elements[0].integer;
}

absl::StatusOr<int64_t> ReplyVersion(const RedisReply& reply) {
  if (reply.elements.size() < 2) {
    return absl::InternalError("session store: a reply without the session's version");
  }
  const RedisReply& v = reply.elements[1];
  if (v.type == RedisReply::Type::kInteger) return v.integer;
  int64_t version = 0;
  if (v.type == RedisReply::Type::kString && absl::SimpleAtoi(v.str, &version)) return version;
  return absl::InternalError("session store: a session's version is not an integer");
}

}  // namespace

absl::Status ValidateRedisSessionStoreOptions(const RedisSessionStoreOptions& o,
                                              const service::SessionStoreOptions& sessions) {
  if (o.lease < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(absl::StrCat("--session_lease_ms must be >= 100, got ",
                                                   absl::ToInt64Milliseconds(o.lease)));
  }
  if (sessions.idle_timeout < o.lease) {
    return absl::InvalidArgumentError(
        absl::StrCat("the session idle timeout (", absl::FormatDuration(sessions.idle_timeout),
                     ") must be at least --session_lease_ms (", absl::FormatDuration(o.lease),
                     "): a session must not expire in the store while a replica holds its lease"));
  }
  if (o.writer_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the session store needs >= 1 writer thread, got ", o.writer_threads));
  }
  if (o.key_prefix.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_store_key_prefix must be at most 64 bytes, got ", o.key_prefix.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RedisSessionStore>> RedisSessionStore::Create(
    service::SessionStoreContext context, std::unique_ptr<RedisClient> client,
    RedisSessionStoreOptions options) {
  TOST_RETURN_IF_ERROR(service::ValidateSessionStoreOptions(context.options));
  TOST_RETURN_IF_ERROR(ValidateRedisSessionStoreOptions(options, context.options));
  if (context.codec == nullptr || !context.identity || context.clock == nullptr) {
    return absl::InvalidArgumentError(
        "the shared session store needs the engine's codec, model identities and clock");
  }
  if (client == nullptr)
    return absl::InvalidArgumentError("the shared session store needs a client");
  return std::unique_ptr<RedisSessionStore>(
      new RedisSessionStore(std::move(context), std::move(client), std::move(options)));
}

RedisSessionStore::RedisSessionStore(service::SessionStoreContext context,
                                     std::unique_ptr<RedisClient> client,
                                     RedisSessionStoreOptions options)
    : context_(std::move(context)), client_(std::move(client)), options_(std::move(options)) {
  for (int i = 0; i < options_.writer_threads; ++i) writers_.emplace_back([this] { WriterLoop(); });
  renewer_ = std::thread([this] { RenewLoop(); });
}

RedisSessionStore::~RedisSessionStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : writers_) t.join();
  renewer_.join();
}

std::string RedisSessionStore::SessionKey(const std::string& id) const {
  return absl::StrCat(options_.key_prefix, "s:", id);
}
std::string RedisSessionStore::LeaseKey(const std::string& id) const {
  return absl::StrCat(options_.key_prefix, "l:", id);
}
std::string RedisSessionStore::OwnerKey(const std::string& owner) const {
  return absl::StrCat(options_.key_prefix, "o:", OwnerDigest(owner));
}
int64_t RedisSessionStore::TtlMs() const {
  return absl::ToInt64Milliseconds(context_.options.idle_timeout);
}

absl::Status RedisSessionStore::StoreError(const absl::Status& status,
                                           const std::string& what) const {
  // The client's message names the store.
  return WithMessage(status, absl::StrCat("could not ", what, ": ", status.message()));
}

absl::StatusOr<std::string> RedisSessionStore::Seal(const std::string& id, int64_t version,
                                                    const GenerationState& state,
                                                    const std::string& owner) const {
  TOST_ASSIGN_OR_RETURN(service::ModelIdentity identity, context_.identity(state.model));
  return context_.codec->Seal(
      kSealPurpose,
      SealedData(id, version, OwnerDigest(owner), context_.codec->Encode(state, identity, owner)));
}

absl::Status RedisSessionStore::Refuse(const std::string& id, const std::string& what) const {
  // The caller gets DATA_LOSS; the replica's log keeps the trace, whatever the caller does with it:
  // the store gave out a state that is not this session's, or not its latest.
  absl::Status refusal =
      WithServerDetail(absl::DataLossError(absl::StrCat(DescribeStore(client_->endpoint()),
                                                        ": the stored state of session ",
                                                        service::QuoteClientText(id), " ", what)),
                       StoreDetail(client_->endpoint()));
  service::Log(service::LogLevel::kError, "session store: stored state refused",
               {{"store", client_->endpoint().Address()}, {"error", refusal.message()}});
  return refusal;
}

absl::StatusOr<GenerationState> RedisSessionStore::Unseal(const std::string& id, int64_t version,
                                                          int64_t seen_version,
                                                          const std::string& value,
                                                          const std::string& owner) const {
  auto data = context_.codec->Unseal(kSealPurpose, value);
  if (!data.ok()) {
    if (context_.codec->Open(value).ok()) {
      // An authentic blob, as servers before the binding stored it: it could be any of its
      // owner's sessions, at any version, so it is not taken for this one.
      return Refuse(id,
                    "is a state blob stored by an earlier server version, which did not bind "
                    "the stored state to its session id and version, so it cannot be shown to be "
                    "this session's; it is refused: create the session again");
    }
    // Written by no replica with our keys: the store was tampered with, or shares its prefix with
    // a deployment that has other keys.
    return Refuse(id, absl::StrCat("failed authentication (", data.status().message(),
                                   "); it was not written by a replica holding this server's "
                                   "session keys"));
  }
  std::optional<Sealed> sealed = ParseSealedData(*data);
  if (!sealed.has_value()) {
    return Refuse(id, absl::StrCat("is authentic but not in the layout this server writes (",
                                   data->size(), " bytes)"));
  }
  // The id is not quoted back: another session's id is its owner's to know.
  if (sealed->id != id) {
    return Refuse(id,
                  "was sealed for another session id: the store moved or copied another "
                  "session's state to this one's key");
  }
  if (sealed->owner_digest != OwnerDigest(owner)) {
    return Refuse(id,
                  "was sealed for another owner: the store's owner field of the session was "
                  "rewritten");
  }
  if (sealed->version != version) {
    return Refuse(id, absl::StrCat("was sealed as version ", sealed->version,
                                   " but the store's version field says ", version,
                                   ": another version's state was written back in the store"));
  }
  if (version < seen_version) {
    return Refuse(id, absl::StrCat("is at version ", version,
                                   " but this replica already saw version ", seen_version,
                                   ": the store was rolled back (restored from an older copy, or a "
                                   "failover lost acknowledged writes)"));
  }
  auto opened = context_.codec->Open(sealed->blob);
  if (!opened.ok()) {
    return Refuse(id, absl::StrCat("holds a sealed state blob that does not open (",
                                   opened.status().message(), ")"));
  }
  TOST_ASSIGN_OR_RETURN(service::ModelIdentity identity, context_.identity(opened->model()));
  auto state = context_.codec->Decode(*opened, identity, owner);
  if (state.status().code() == absl::StatusCode::kPermissionDenied) return SessionNotFound(id);
  return state;
}

absl::StatusOr<std::string> RedisSessionStore::Add(const std::string& owner,
                                                   GenerationState state) {
  std::string id = service::NewSessionId();
  TOST_ASSIGN_OR_RETURN(const std::string blob, Seal(id, 1, state, owner));
  const service::OwnerSessionLimits limits = context_.options.owner_limits
                                                 ? context_.options.owner_limits(owner)
                                                 : service::OwnerSessionLimits{};
  const auto limit = [](const std::optional<int64_t>& l) {
    return l.has_value() ? absl::StrCat(*l) : std::string();
  };
  const int64_t bytes = static_cast<int64_t>(state.ByteSize());
  auto reply = client_->Eval(
      AddScript(), {SessionKey(id), OwnerKey(owner)},
      {blob, OwnerDigest(owner), absl::StrCat(TtlMs()), state.model, id, absl::StrCat(bytes),
       limit(limits.max_sessions), limit(limits.max_bytes), SessionKey("")});
  if (!reply.ok()) return StoreError(reply.status(), "create a session");
  TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "add"));
  if (code == kOverQuota) {
    const int64_t held = reply->elements.size() > 1 ? reply->elements[1].integer : 0;
    const int64_t held_bytes = reply->elements.size() > 2 ? reply->elements[2].integer : 0;
    // The owner's quota words the refusal (and counts it), from the store's figures.
    if (context_.options.owner_quota) {
      absl::Status refusal = context_.options.owner_quota(owner, held, held_bytes, bytes);
      if (!refusal.ok()) return refusal;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "owner ", service::QuoteClientText(owner), " holds ", held, " sessions of ", held_bytes,
        " bytes in ", DescribeStore(client_->endpoint()), "; one more of ", bytes,
        " bytes would pass its quota (max_sessions ", limit(limits.max_sessions),
        ", max_session_bytes ", limit(limits.max_bytes), ")"));
  }
  RememberHot(id, owner, 1, state);
  return id;
}

absl::StatusOr<GenerationState> RedisSessionStore::Read(const std::string& id,
                                                        const std::string& owner,
                                                        const std::string& lease_token,
                                                        int64_t* version_read) {
  std::string hot_version;
  int64_t seen_version = 0;
  GenerationState hot_state;
  {
    absl::MutexLock lock(&mu_);
    auto it = hot_.find(id);
    if (it != hot_.end() && it->second.owner == owner) {
      seen_version = it->second.version;
      hot_version = absl::StrCat(seen_version);
      hot_state = it->second.state;
      lru_.splice(lru_.end(), lru_, it->second.lru);
    }
  }
  const bool leased = !lease_token.empty();
  auto reply = client_->Eval(
      ReadScript(), {SessionKey(id), LeaseKey(id), OwnerKey(owner)},
      {OwnerDigest(owner), lease_token, absl::StrCat(absl::ToInt64Milliseconds(options_.lease)),
       absl::StrCat(TtlMs()), hot_version});
  if (!reply.ok()) {
    return StoreError(reply.status(), leased ? "check out a session" : "read a session");
  }
  TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "read"));
  if (code == kNotFound) {
    ForgetHot(id);
    return SessionNotFound(id);
  }
  if (code == kBusy) return SessionBusy(id, leased ? SessionUse::kGenerate : SessionUse::kRead);
  // From here on a lease (if asked for) is held: any refusal gives it back.
  auto give_back = [&](absl::Status status) -> absl::Status {
    if (leased) Release(id);
    return status;
  };
  auto version = ReplyVersion(*reply);
  if (!version.ok()) return give_back(version.status());
  if (version_read != nullptr) *version_read = *version;
  if (reply->elements.size() < 3) {
    if (absl::StrCat(*version) != hot_version) {
      return give_back(absl::InternalError("session store: a reply without the session's state"));
    }
    return hot_state;  // the hot copy is current
  }
  // A refused state leaves the hot copy as it was: it is what this replica knows of the session,
  // and a store that was rolled back keeps being refused here rather than believed on a retry.
  auto state = Unseal(id, *version, seen_version, reply->elements[2].str, owner);
  if (!state.ok()) return give_back(state.status());
  RememberHot(id, owner, *version, *state);
  return state;
}

absl::StatusOr<GenerationState> RedisSessionStore::Checkout(const std::string& id,
                                                            const std::string& owner) {
  const std::string token = service::NewSessionId();
  {
    // One replica runs one generation per session at a time, as the in-memory store does, without
    // a round trip: the store's lease decides between replicas.
    absl::MutexLock lock(&mu_);
    if (leases_.contains(id)) return SessionBusy(id, SessionUse::kGenerate);
    leases_[id] = Lease{token, owner};
  }
  int64_t version = 0;
  auto state = Read(id, owner, token, &version);
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it != leases_.end() && it->second.token == token) {
    // The check-in writes the next version, sealed as such, over this one only.
    if (state.ok()) {
      it->second.version = version;
    } else {
      leases_.erase(it);
    }
  }
  return state;
}

void RedisSessionStore::Checkin(const std::string& id, GenerationState state, CheckinDone done) {
  std::string token;
  std::string owner;
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it != leases_.end()) {
      token = it->second.token;
      owner = it->second.owner;
      version = it->second.version;
    }
  }
  if (token.empty()) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "session ", service::QuoteClientText(id), " was not checked out on this replica")));
    return;
  }
  Enqueue([this, id, token, owner, version, state = std::move(state),
           done = std::move(done)]() mutable {
    absl::Status outcome = [&]() -> absl::Status {
      TOST_ASSIGN_OR_RETURN(const std::string blob, Seal(id, version + 1, state, owner));
      auto reply = client_->Eval(
          CheckinScript(), {SessionKey(id), LeaseKey(id), OwnerKey(owner)},
          {token, blob, absl::StrCat(TtlMs()), absl::StrCat(version), absl::StrCat(version + 1), id,
           absl::StrCat(static_cast<int64_t>(state.ByteSize()))});
      if (!reply.ok()) {
        // Unknown whether the store applied the write before the failure: the session is at its
        // state before this call or after it, and any lease left expires by itself.
        return StoreError(reply.status(),
                          "confirm that the session's new state was saved (the session is at its "
                          "state before this call or after it)");
      }
      TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "check-in"));
      if (code == kLeaseLost) {
        return absl::AbortedError(absl::StrCat(
            "session ", service::QuoteClientText(id),
            ": this replica's lease on it expired before "
            "the call ended (longer than --session_lease_ms without reaching the store), so its "
            "new state was not saved; the session is at its last saved state"));
      }
      if (code == kNotFound) return SessionNotFound(id);
      if (code == kVersionMoved) {
        const std::string now_at = reply->elements.size() > 1 ? reply->elements[1].str : "";
        const absl::Status refusal = WithServerDetail(
            absl::AbortedError(absl::StrCat(
                "session ", service::QuoteClientText(id), ": its version in ",
                DescribeStore(client_->endpoint()), " moved from version ", version, " to ",
                now_at.empty() ? "none" : now_at,
                " while this replica held its lease, so something other than a replica holding "
                "the lease wrote it; the new state was not saved")),
            StoreDetail(client_->endpoint()));
        service::Log(service::LogLevel::kError, "session store: check-in refused",
                     {{"store", client_->endpoint().Address()}, {"error", refusal.message()}});
        return refusal;
      }
      TOST_ASSIGN_OR_RETURN(const int64_t written, ReplyVersion(*reply));
      RememberHot(id, owner, written, state);
      return absl::OkStatus();
    }();
    if (!outcome.ok()) ForgetHot(id);
    {
      absl::MutexLock lock(&mu_);
      auto it = leases_.find(id);
      if (it != leases_.end() && it->second.token == token) leases_.erase(it);
    }
    std::move(done)(std::move(outcome));
  });
}

void RedisSessionStore::Release(const std::string& id) {
  std::string token;
  std::string owner;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    token = it->second.token;
    owner = it->second.owner;
    leases_.erase(it);
  }
  // Waited for, so that a call refused at admission leaves the session free when it returns (a
  // retry at once must not find it busy); a failure leaves the lease to expire by itself.
  (void)client_->Eval(LeaseScript(), {SessionKey(id), LeaseKey(id), OwnerKey(owner)},
                      {token, "", ""});
}

absl::StatusOr<GenerationState> RedisSessionStore::Get(const std::string& id,
                                                       const std::string& owner) {
  {
    absl::MutexLock lock(&mu_);
    if (leases_.contains(id)) return SessionBusy(id, SessionUse::kRead);
  }
  return Read(id, owner, /*lease_token=*/"", /*version_read=*/nullptr);
}

absl::Status RedisSessionStore::Close(const std::string& id, const std::string& owner) {
  auto reply = client_->Eval(CloseScript(), {SessionKey(id), LeaseKey(id), OwnerKey(owner)},
                             {OwnerDigest(owner), id});
  if (!reply.ok()) return StoreError(reply.status(), "close a session");
  TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "close"));
  if (code == kNotFound) return SessionNotFound(id);
  if (code == kBusy) return SessionBusy(id, SessionUse::kClose);
  ForgetHot(id);
  return absl::OkStatus();
}

void RedisSessionStore::RememberHot(const std::string& id, const std::string& owner,
                                    int64_t version, const GenerationState& state) {
  const int64_t bytes = static_cast<int64_t>(state.ByteSize());
  absl::MutexLock lock(&mu_);
  EraseHotLocked(id);
  if (bytes > context_.options.max_state_bytes) return;
  while (!lru_.empty() && (static_cast<int64_t>(hot_.size()) + 1 > context_.options.max_sessions ||
                           hot_bytes_ + bytes > context_.options.max_state_bytes)) {
    const std::string oldest = lru_.front();  // a copy: erasing frees the list's string
    EraseHotLocked(oldest);
    ++evicted_lru_;
  }
  Hot& h = hot_[id];
  h.owner = owner;
  h.version = version;
  h.state = state;
  h.bytes = bytes;
  h.lru = lru_.insert(lru_.end(), id);
  hot_bytes_ += bytes;
}

void RedisSessionStore::ForgetHot(const std::string& id) {
  absl::MutexLock lock(&mu_);
  EraseHotLocked(id);
}

void RedisSessionStore::EraseHotLocked(const std::string& id) {
  auto it = hot_.find(id);
  if (it == hot_.end()) return;
  hot_bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  hot_.erase(it);
}

service::SessionStoreStats RedisSessionStore::stats() const {
  absl::MutexLock lock(&mu_);
  service::SessionStoreStats s;
  // This replica's sessions: its hot copies and the ones it has checked out (a checked-out one
  // may have left the hot LRU), so that busy never exceeds sessions.
  s.sessions = static_cast<int64_t>(hot_.size());
  for (const auto& [id, lease] : leases_) s.sessions += hot_.contains(id) ? 0 : 1;
  s.busy = static_cast<int64_t>(leases_.size());
  s.state_bytes = hot_bytes_;
  s.evicted_lru = evicted_lru_;
  return s;
}

void RedisSessionStore::Enqueue(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mu_);
  work_.push_back(std::move(work));
}

void RedisSessionStore::WriterLoop() {
  NameThisThread("redis-write");
  for (;;) {
    absl::AnyInvocable<void() &&> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](RedisSessionStore* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->work_.empty();
          },
          this));
      // Queued writes are finished before the store goes: each is an acknowledged call's state.
      if (work_.empty()) return;
      work = std::move(work_.front());
      work_.pop_front();
    }
    std::move(work)();
  }
}

void RedisSessionStore::RenewLoop() {
  NameThisThread("redis-renew");
  const absl::Duration period = options_.lease / 3;
  for (;;) {
    struct Held {
      std::string id, token, owner;
    };
    std::vector<Held> held;
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) return;
      for (const auto& [id, lease] : leases_) held.push_back({id, lease.token, lease.owner});
    }
    if (held.empty()) continue;
    std::vector<std::vector<std::string>> commands;
    const std::string lease_ms = absl::StrCat(absl::ToInt64Milliseconds(options_.lease));
    const std::string ttl_ms = absl::StrCat(TtlMs());
    for (const Held& h : held) {
      commands.push_back({"EVAL", LeaseScript().source(), "3", SessionKey(h.id), LeaseKey(h.id),
                          OwnerKey(h.owner), h.token, lease_ms, ttl_ms});
    }
    // A failure is retried at the next period; a lease that lapses meanwhile is reported by the
    // call's Checkin (ABORTED).
    (void)client_->Pipeline(commands);
  }
}

}  // namespace tost::store
