// Records a caller keeps on the server between requests: stored responses of the Responses API and
// conversations. Each record is opaque bytes under an unguessable id, bound to the identity that
// created it, with a version that every write increments (so that a conversation advanced by two
// requests at once keeps one of them, and the other learns so), expiring `ttl` after its last
// write. Two backends implement this interface: MemoryRecordStore (service/engine/
// memory_record_store.h, the default: this process's memory, bounded by bytes) and the shared one
// on Redis (service/store/redis_record_store.h), where every replica sharing the store reads every
// record and a record outlives the replica that wrote it.
//
// Owners. A record read, replaced or deleted under another identity is NOT_FOUND, with the same
// message as an unknown or expired id, so that ids cannot be probed.
//
// Threads: every method may be called from any thread, and may wait for a shared store (at most
// its client's command timeout): call them where a request is admitted or answered, never on the
// generation scheduler's thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tost::service {

struct RecordStoreOptions {
  // A record not written for this long expires (--response_ttl_s). Reading does not refresh it.
  absl::Duration ttl = absl::Hours(24 * 30);
  // The in-memory store: bytes of records held at once (ids, owners and data); the least recently
  // used are evicted beyond it (--response_store_max_bytes). The shared store ignores it: the
  // store's own memory policy bounds it.
  int64_t max_bytes = 256LL << 20;
  // One record's data, in either store: larger writes are refused (INVALID_ARGUMENT).
  int64_t max_record_bytes = 4LL << 20;
};

absl::Status ValidateRecordStoreOptions(const RecordStoreOptions& o);

// The refusal for a record id that is unknown, deleted, expired, evicted or someone else's: one
// message and code for all of them, so that ids cannot be probed.
absl::Status RecordNotFound(const std::string& id);

struct StoredRecord {
  std::string data;
  int64_t version = 0;  // 1 when created, incremented by every Replace
};

struct RecordStoreStats {
  int64_t records = 0;  // held in this process (the shared store: 0, it holds none itself)
  int64_t bytes = 0;    // their ids, owners and data
  int64_t evicted = 0;  // dropped for room (the in-memory store) before their TTL
};

class RecordStore {
 public:
  virtual ~RecordStore() = default;

  // Stores a new record, version 1. ALREADY_EXISTS when `id` is taken; INVALID_ARGUMENT when the
  // data exceeds max_record_bytes; RESOURCE_EXHAUSTED when it alone exceeds max_bytes (memory);
  // UNAVAILABLE (the message naming the store and carrying "retry after about N ms") when the
  // store cannot be written.
  virtual absl::Status Create(const std::string& id, const std::string& owner,
                              std::string data) = 0;
  // NOT_FOUND for an unknown, expired, deleted or someone else's id; UNAVAILABLE as Create.
  virtual absl::StatusOr<StoredRecord> Get(const std::string& id, const std::string& owner) = 0;
  // Replaces the data when the record is still at `expected_version`, and returns the new
  // version. ABORTED when another write came first (the version moved on); NOT_FOUND as Get;
  // INVALID_ARGUMENT and UNAVAILABLE as Create.
  virtual absl::StatusOr<int64_t> Replace(const std::string& id, const std::string& owner,
                                          int64_t expected_version, std::string data) = 0;
  // NOT_FOUND as Get; UNAVAILABLE as Create.
  virtual absl::Status Delete(const std::string& id, const std::string& owner) = 0;

  virtual RecordStoreStats stats() const = 0;
  virtual const RecordStoreOptions& options() const = 0;
};

}  // namespace tost::service

namespace tost::service {

// Told of what the Responses API does with its records (metrics). Called on request threads
// without any lock of the store held; must be cheap and thread-safe.
class ResponsesObserver {
 public:
  virtual ~ResponsesObserver() = default;
  // A response was stored: `bytes` of record.
  virtual void OnResponseStored(int64_t bytes) = 0;
  // A request named a previous_response_id (or a conversation): found, or not (unknown, expired,
  // deleted, or another owner's).
  virtual void OnPreviousResponseLookup(bool found) = 0;
  // A response continued a stored state (previous_response_id, or a conversation past its first
  // response).
  virtual void OnContinuation() = 0;
};

}  // namespace tost::service
