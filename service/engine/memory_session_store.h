// The default session store: sessions in this process's memory, bounded by count and by state
// bytes, with LRU eviction of idle sessions and an idle timeout; every eviction is counted by
// reason. Sessions end with the process (export them, or use the shared store, to outlive it).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/engine/clock.h"
#include "service/engine/session_store.h"

namespace tost::service {

class MemorySessionStore final : public SessionStore {
 public:
  MemorySessionStore(SessionStoreOptions options, Clock* clock)
      : options_(options), clock_(clock) {}

  // RESOURCE_EXHAUSTED when busy sessions alone fill the count or byte budget; idle ones are
  // evicted, least recently used first, to make room.
  absl::StatusOr<std::string> Add(const std::string& owner, GenerationState state) override;
  void StopAdding() override;
  absl::StatusOr<GenerationState> Checkout(const std::string& id,
                                           const std::string& owner) override;
  // Always succeeds, before returning.
  void Checkin(const std::string& id, GenerationState state, CheckinDone done) override;
  void Release(const std::string& id) override;
  absl::StatusOr<GenerationState> Get(const std::string& id, const std::string& owner) override;
  absl::Status Close(const std::string& id, const std::string& owner) override;
  void ReapIdle() override;
  SessionStoreStats stats() const override;
  const SessionStoreOptions& options() const override { return options_; }

 private:
  struct OwnerHolds {
    int64_t sessions = 0;
    int64_t bytes = 0;
  };
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
  void CheckinLocked(const std::string& id, GenerationState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts idle LRU sessions until `extra_bytes` more bytes and `extra_sessions` more sessions
  // fit; false if impossible.
  bool MakeRoom(int64_t extra_bytes, int64_t extra_sessions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SessionStoreOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Per owner, for SessionStoreOptions::owner_quota; an owner holding nothing has no entry.
  std::unordered_map<std::string, OwnerHolds> owners_ ABSL_GUARDED_BY(mu_);
  int64_t evicted_idle_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_lru_ ABSL_GUARDED_BY(mu_) = 0;
  bool adding_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace tost::service
