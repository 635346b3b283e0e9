#include "service/store/redis_session_store.h"

#include <openssl/sha.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "service/engine/client_text.h"

namespace tost::store {
namespace {

using service::GenerationState;
using service::SessionBusy;
using service::SessionNotFound;
using service::SessionUse;

// Every script answers {code, ...}: 0 not found (or another owner's), 1 busy, 2 done.
constexpr int64_t kNotFound = 0;
constexpr int64_t kBusy = 1;

// KEYS: session. ARGV: blob, owner digest, ttl ms, model.
const RedisScript& AddScript() {
  static const RedisScript* script = new RedisScript(R"lua(
redis.call('HSET', KEYS[1], 'blob', ARGV[1], 'ver', 1, 'owner', ARGV[2], 'model', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {2, 1}
)lua");
  return *script;
}

// KEYS: session, lease. ARGV: owner digest, lease token ("" reads without a lease: it must be
// free), lease ms, ttl ms, the version held hot ("" none). Answers {2, version[, blob]}: the blob
// only when the hot version is not current.
const RedisScript& ReadScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or owner ~= ARGV[1] then return {0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {1} end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local ver = redis.call('HGET', KEYS[1], 'ver')
if ver == ARGV[5] then return {2, ver} end
return {2, ver, redis.call('HGET', KEYS[1], 'blob')}
)lua");
  return *script;
}

// KEYS: session, lease. ARGV: token, blob, ttl ms. Answers {2, new version}, or {3} when the lease
// is not ours any more (expired; maybe taken by another replica), {0} when the session is gone.
const RedisScript& CheckinScript() {
  static const RedisScript* script = new RedisScript(R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {3} end
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local ver = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HSET', KEYS[1], 'blob', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {2, ver}
)lua");
  return *script;
}
constexpr int64_t kLeaseLost = 3;

// KEYS: session, lease. ARGV: token, lease ms, ttl ms ("" releases instead of renewing).
const RedisScript& LeaseScript() {
  static const RedisScript* script = new RedisScript(R"lua(
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {0} end
if ARGV[2] == '' then redis.call('DEL', KEYS[2]); return {2} end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {2}
)lua");
  return *script;
}

// KEYS: session, lease. ARGV: owner digest.
const RedisScript& CloseScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or owner ~= ARGV[1] then return {0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {1} end
redis.call('DEL', KEYS[1])
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
int64_t RedisSessionStore::TtlMs() const {
  return absl::ToInt64Milliseconds(context_.options.idle_timeout);
}

absl::Status RedisSessionStore::StoreError(const absl::Status& status,
                                           const std::string& what) const {
  // The client's message names the store.
  return absl::Status(status.code(), absl::StrCat("could not ", what, ": ", status.message()));
}

absl::StatusOr<std::string> RedisSessionStore::Seal(const GenerationState& state,
                                                    const std::string& owner) const {
  TOST_ASSIGN_OR_RETURN(service::ModelIdentity identity, context_.identity(state.model));
  return context_.codec->Encode(state, identity, owner);
}

absl::StatusOr<GenerationState> RedisSessionStore::Unseal(const std::string& id,
                                                          const std::string& blob,
                                                          const std::string& owner) const {
  auto opened = context_.codec->Open(blob);
  if (!opened.ok()) {
    // Written by no replica with our keys: the store was tampered with, or shares its prefix with
    // a deployment that has other keys.
    return absl::DataLossError(absl::StrCat(
        "the session store at ", client_->endpoint().Address(), ": the stored state of session ",
        service::QuoteClientText(id), " failed authentication (", opened.status().message(),
        "); it was not written by a replica holding this server's session keys"));
  }
  TOST_ASSIGN_OR_RETURN(service::ModelIdentity identity, context_.identity(opened->model()));
  auto state = context_.codec->Decode(*opened, identity, owner);
  if (state.status().code() == absl::StatusCode::kPermissionDenied) return SessionNotFound(id);
  return state;
}

absl::StatusOr<std::string> RedisSessionStore::Add(const std::string& owner,
                                                   GenerationState state) {
  TOST_ASSIGN_OR_RETURN(const std::string blob, Seal(state, owner));
  std::string id = service::NewSessionId();
  auto reply = client_->Eval(AddScript(), {SessionKey(id)},
                             {blob, OwnerDigest(owner), absl::StrCat(TtlMs()), state.model});
  if (!reply.ok()) return StoreError(reply.status(), "create a session");
  RememberHot(id, owner, 1, state);
  return id;
}

absl::StatusOr<GenerationState> RedisSessionStore::Read(const std::string& id,
                                                        const std::string& owner,
                                                        const std::string& lease_token) {
  std::string hot_version;
  GenerationState hot_state;
  {
    absl::MutexLock lock(&mu_);
    auto it = hot_.find(id);
    if (it != hot_.end() && it->second.owner == owner) {
      hot_version = absl::StrCat(it->second.version);
      hot_state = it->second.state;
      lru_.splice(lru_.end(), lru_, it->second.lru);
    }
  }
  const bool leased = !lease_token.empty();
  auto reply = client_->Eval(
      ReadScript(), {SessionKey(id), LeaseKey(id)},
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
  if (reply->elements.size() < 3) {
    if (absl::StrCat(*version) != hot_version) {
      return give_back(absl::InternalError("session store: a reply without the session's state"));
    }
    return hot_state;  // the hot copy is current
  }
  auto state = Unseal(id, reply->elements[2].str, owner);
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
  auto state = Read(id, owner, token);
  if (!state.ok()) {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it != leases_.end() && it->second.token == token) leases_.erase(it);
  }
  return state;
}

void RedisSessionStore::Checkin(const std::string& id, GenerationState state, CheckinDone done) {
  std::string token;
  std::string owner;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it != leases_.end()) {
      token = it->second.token;
      owner = it->second.owner;
    }
  }
  if (token.empty()) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "session ", service::QuoteClientText(id), " was not checked out on this replica")));
    return;
  }
  Enqueue([this, id, token, owner, state = std::move(state), done = std::move(done)]() mutable {
    absl::Status outcome = [&]() -> absl::Status {
      TOST_ASSIGN_OR_RETURN(const std::string blob, Seal(state, owner));
      auto reply = client_->Eval(CheckinScript(), {SessionKey(id), LeaseKey(id)},
                                 {token, blob, absl::StrCat(TtlMs())});
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
      TOST_ASSIGN_OR_RETURN(const int64_t version, ReplyVersion(*reply));
      RememberHot(id, owner, version, state);
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
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    token = it->second.token;
    leases_.erase(it);
  }
  // Waited for, so that a call refused at admission leaves the session free when it returns (a
  // retry at once must not find it busy); a failure leaves the lease to expire by itself.
  (void)client_->Eval(LeaseScript(), {SessionKey(id), LeaseKey(id)}, {token, "", ""});
}

absl::StatusOr<GenerationState> RedisSessionStore::Get(const std::string& id,
                                                       const std::string& owner) {
  {
    absl::MutexLock lock(&mu_);
    if (leases_.contains(id)) return SessionBusy(id, SessionUse::kRead);
  }
  return Read(id, owner, /*lease_token=*/"");
}

absl::Status RedisSessionStore::Close(const std::string& id, const std::string& owner) {
  auto reply = client_->Eval(CloseScript(), {SessionKey(id), LeaseKey(id)}, {OwnerDigest(owner)});
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
    std::vector<std::pair<std::string, std::string>> held;  // id, token
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) return;
      for (const auto& [id, lease] : leases_) held.emplace_back(id, lease.token);
    }
    if (held.empty()) continue;
    std::vector<std::vector<std::string>> commands;
    const std::string lease_ms = absl::StrCat(absl::ToInt64Milliseconds(options_.lease));
    const std::string ttl_ms = absl::StrCat(TtlMs());
    for (const auto& [id, token] : held) {
      commands.push_back({"EVAL", LeaseScript().source(), "2", SessionKey(id), LeaseKey(id), token,
                          lease_ms, ttl_ms});
    }
    // A failure is retried at the next period; a lease that lapses meanwhile is reported by the
    // call's Checkin (ABORTED).
    (void)client_->Pipeline(commands);
  }
}

}  // namespace tost::store
