// What --session_store and its companion flags build: the session store (null for "memory": the
// engine's in-memory one), the Responses API's record store (null for "memory" likewise) and, for a
// shared store, the prefix-state cache's shared tier on it.
// Everything is checked here, before any model loads; nothing connects (the store may be down at
// start-up) until the caller runs check_credentials.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/engine.h"
#include "service/engine/record_store.h"
#include "service/store/redis_client.h"
#include "service/store/redis_session_store.h"

namespace tost::store {

struct SharedStoreFlags {
  std::string url = "memory";  // --session_store
  std::string password_file;   // overrides the URL's password when set
  absl::Duration timeout = absl::Seconds(1);
  RedisSessionStoreOptions redis;
  // Shared prefix-state cache entries expire this long after their last use.
  absl::Duration prefix_ttl = absl::Minutes(30);
  RedisClientObserver* observer = nullptr;  // not owned; may be null
};

struct SharedStoreFactories {
  service::SessionStoreFactory sessions;  // null: the in-memory store
  std::function<absl::StatusOr<std::unique_ptr<service::PrefixCacheTier>>(
      const service::SessionCodec* codec)>
      prefix_tier;  // null: no shared tier
  // The stored responses and conversations, with a client of their own (the sessions' options).
  std::function<absl::StatusOr<std::unique_ptr<service::RecordStore>>(service::RecordStoreOptions)>
      records;  // null: the in-memory store (service::MemoryRecordStore)
  // Start-up's check of the credentials (null: the in-memory store): one connection, with the
  // AUTH and SELECT every connection makes, and a PING, within --session_store_timeout_ms each.
  // OK: the store took them. FAILED_PRECONDITION naming --session_store (and the password file):
  // the store answered and refused them, so every session call would fail until the flags change
  // and the server is restarted; the server must not start (a replica that did would be ready and
  // take traffic it cannot serve). Any other error: the store was not reached or cannot serve now
  // (down, no answer, loading); the server starts anyway, its session calls UNAVAILABLE until the
  // store is back, as after an outage while it runs.
  std::function<absl::Status()> check_credentials;
};

absl::StatusOr<SharedStoreFactories> MakeSharedStoreFactories(const SharedStoreFlags& flags);

}  // namespace tost::store
