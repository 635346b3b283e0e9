#include "service/engine/memory_session_store.h"

#include "absl/strings/str_cat.h"

namespace tost::service {

absl::StatusOr<MemorySessionStore::Entry*> MemorySessionStore::Find(const std::string& id,
                                                                    const std::string& owner) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.owner != owner) {
    return SessionNotFound(id);
  }
  return &it->second;
}

void MemorySessionStore::Touch(const std::string& id, Entry& e) {
  lru_.splice(lru_.end(), lru_, e.lru);
  e.last_used = clock_->Now();
}

void MemorySessionStore::Erase(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  bytes_ -= it->second.bytes;
  if (auto o = owners_.find(it->second.owner); o != owners_.end()) {
    o->second.bytes -= it->second.bytes;
    if (--o->second.sessions == 0) owners_.erase(o);
  }
  lru_.erase(it->second.lru);
  sessions_.erase(it);
}

bool MemorySessionStore::MakeRoom(int64_t extra_bytes, int64_t extra_sessions) {
  // The lambda runs inside this locked member; the analysis cannot see that on its own.
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(sessions_.size()) + extra_sessions > options_.max_sessions ||
           bytes_ + extra_bytes > options_.max_state_bytes;
  };
  for (auto it = lru_.begin(); over() && it != lru_.end();) {
    const std::string id = *it++;
    if (sessions_.at(id).busy) continue;
    Erase(id);
    ++evicted_lru_;
  }
  return !over();
}

absl::StatusOr<std::string> MemorySessionStore::Add(const std::string& owner,
                                                    GenerationState state) {
  const int64_t bytes = static_cast<int64_t>(state.ByteSize());
  absl::MutexLock lock(&mu_);
  if (!adding_) {
    return absl::UnavailableError(
        "this replica is draining: a session created here now would end with the process; create "
        "it on another replica (sessions held here can still be exported with ExportSession)");
  }
  if (options_.owner_quota) {
    auto o = owners_.find(owner);
    const OwnerHolds held = o == owners_.end() ? OwnerHolds{} : o->second;
    if (absl::Status allowed = options_.owner_quota(owner, held.sessions, held.bytes, bytes);
        !allowed.ok()) {
      return allowed;
    }
  }
  if (!MakeRoom(bytes, /*extra_sessions=*/1)) {
    if (options_.observer != nullptr) options_.observer->OnStoreFull();
    return absl::ResourceExhaustedError(
        absl::StrCat("session store is full: ", sessions_.size(), " sessions (limit ",
                     options_.max_sessions, "), ", bytes_, " state bytes (budget ",
                     options_.max_state_bytes, "), all in use; retry after a short backoff"));
  }
  std::string id = NewSessionId();
  Entry& e = sessions_[id];
  e.owner = owner;
  e.state = std::move(state);
  e.bytes = bytes;
  bytes_ += bytes;
  OwnerHolds& held = owners_[owner];
  ++held.sessions;
  held.bytes += bytes;
  e.lru = lru_.insert(lru_.end(), id);
  e.last_used = clock_->Now();
  return id;
}

void MemorySessionStore::StopAdding() {
  absl::MutexLock lock(&mu_);
  adding_ = false;
}

absl::StatusOr<GenerationState> MemorySessionStore::Checkout(const std::string& id,
                                                             const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto e = Find(id, owner);
  if (!e.ok()) return e.status();
  if ((*e)->busy) {
    return SessionBusy(id, SessionUse::kGenerate);
  }
  (*e)->busy = true;
  Touch(id, **e);
  return (*e)->state;
}

void MemorySessionStore::Checkin(const std::string& id, GenerationState state, CheckinDone done) {
  {
    absl::MutexLock lock(&mu_);
    CheckinLocked(id, std::move(state));
  }
  std::move(done)(absl::OkStatus());
}

void MemorySessionStore::CheckinLocked(const std::string& id, GenerationState state) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Entry& e = it->second;
  const int64_t bytes = static_cast<int64_t>(state.ByteSize());
  // A state that grew (held text, a longer repetition window) makes room like a new session:
  // idle sessions are evicted, least recently used first. This one is still busy, so it is never
  // chosen; if busy sessions alone exceed the budget, new sessions are refused until it is met.
  if (bytes > e.bytes) MakeRoom(bytes - e.bytes, /*extra_sessions=*/0);
  bytes_ += bytes - e.bytes;
  owners_[e.owner].bytes += bytes - e.bytes;
  e.bytes = bytes;
  e.state = std::move(state);
  e.busy = false;
  Touch(id, e);
}

void MemorySessionStore::Release(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.busy = false;
}

absl::StatusOr<GenerationState> MemorySessionStore::Get(const std::string& id,
                                                        const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto e = Find(id, owner);
  if (!e.ok()) return e.status();
  if ((*e)->busy) {
    return SessionBusy(id, SessionUse::kRead);
  }
  Touch(id, **e);
  return (*e)->state;
}

absl::Status MemorySessionStore::Close(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto e = Find(id, owner);
  if (!e.ok()) return e.status();
  if ((*e)->busy) {
    return SessionBusy(id, SessionUse::kClose);
  }
  Erase(id);
  return absl::OkStatus();
}

void MemorySessionStore::ReapIdle() {
  absl::MutexLock lock(&mu_);
  const absl::Time cutoff = clock_->Now() - options_.idle_timeout;
  for (auto it = lru_.begin(); it != lru_.end();) {
    const std::string id = *it++;
    const Entry& e = sessions_.at(id);
    if (!e.busy && e.last_used <= cutoff) {
      Erase(id);
      ++evicted_idle_;
    }
  }
}

SessionStoreStats MemorySessionStore::stats() const {
  absl::MutexLock lock(&mu_);
  SessionStoreStats s;
  s.sessions = static_cast<int64_t>(sessions_.size());
  for (const auto& [id, e] : sessions_) s.busy += e.busy ? 1 : 0;
  s.state_bytes = bytes_;
  s.evicted_idle = evicted_idle_;
  s.evicted_lru = evicted_lru_;
  return s;
}

}  // namespace tost::service
