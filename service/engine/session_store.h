// Server-held generation sessions: an unguessable id → the session's GenerationState, bound to the
// identity that created it. Two backends implement this interface: MemorySessionStore
// (service/engine/memory_session_store.h, the default: one process's memory) and the shared store
// on Redis (service/store/redis_session_store.h), where every replica sharing the store continues
// every session.
//
// A session is "checked out" while a Generate runs on it (busy): it cannot be checked out again,
// exported, forked or closed until it is checked back in with its new state (or released).
//
// Threads: every method may be called from any thread. Checkin may be called on the generation
// scheduler's thread, so it never waits on a network: a remote store finishes it on its own
// threads and reports through `done`. The others may wait (a bounded time): they are called where
// a request is admitted or answered.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/generation_state.h"

namespace tost::service {

// Told of each session a store refused for want of room (metrics); called with the store's lock
// held, so it must be cheap and must not call back into the store.
class SessionStoreObserver {
 public:
  virtual ~SessionStoreObserver() = default;
  virtual void OnStoreFull() = 0;
};

// An owner's limits on the sessions it holds (a tenant's max_sessions and max_session_bytes).
struct OwnerSessionLimits {
  std::optional<int64_t> max_sessions;
  std::optional<int64_t> max_bytes;  // of their states, GenerationState::ByteSize
  bool any() const { return max_sessions.has_value() || max_bytes.has_value(); }
};

struct SessionStoreOptions {
  // The in-memory store: sessions held at once. The shared store: sessions kept hot in this
  // replica's memory (the store itself is bounded by its own memory policy).
  int64_t max_sessions = 4096;
  // Bytes of those sessions' state (GenerationState::ByteSize), with the same two meanings.
  int64_t max_state_bytes = 256LL << 20;
  // Unused this long → evicted (the shared store: expires through the store's TTL).
  absl::Duration idle_timeout = absl::Minutes(30);
  SessionStoreObserver* observer = nullptr;  // not owned, outlives the store; may be null
  // Asked whether an owner may hold one more session of `new_bytes`, given the sessions and bytes
  // it holds (TenantLedger::CheckSessions); its error refuses the session. The in-memory store asks
  // before each new session, with its lock held; the shared store only to word a refusal that its
  // store's own count decided (owner_limits). Null: no per-owner quota.
  std::function<absl::Status(const std::string& owner, int64_t sessions_held, int64_t bytes_held,
                             int64_t new_bytes)>
      owner_quota = nullptr;
  // The shared store: an owner's session quotas, which it counts and checks in the store itself,
  // in the same atomic step that adds the session, so that they hold across every replica. Null:
  // none.
  std::function<OwnerSessionLimits(const std::string& owner)> owner_limits = nullptr;
};

absl::Status ValidateSessionStoreOptions(const SessionStoreOptions& o);

struct SessionStoreStats {
  int64_t sessions = 0;  // held in this replica's memory (the shared store: its hot sessions)
  int64_t busy = 0;      // checked out by this replica
  int64_t state_bytes = 0;
  int64_t evicted_idle = 0;
  int64_t evicted_lru = 0;
};

// 128 random bits from the OS CSPRNG, hex-encoded.
std::string NewSessionId();

// The refusal for a session id that is unknown, closed, expired or someone else's: one message and
// code for all of them, so that ids cannot be probed.
absl::Status SessionNotFound(const std::string& id);

// What a refused caller wanted of a busy session (the advice differs).
enum class SessionUse { kGenerate, kRead, kClose };
// FAILED_PRECONDITION: the session is checked out by a Generate (on any replica of a shared store).
absl::Status SessionBusy(const std::string& id, SessionUse use);

class SessionStore {
 public:
  // Gets the outcome of a Checkin: OK once the new state is stored (for a shared store: written
  // to it, so an acknowledged call survives this replica), or why that is not known to be so (a
  // shared store that did not answer may still have applied the write).
  using CheckinDone = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~SessionStore() = default;

  // Stores a new session. RESOURCE_EXHAUSTED (with a retry hint) when there is no room;
  // UNAVAILABLE once StopAdding() was called, or when a shared store cannot be reached.
  virtual absl::StatusOr<std::string> Add(const std::string& owner, GenerationState state) = 0;
  // The process is draining: a session made now would die with it seconds later (the in-memory
  // store), so Add refuses (UNAVAILABLE, "create it on another replica").
  virtual void StopAdding() = 0;

  // Marks the session busy and returns its state. NOT_FOUND (SessionNotFound) for an unknown id or
  // one that belongs to someone else; FAILED_PRECONDITION when busy.
  virtual absl::StatusOr<GenerationState> Checkout(const std::string& id,
                                                   const std::string& owner) = 0;
  // Stores the state produced by the Generate that checked the session out, frees it, and calls
  // `done` (possibly before returning, on this thread; never with a lock of the caller's held by
  // the store).
  virtual void Checkin(const std::string& id, GenerationState state, CheckinDone done) = 0;
  // Frees a checked-out session without changing its state (the Generate failed before running).
  virtual void Release(const std::string& id) = 0;

  // A copy of an idle session's state (export, fork). Codes as Checkout.
  virtual absl::StatusOr<GenerationState> Get(const std::string& id, const std::string& owner) = 0;
  virtual absl::Status Close(const std::string& id, const std::string& owner) = 0;

  // Evicts sessions idle for longer than idle_timeout. Called periodically by the server.
  virtual void ReapIdle() = 0;

  virtual SessionStoreStats stats() const = 0;
  virtual const SessionStoreOptions& options() const = 0;

  // Checkin, waiting for its outcome: for callers that may block (tests, tools).
  absl::Status CheckinAndWait(const std::string& id, GenerationState state);
};

}  // namespace tost::service
