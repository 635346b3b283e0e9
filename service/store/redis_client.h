// A small, thread-safe Redis client over hiredis for the shared session store: a pool of
// connections made on first use and remade after any error (so the store may be down at start-up
// and restarted later), every round trip bounded by a timeout, and the store's failures turned
// into absl::Status: UNAVAILABLE when the store cannot serve (unreachable, authentication refused,
// no answer in time, loading, read-only), INTERNAL for any other error reply. A refusal of the
// credentials is marked (IsCredentialsRefused, redis_connection.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/store/redis_connection.h"
#include "service/store/redis_reply.h"
#include "service/store/redis_script.h"
#include "service/store/redis_url.h"

namespace tost::store {

// Told of every exchange with the store (metrics). Called on the caller's thread without the
// client's lock held; must be thread-safe.
class RedisClientObserver {
 public:
  virtual ~RedisClientObserver() = default;
  // After every command (and every pipelined batch, once): how long the call took, waiting for a
  // pooled connection and connecting included, and whether the store answered (an error reply
  // counts as answered; an Eval that falls back from EVALSHA to EVAL is two commands).
  virtual void OnCommand(absl::Duration latency, bool ok) = 0;
  // A connection was made to replace one lost to an error (or found closed by the store).
  virtual void OnReconnect() = 0;
};

struct RedisClientOptions {
  RedisEndpoint endpoint;
  absl::Duration connect_timeout =
      absl::Seconds(1);  // TCP connect (name resolution is not bounded)
  absl::Duration command_timeout = absl::Seconds(1);  // each command's (or batch's) round trip
  int max_connections = 8;  // pooled; callers beyond it wait for one (bounded by command_timeout)
  RedisClientObserver* observer = nullptr;  // not owned, outlives the client; may be null
};

absl::Status ValidateRedisClientOptions(const RedisClientOptions& options);

class RedisClient {
 public:
  // Validates the options (INVALID_ARGUMENT); does not connect: the store may be down at start-up.
  // Connections are made on first use and remade after any error, so reconnection is automatic.
  static absl::StatusOr<std::unique_ptr<RedisClient>> Create(RedisClientOptions options);
  // No call may be in flight.
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // One command; argv is binary-safe and argv[0] is the command's name (INVALID_ARGUMENT when
  // empty). UNAVAILABLE naming the store when it cannot be reached, refuses authentication, does
  // not answer within command_timeout (the connection is dropped then, never reused mid-reply),
  // or answers LOADING, BUSY, MASTERDOWN, READONLY or NOAUTH. Any other error reply is INTERNAL
  // with the store's message. A command is sent at most once: nothing is retried, since the store
  // may have run a command whose reply was lost.
  absl::StatusOr<RedisReply> Command(const std::vector<std::string>& argv);

  // EVALSHA of the script, and on NOSCRIPT (the store restarted or flushed its script cache) EVAL
  // of its source, which caches it again. Errors as Command's.
  absl::StatusOr<RedisReply> Eval(const RedisScript& script, const std::vector<std::string>& keys,
                                  const std::vector<std::string>& args);

  // Several commands in one round trip (bounded by command_timeout as a whole). Error replies stay
  // in their slot (type kError); only a failure to reach the store fails the call. No command may
  // be empty (INVALID_ARGUMENT); no commands: an empty result without touching the store.
  absl::StatusOr<std::vector<RedisReply>> Pipeline(
      const std::vector<std::vector<std::string>>& commands);

  const RedisEndpoint& endpoint() const { return options_.endpoint; }

 private:
  explicit RedisClient(RedisClientOptions options) : options_(std::move(options)) {}

  // A connection for one exchange: an idle pooled one the store has not closed, or a new one
  // while fewer than max_connections exist; waits for one until `wait_deadline` otherwise.
  absl::StatusOr<std::unique_ptr<RedisConnection>> Acquire(RedisClock::time_point wait_deadline);
  // Back to the pool when healthy; dropped (its slot freed) otherwise.
  void Release(std::unique_ptr<RedisConnection> connection);
  absl::StatusOr<std::vector<RedisReply>> Exchange(
      absl::Span<const std::vector<std::string>> commands, absl::string_view what);
  absl::Status ErrorReplyStatus(absl::string_view command, const RedisReply& reply) const;

  const RedisClientOptions options_;
  absl::Mutex mu_;
  absl::CondVar freed_;  // a connection went back to the pool, or a slot was freed
  std::vector<std::unique_ptr<RedisConnection>> idle_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + in use + being made; at most max_connections
  int lost_ ABSL_GUARDED_BY(mu_) = 0;  // dropped after an error and not replaced yet
};

}  // namespace tost::store
