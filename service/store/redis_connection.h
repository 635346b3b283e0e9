// One TCP connection to the store, for RedisClient's pool: hiredis connects it and encodes and
// parses RESP; the round trips do their own socket I/O (MSG_NOSIGNAL, poll) so that each has one
// deadline for the whole exchange, and a store that has gone away raises no SIGPIPE.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/store/redis_reply.h"
#include "service/store/redis_url.h"

struct redisContext;

namespace tost::store {

using RedisClock = std::chrono::steady_clock;

// "the session store (--session_store)": how every message names the store. Not by its address:
// these messages reach clients, and where the store lives is the server's own business. The
// address goes with the status as its server detail (StoreDetail; base/error_detail.h), which the
// server's log keeps under the request's id.
std::string DescribeStore(const RedisEndpoint& endpoint);
// "store redis://host:port/db" (no credentials): the server detail of the store's errors.
std::string StoreDetail(const RedisEndpoint& endpoint);

// UNAVAILABLE with `message`, marked as the store's refusal of the client's credentials: AUTH
// answered with an error, or NOAUTH (the store wants a password and none was given). A caller of
// a session call can do nothing about either an outage or a refusal, so both are UNAVAILABLE;
// the mark lets start-up tell the refusal, which no retry heals, from an outage, which passes.
absl::Status CredentialsRefusedError(absl::string_view message);
// Whether `status` carries CredentialsRefusedError's mark.
bool IsCredentialsRefused(const absl::Status& status);

class RedisConnection {
 public:
  // Connects within connect_timeout, enables TCP keepalive, then AUTH (when the endpoint has a
  // password) and SELECT (db != 0) in one round trip within command_timeout. UNAVAILABLE naming
  // the store on any failure ("authentication failed", and IsCredentialsRefused, when AUTH is
  // refused).
  static absl::StatusOr<std::unique_ptr<RedisConnection>> Open(const RedisEndpoint& endpoint,
                                                               absl::Duration connect_timeout,
                                                               absl::Duration command_timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends every command (binary-safe argv, none empty) in one write and reads one reply each, all
  // before `deadline`. `what` names the exchange in messages (the command's name, never its
  // arguments). A failure to send or to read (timeout, reset, end of stream, malformed reply) is
  // UNAVAILABLE and breaks the connection for good: a reply may be half-read, so it is never
  // reused. Error replies are returned as replies.
  absl::StatusOr<std::vector<RedisReply>> RoundTrip(
      absl::Span<const std::vector<std::string>> commands, RedisClock::time_point deadline,
      absl::string_view what);

  bool healthy() const { return healthy_; }
  // False when the store closed this idle connection (a restart, its idle timeout, CLIENT KILL) or
  // sent something unasked: checked before each reuse, so a restarted store costs no failed call.
  bool StillOpen() const;

 private:
  RedisConnection(const RedisEndpoint& endpoint, absl::Duration command_timeout,
                  redisContext* context);
  absl::Status Broken(absl::string_view what, absl::string_view detail);
  absl::Status Send(const std::string& bytes, RedisClock::time_point deadline,
                    absl::string_view what);

  const RedisEndpoint& endpoint_;         // the client's, which outlives its connections
  const absl::Duration command_timeout_;  // named in the messages of timed-out round trips
  redisContext* const context_;
  bool healthy_ = true;
};

}  // namespace tost::store
