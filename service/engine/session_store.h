// Server-held generation sessions: an unguessable id → the session's GenerationState, bound to the
// identity that created it. Bounded by count and by state bytes, with LRU eviction of idle
// sessions and an idle timeout; every eviction is counted by reason.
//
// A session is "checked out" while a Generate runs on it (busy): it cannot be exported, forked,
// closed or evicted until it is checked back in with its new state.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/clock.h"
#include "service/engine/generation_state.h"

namespace tost::service {

// Told of each session the store refused for want of room (metrics); called with the store's lock
// held, so it must be cheap and must not call back into the store.
class SessionStoreObserver {
 public:
  virtual ~SessionStoreObserver() = default;
  virtual void OnStoreFull() = 0;
};

struct SessionStoreOptions {
  int64_t max_sessions = 4096;  // sessions held at once
  int64_t max_state_bytes =
      256LL << 20;  // bytes of all sessions' state (GenerationState::ByteSize)
  absl::Duration idle_timeout = absl::Minutes(30);  // unused this long → evicted
  SessionStoreObserver* observer = nullptr;         // not owned, outlives the store; may be null
};

absl::Status ValidateSessionStoreOptions(const SessionStoreOptions& o);

struct SessionStoreStats {
  int64_t sessions = 0;
  int64_t busy = 0;
  int64_t state_bytes = 0;
  int64_t evicted_idle = 0;
  int64_t evicted_lru = 0;
};

// 128 random bits from the OS CSPRNG, hex-encoded.
std::string NewSessionId();

class SessionStore {
 public:
  SessionStore(SessionStoreOptions options, Clock* clock) : options_(options), clock_(clock) {}

  // Stores a new session, evicting least recently used idle sessions if the count or byte budget
  // needs room. RESOURCE_EXHAUSTED (with a retry hint) if busy sessions alone fill the budget;
  // UNAVAILABLE once StopAdding() was called.
  absl::StatusOr<std::string> Add(const std::string& owner, GenerationState state);
  // The process is draining: a session made now would die with it seconds later, so Add refuses
  // (UNAVAILABLE, "create it on another replica") while the sessions held stay usable for export.
  void StopAdding();

  // Marks the session busy and returns a copy of its state. NOT_FOUND for an unknown id or one
  // that belongs to someone else (indistinguishable on purpose); FAILED_PRECONDITION when busy.
  absl::StatusOr<GenerationState> Checkout(const std::string& id, const std::string& owner);
  // Stores the state produced by the Generate that checked the session out, and frees it.
  void Checkin(const std::string& id, GenerationState state);
  // Frees a checked-out session without changing its state (the Generate failed before running).
  void Release(const std::string& id);

  // A copy of an idle session's state (export, fork).
  absl::StatusOr<GenerationState> Get(const std::string& id, const std::string& owner);
  absl::Status Close(const std::string& id, const std::string& owner);

  // Evicts sessions idle for longer than idle_timeout. Called periodically by the server.
  void ReapIdle();

  SessionStoreStats stats() const;
  const SessionStoreOptions& options() const { return options_; }

 private:
  struct Entry {
    std::string owner;
    GenerationState state;
    int64_t bytes = 0;
    bool busy = false;
    absl::Time last_used;
    std::list<std::string>::iterator lru;  // position in lru_ (front = least recently used)
  };

  absl::StatusOr<Entry*> Find(const std::string& id, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(const std::string& id, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Erase(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts idle LRU sessions until `extra_bytes` more bytes and `extra_sessions` more sessions
  // fit; false if impossible.
  bool MakeRoom(int64_t extra_bytes, int64_t extra_sessions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionStoreOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_idle_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_lru_ ABSL_GUARDED_BY(mu_) = 0;
  bool adding_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace tost::service
