// The shared session store: every session lives on Redis (or Valkey), where every replica that
// shares the store and the session key continues it by id, and survives the replica that made it.
//
// What is stored. Per session, a hash at "<prefix>s:<id>": the state, a version incremented by
// every write, a digest of the owner (so another caller's request is refused before any lease is
// taken) and the model's name. The state is the blob ExportSession would return
// (HMAC-authenticated, bound to its owner, its model and the model's weights) sealed once more
// (SessionCodec::Seal) with the session's id, the version it is written as and the owner's digest.
// A store that is tampered with can therefore refuse service but never make a replica continue a
// state that is not this session's: a state that fails authentication, was sealed for another id
// (RENAME, COPY) or another owner, or under another version than the hash says (an older state
// written back) is refused as DATA_LOSS, and logged. So is a version older than one this replica
// saw of the session (the whole hash restored from an older copy); a replica that never saw the
// newer version cannot tell that (nothing outside the store counts versions). States stored by
// servers before this binding are refused the same way, asking for the session to be created again.
// Idle sessions expire through the store's TTL (the session idle timeout, refreshed by every use).
//
// One generation at a time, across replicas. A Checkout takes a lease, "<prefix>l:<id>" holding a
// random token, with an expiry (RedisSessionStoreOptions::lease): a second Checkout anywhere gets
// the busy FAILED_PRECONDITION. The lease is renewed while the call runs, and the Checkin writes
// the new state only while this replica still holds it (compare-and-set on the token, in one Lua
// script), so a replica that stalled past its lease can never overwrite a newer state: its call
// fails with ABORTED instead. A replica that dies mid-call loses its lease within `lease`, and the
// session is then at its last acknowledged state.
//
// Acknowledgement. A Generate on a session ends OK only after its new state is written (Checkin
// calls back once the store answered), so what the store keeps after an acknowledged call is what
// its persistence keeps: with Redis' default for an AOF (appendfsync everysec), a crash of the
// store's host may lose the last second of writes; with appendfsync always, none.
//
// Per-owner quotas (SessionStoreOptions::owner_limits: a tenant's max_sessions and
// max_session_bytes) hold across replicas: an owner with one has an index in the store,
// "<prefix>o:<owner digest>", a hash of its session ids and their state sizes. The script that
// adds a session counts the index (dropping the sessions that are gone: closed, or expired through
// their TTL), refuses past the quota, and adds the session and its entry, in one atomic step, so
// that replicas racing for an owner's last session place it once. Close removes the entry; the
// index's expiry follows its sessions' (every write that extends a session's extends the index's).
// The count reads the owner's sessions' keys inside the script, so the store is one Redis (or
// Valkey) primary, not a cluster.
//
// Hot sessions. A bounded LRU (SessionStoreOptions' max_sessions and max_state_bytes) keeps the
// states this replica used lately with their version: a checkout whose version matches skips the
// blob's transfer and decoding. The store stays the truth: every checkout asks it. The hot version
// is also how far this replica saw the session go: the store answering an older one is refused.
//
// Threads: every method may be called from any thread. Add, Checkout, Release, Get and Close wait
// for the store (at most the client's command timeout); Checkin never waits: writer threads owned
// by the store run it. The destructor finishes queued writes, then joins them.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/engine.h"
#include "service/engine/session_store.h"
#include "service/store/redis_client.h"

namespace tost::store {

struct RedisSessionStoreOptions {
  // Prefixes every key, so that deployments may share one store (--session_store_key_prefix).
  std::string key_prefix = "tost:";
  // How long a replica's claim on a session outlives the replica (--session_lease_ms): a session
  // whose replica died mid-call is busy this long. Renewed every third of it while a call runs.
  absl::Duration lease = absl::Seconds(10);
  // Threads that write check-ins.
  int writer_threads = 2;
};

absl::Status ValidateRedisSessionStoreOptions(const RedisSessionStoreOptions& o,
                                              const service::SessionStoreOptions& sessions);

class RedisSessionStore final : public service::SessionStore {
 public:
  // INVALID_ARGUMENT for invalid options or a context without codec, identity or clock. Does not
  // reach the store: a replica starts while the store is down, and session calls answer
  // UNAVAILABLE until it is back.
  static absl::StatusOr<std::unique_ptr<RedisSessionStore>> Create(
      service::SessionStoreContext context, std::unique_ptr<RedisClient> client,
      RedisSessionStoreOptions options);
  ~RedisSessionStore() override;
  RedisSessionStore(const RedisSessionStore&) = delete;
  RedisSessionStore& operator=(const RedisSessionStore&) = delete;

  // UNAVAILABLE (naming the store) when it cannot be written. Sessions outlive this replica, so a
  // draining replica still adds them.
  absl::StatusOr<std::string> Add(const std::string& owner,
                                  service::GenerationState state) override;
  void StopAdding() override {}
  absl::StatusOr<service::GenerationState> Checkout(const std::string& id,
                                                    const std::string& owner) override;
  // `done`: OK once written; UNAVAILABLE when the store could not be written; ABORTED when this
  // replica's lease had expired (another replica may have advanced the session since).
  void Checkin(const std::string& id, service::GenerationState state, CheckinDone done) override;
  void Release(const std::string& id) override;
  absl::StatusOr<service::GenerationState> Get(const std::string& id,
                                               const std::string& owner) override;
  absl::Status Close(const std::string& id, const std::string& owner) override;
  // Idle sessions expire in the store; the hot copies of this replica are bounded by LRU.
  void ReapIdle() override {}
  service::SessionStoreStats stats() const override;
  const service::SessionStoreOptions& options() const override { return context_.options; }

  const RedisEndpoint& endpoint() const { return client_->endpoint(); }

 private:
  struct Hot {
    std::string owner;
    int64_t version = 0;
    service::GenerationState state;
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  struct Lease {
    std::string token;
    std::string owner;
    int64_t version = 0;  // the version checked out; the check-in writes the next one
  };

  RedisSessionStore(service::SessionStoreContext context, std::unique_ptr<RedisClient> client,
                    RedisSessionStoreOptions options);

  std::string SessionKey(const std::string& id) const;
  std::string LeaseKey(const std::string& id) const;
  std::string OwnerKey(const std::string& owner) const;  // the owner's index of sessions
  int64_t TtlMs() const;
  // Reads a session for `owner`: with a lease (`lease_token` non-empty: Checkout) or without
  // (Get). `version_read` (may be null) gets the version the state is at.
  absl::StatusOr<service::GenerationState> Read(const std::string& id, const std::string& owner,
                                                const std::string& lease_token,
                                                int64_t* version_read);
  // The state of a stored value read at `version` of session `id`, for `owner`; `seen_version`:
  // the newest this replica saw (0: none). DATA_LOSS (logged) for anything but this session's
  // state at that version.
  absl::StatusOr<service::GenerationState> Unseal(const std::string& id, int64_t version,
                                                  int64_t seen_version, const std::string& value,
                                                  const std::string& owner) const;
  // What is stored for `state` as session `id` of `owner` at `version`.
  absl::StatusOr<std::string> Seal(const std::string& id, int64_t version,
                                   const service::GenerationState& state,
                                   const std::string& owner) const;
  // DATA_LOSS for session `id`, whose stored state `what`; logs it.
  absl::Status Refuse(const std::string& id, const std::string& what) const;
  absl::Status StoreError(const absl::Status& status, const std::string& what) const;

  void RememberHot(const std::string& id, const std::string& owner, int64_t version,
                   const service::GenerationState& state) ABSL_LOCKS_EXCLUDED(mu_);
  void ForgetHot(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void EraseHotLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Enqueue(absl::AnyInvocable<void() &&> work) ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop();
  void RenewLoop();

  const service::SessionStoreContext context_;
  const std::unique_ptr<RedisClient> client_;
  const RedisSessionStoreOptions options_;

  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Hot> hot_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // front: least recently used
  int64_t hot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_lru_ ABSL_GUARDED_BY(mu_) = 0;
  // The sessions this replica has checked out, and the tokens of their leases.
  std::unordered_map<std::string, Lease> leases_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void() &&>> work_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> writers_;
  std::thread renewer_;
};

}  // namespace tost::store
