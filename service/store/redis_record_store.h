// The shared record store: the records of the Responses API (stored responses, conversations) on
// Redis (or Valkey), where every replica that shares the store reads every record, and a record
// outlives the replica that wrote it.
//
// What is stored. Per record, one string at "<prefix>r:<id>": the SHA-256 of the owner (32 raw
// bytes: the store holds no caller names), the version as 16 lowercase hex digits, the SHA-256 of
// the id (32 raw bytes: a value moved or copied to another id is refused there as DATA_LOSS, and
// logged), then the data.
// One plain string rather than a hash, because a hash's per-field overhead would be paid by every
// stored response: a 5 KB response costs Redis about 5 KB plus the key. Every write sets the
// expiry (`ttl` from the last write; reads do not refresh it).
//
// Writes. Create is SET NX (an id is never overwritten); Replace and Delete are one Lua script
// each, which checks the owner (and, for Replace, the version the caller read) and writes in the
// same step, so that of two requests advancing one conversation at once exactly one succeeds and
// the other is ABORTED. Owners are checked by the store on writes and by this replica on reads
// (the digest comes back with the value).
//
// Threads: every method may be called from any thread, and waits for the store (at most the
// client's command timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/engine/record_store.h"
#include "service/store/redis_client.h"

namespace tost::store {

struct RedisRecordStoreOptions {
  // Prefixes every key, so that deployments may share one store (--session_store_key_prefix).
  std::string key_prefix = "tost:";
  // ttl and max_record_bytes apply; max_bytes does not (the store's memory policy bounds it).
  service::RecordStoreOptions records;
};

class RedisRecordStore final : public service::RecordStore {
 public:
  // INVALID_ARGUMENT for invalid options or no client. Does not reach the store: a replica starts
  // while the store is down, and record calls answer UNAVAILABLE until it is back.
  static absl::StatusOr<std::unique_ptr<RedisRecordStore>> Make(std::unique_ptr<RedisClient> client,
                                                                RedisRecordStoreOptions options);
  RedisRecordStore(const RedisRecordStore&) = delete;
  RedisRecordStore& operator=(const RedisRecordStore&) = delete;

  // UNAVAILABLE (naming the store, "retry after about 1000 ms") when the store cannot be reached,
  // does not answer in time or is out of memory; DATA_LOSS for a stored value this store did not
  // write (too short for its header) or wrote for another id.
  absl::Status Create(const std::string& id, const std::string& owner, std::string data) override;
  absl::StatusOr<service::StoredRecord> Get(const std::string& id,
                                            const std::string& owner) override;
  absl::StatusOr<int64_t> Replace(const std::string& id, const std::string& owner,
                                  int64_t expected_version, std::string data) override;
  absl::Status Delete(const std::string& id, const std::string& owner) override;

  // Zeros: this replica holds no records (the store's own INFO tells what it holds).
  service::RecordStoreStats stats() const override { return {}; }
  const service::RecordStoreOptions& options() const override { return options_.records; }

  const RedisEndpoint& endpoint() const { return client_->endpoint(); }
  // "<prefix>r:<id>": where the record `id` is stored.
  std::string RecordKey(const std::string& id) const;

 private:
  RedisRecordStore(std::unique_ptr<RedisClient> client, RedisRecordStoreOptions options)
      : client_(std::move(client)), options_(std::move(options)) {}

  absl::Status CheckSize(const std::string& id, const std::string& data) const;
  // The stored value: owner digest, version, id digest, data.
  std::string Value(const std::string& id, const std::string& owner, int64_t version,
                    const std::string& data) const;
  std::string TtlMs() const;
  absl::Status StoreError(const absl::Status& status, const char* what,
                          const std::string& id) const;

  const std::unique_ptr<RedisClient> client_;
  const RedisRecordStoreOptions options_;
};

}  // namespace tost::store
