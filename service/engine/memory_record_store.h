// The default record store: records in this process's memory, bounded by bytes (ids, owners and
// data), the least recently used evicted to make room. A record expires `ttl` after its last write
// whether or not it was read since; expiry is checked on every access, and ReapExpired() frees the
// memory of records no one asks for again. Records end with the process (use the shared store for
// records that outlive it or that every replica reads).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/clock.h"
#include "service/engine/record_store.h"

namespace tost::service {

class MemoryRecordStore final : public RecordStore {
 public:
  // `options` are expected valid (ValidateRecordStoreOptions); `clock` is not owned and outlives
  // the store.
  MemoryRecordStore(RecordStoreOptions options, Clock* clock) : options_(options), clock_(clock) {}

  // Evicts least recently used records (counted in stats().evicted) until the new one fits.
  absl::Status Create(const std::string& id, const std::string& owner, std::string data) override;
  // Refreshes the record's place in the LRU order, not its expiry.
  absl::StatusOr<StoredRecord> Get(const std::string& id, const std::string& owner) override;
  // Evicts other records, as Create, when the new data is larger than the old.
  absl::StatusOr<int64_t> Replace(const std::string& id, const std::string& owner,
                                  int64_t expected_version, std::string data) override;
  absl::Status Delete(const std::string& id, const std::string& owner) override;

  // Drops every expired record. Called periodically by the server; costs one step per record
  // dropped (records expire in the order they were last written).
  void ReapExpired();

  RecordStoreStats stats() const override;
  const RecordStoreOptions& options() const override { return options_; }

 private:
  // The lists name records by their key in the map, whose nodes never move.
  using Order = std::list<const std::string*>;
  struct Entry {
    std::string owner;
    std::string data;
    int64_t version = 0;
    int64_t bytes = 0;  // id + owner + data
    absl::Time expires;
    Order::iterator lru;      // position in lru_ (front: least recently used)
    Order::iterator written;  // position in written_ (front: least recently written)
  };
  using Map = std::unordered_map<std::string, Entry>;

  static int64_t Bytes(const std::string& id, const std::string& owner, const std::string& data) {
    return static_cast<int64_t>(id.size() + owner.size() + data.size());
  }
  absl::Status CheckSize(const std::string& id, int64_t data_bytes, int64_t bytes) const;
  // The live record `id` of `owner`; an expired one is erased on the way.
  absl::StatusOr<Map::iterator> Find(const std::string& id, const std::string& owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Erase(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts least recently used records other than `keep` until `extra_bytes` more fit.
  void MakeRoom(int64_t extra_bytes, const Entry* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RecordStoreOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  Map records_ ABSL_GUARDED_BY(mu_);
  Order lru_ ABSL_GUARDED_BY(mu_);
  Order written_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tost::service
