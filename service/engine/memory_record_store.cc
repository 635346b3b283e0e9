#include "service/engine/memory_record_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"

namespace tost::service {

absl::Status MemoryRecordStore::CheckSize(const std::string& id, int64_t data_bytes,
                                          int64_t bytes) const {
  if (data_bytes > options_.max_record_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("record ", QuoteClientText(id), ": its data must be at most ",
                     options_.max_record_bytes, " bytes, got ", data_bytes));
  }
  if (bytes > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "record ", QuoteClientText(id), " needs ", bytes,
        " bytes (id, owner and data), more than the whole in-memory record store holds "
        "(--response_store_max_bytes=",
        options_.max_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryRecordStore::Map::iterator> MemoryRecordStore::Find(const std::string& id,
                                                                         const std::string& owner) {
  auto it = records_.find(id);
  if (it == records_.end()) return RecordNotFound(id);
  if (clock_->Now() >= it->second.expires) {
    Erase(it);
    return RecordNotFound(id);
  }
  if (it->second.owner != owner) return RecordNotFound(id);
  return it;
}

void MemoryRecordStore::Erase(Map::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  written_.erase(it->second.written);
  records_.erase(it);
}

void MemoryRecordStore::MakeRoom(int64_t extra_bytes, const Entry* keep) {
  const absl::Time now = clock_->Now();
  for (auto at = lru_.begin(); bytes_ + extra_bytes > options_.max_bytes && at != lru_.end();) {
    auto it = records_.find(**at++);
    if (&it->second == keep) continue;
    // An expired record was due to go anyway: only live ones count as evicted.
    if (now < it->second.expires) ++evicted_;
    Erase(it);
  }
}

absl::Status MemoryRecordStore::Create(const std::string& id, const std::string& owner,
                                       std::string data) {
  const int64_t bytes = Bytes(id, owner, data);
  if (absl::Status s = CheckSize(id, static_cast<int64_t>(data.size()), bytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (auto it = records_.find(id); it != records_.end()) {
    if (now < it->second.expires) {
      return absl::AlreadyExistsError(
          absl::StrCat("record ", QuoteClientText(id), " already exists; ids are never reused"));
    }
    Erase(it);
  }
  MakeRoom(bytes, /*keep=*/nullptr);
  auto [it, inserted] = records_.try_emplace(id);
  Entry& e = it->second;
  e.owner = owner;
  e.data = std::move(data);
  e.version = 1;
  e.bytes = bytes;
  e.expires = now + options_.ttl;
  e.lru = lru_.insert(lru_.end(), &it->first);
  e.written = written_.insert(written_.end(), &it->first);
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<StoredRecord> MemoryRecordStore::Get(const std::string& id,
                                                    const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = Find(id, owner);
  if (!it.ok()) return it.status();
  Entry& e = (*it)->second;
  lru_.splice(lru_.end(), lru_, e.lru);
  return StoredRecord{e.data, e.version};
}

absl::StatusOr<int64_t> MemoryRecordStore::Replace(const std::string& id, const std::string& owner,
                                                   int64_t expected_version, std::string data) {
  const int64_t bytes = Bytes(id, owner, data);
  if (absl::Status s = CheckSize(id, static_cast<int64_t>(data.size()), bytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = Find(id, owner);
  if (!it.ok()) return it.status();
  Entry& e = (*it)->second;
  if (e.version != expected_version) {
    return absl::AbortedError(absl::StrCat(
        "record ", QuoteClientText(id), " was changed by another request: expected version ",
        expected_version, ", it is at version ", e.version, "; read it again and retry"));
  }
  // Its old bytes leave the count first, so that other records make room only for the growth;
  // `bytes` alone fits (CheckSize), so this one is never what gets evicted.
  bytes_ -= e.bytes;
  e.bytes = 0;
  MakeRoom(bytes, &e);
  e.data = std::move(data);
  e.bytes = bytes;
  bytes_ += bytes;
  ++e.version;
  e.expires = clock_->Now() + options_.ttl;
  lru_.splice(lru_.end(), lru_, e.lru);
  written_.splice(written_.end(), written_, e.written);
  return e.version;
}

absl::Status MemoryRecordStore::Delete(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = Find(id, owner);
  if (!it.ok()) return it.status();
  Erase(*it);
  return absl::OkStatus();
}

void MemoryRecordStore::ReapExpired() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  while (!written_.empty()) {
    auto it = records_.find(*written_.front());
    if (now < it->second.expires) break;
    Erase(it);
  }
}

RecordStoreStats MemoryRecordStore::stats() const {
  absl::MutexLock lock(&mu_);
  RecordStoreStats s;
  s.records = static_cast<int64_t>(records_.size());
  s.bytes = bytes_;
  s.evicted = evicted_;
  return s;
}

}  // namespace tost::service
