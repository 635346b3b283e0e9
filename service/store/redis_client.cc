#include "service/store/redis_client.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/error_detail.h"

namespace tost::store {
namespace {

constexpr size_t kMaxStoreMessageBytes = 300;  // of an error reply quoted in a message

absl::string_view FirstWord(absl::string_view s) { return s.substr(0, s.find(' ')); }

// How messages name an exchange: its commands' names, never their arguments (keys and values may
// be anything, a session's state included).
std::string Describe(absl::Span<const std::vector<std::string>> commands) {
  if (commands.size() == 1) return commands.front().front();
  std::string names;
  for (size_t i = 0; i < commands.size() && i < 4; ++i) {
    absl::StrAppend(&names, i ? ", " : "", commands[i].front());
  }
  return absl::StrCat("a pipeline of ", commands.size(), " commands (", names,
                      commands.size() > 4 ? ", ...)" : ")");
}

}  // namespace

absl::Status ValidateRedisClientOptions(const RedisClientOptions& o) {
  const RedisEndpoint& e = o.endpoint;
  if (e.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the Redis client needs the store's host (",
                                                   kSessionStoreFlag, "), got none"));
  }
  if (e.port < 1 || e.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("the Redis client's port must be 1..65535 (",
                                                   kSessionStoreFlag, "), got ", e.port));
  }
  if (e.db < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Redis client's database must be non-negative (", kSessionStoreFlag, "), got ", e.db));
  }
  if (!e.user.empty() && e.password.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the Redis client's user '", e.user,
                                                   "' needs a password (", kSessionStoreFlag,
                                                   " redis://user:password@host), got none"));
  }
  if (o.connect_timeout <= absl::ZeroDuration() || o.connect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Redis client's connect timeout must be positive and finite, got ",
                     absl::FormatDuration(o.connect_timeout)));
  }
  if (o.command_timeout <= absl::ZeroDuration() || o.command_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Redis client's command timeout must be positive and finite, got ",
                     absl::FormatDuration(o.command_timeout)));
  }
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Redis client's max_connections must be at least 1, got ", o.max_connections));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Create(RedisClientOptions options) {
  if (absl::Status s = ValidateRedisClientOptions(options); !s.ok()) return s;
  return std::unique_ptr<RedisClient>(new RedisClient(std::move(options)));
}

RedisClient::~RedisClient() {
  absl::MutexLock lock(&mu_);
  idle_.clear();
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisClient::Acquire(
    RedisClock::time_point wait_deadline) {
  std::unique_ptr<RedisConnection> pooled;
  {
    absl::MutexLock lock(&mu_);
    while (idle_.empty() && open_ >= options_.max_connections) {
      auto left = wait_deadline - RedisClock::now();
      if (left <= RedisClock::duration::zero()) {
        return absl::UnavailableError(absl::StrCat(
            DescribeStore(options_.endpoint), ": all ", options_.max_connections,
            " connections were busy for the command timeout of ",
            absl::FormatDuration(options_.command_timeout),
            "; expected one to be free (the store is slow, or max_connections is too small)"));
      }
      freed_.WaitWithTimeout(&mu_, absl::FromChrono(left));
    }
    if (!idle_.empty()) {
      pooled = std::move(idle_.back());  // the most recently used: the least likely to be stale
      idle_.pop_back();
    } else {
      ++open_;  // the slot of the connection made below
    }
  }
  if (pooled != nullptr) {
    if (pooled->StillOpen()) return pooled;
    pooled.reset();  // its slot is the new connection's
    absl::MutexLock lock(&mu_);
    ++lost_;
  }
  absl::StatusOr<std::unique_ptr<RedisConnection>> made =
      RedisConnection::Open(options_.endpoint, options_.connect_timeout, options_.command_timeout);
  bool reconnected = false;
  {
    absl::MutexLock lock(&mu_);
    if (!made.ok()) {
      --open_;
      freed_.Signal();
      return made.status();
    }
    if (lost_ > 0) {
      --lost_;
      reconnected = true;
    }
  }
  if (reconnected && options_.observer != nullptr) options_.observer->OnReconnect();
  return made;
}

void RedisClient::Release(std::unique_ptr<RedisConnection> connection) {
  bool healthy = connection->healthy();
  if (!healthy) connection.reset();  // closed outside the lock
  absl::MutexLock lock(&mu_);
  if (healthy) {
    idle_.push_back(std::move(connection));
  } else {
    --open_;
    ++lost_;
  }
  freed_.Signal();
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Exchange(
    absl::Span<const std::vector<std::string>> commands, absl::string_view what) {
  RedisClock::time_point start = RedisClock::now();
  auto timeout = absl::ToChronoNanoseconds(options_.command_timeout);
  absl::StatusOr<std::vector<RedisReply>> replies;
  absl::StatusOr<std::unique_ptr<RedisConnection>> connection = Acquire(start + timeout);
  if (connection.ok()) {
    replies = (*connection)->RoundTrip(commands, RedisClock::now() + timeout, what);
    Release(*std::move(connection));
  } else {
    replies = connection.status();
  }
  if (options_.observer != nullptr) {
    options_.observer->OnCommand(absl::FromChrono(RedisClock::now() - start), replies.ok());
  }
  if (!replies.ok()) return WithServerDetail(replies.status(), StoreDetail(options_.endpoint));
  return replies;
}

absl::Status RedisClient::ErrorReplyStatus(absl::string_view command,
                                           const RedisReply& reply) const {
  std::string quoted = reply.str.substr(0, kMaxStoreMessageBytes);
  if (reply.str.size() > kMaxStoreMessageBytes) quoted += "...";
  absl::string_view code = FirstWord(reply.str);
  if (code == "LOADING" || code == "BUSY" || code == "MASTERDOWN" || code == "READONLY") {
    return absl::UnavailableError(absl::StrCat(DescribeStore(options_.endpoint), " cannot serve ",
                                               command, " now: expected a reply, got '", quoted,
                                               "'; retry later or on another replica"));
  }
  if (code == "NOAUTH") {
    return CredentialsRefusedError(
        absl::StrCat(DescribeStore(options_.endpoint),
                     ": authentication failed: the store requires a password"
                     " and ",
                     kSessionStoreFlag, " gives none (redis://:password@host); got '", quoted,
                     "' to ", command));
  }
  return absl::InternalError(absl::StrCat(DescribeStore(options_.endpoint),
                                          ": expected a reply to ", command, ", got the error '",
                                          quoted, "'"));
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& argv) {
  if (argv.empty()) {
    return absl::InvalidArgumentError(
        "a Redis command needs at least its name (argv[0]), got an empty argv");
  }
  absl::StatusOr<std::vector<RedisReply>> replies =
      Exchange(absl::MakeConstSpan(&argv, 1), argv.front());
  if (!replies.ok()) return replies.status();
  RedisReply& reply = replies->front();
  if (reply.is_error()) {
    return WithServerDetail(ErrorReplyStatus(argv.front(), reply), StoreDetail(options_.endpoint));
  }
  return std::move(reply);
}

absl::StatusOr<RedisReply> RedisClient::Eval(const RedisScript& script,
                                             const std::vector<std::string>& keys,
                                             const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"EVALSHA", script.sha1(), absl::StrCat(keys.size())};
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::vector<RedisReply>> replies =
      Exchange(absl::MakeConstSpan(&argv, 1), "EVALSHA");
  if (!replies.ok()) return replies.status();
  if (replies->front().is_error() && FirstWord(replies->front().str) == "NOSCRIPT") {
    argv[0] = "EVAL";
    argv[1] = script.source();
    replies = Exchange(absl::MakeConstSpan(&argv, 1), "EVAL");
    if (!replies.ok()) return replies.status();
  }
  RedisReply& reply = replies->front();
  if (reply.is_error()) {
    return WithServerDetail(ErrorReplyStatus(argv.front(), reply), StoreDetail(options_.endpoint));
  }
  return std::move(reply);
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  if (commands.empty()) return std::vector<RedisReply>();
  for (size_t i = 0; i < commands.size(); ++i) {
    if (commands[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "every pipelined Redis command needs at least its name, got an empty argv at index ", i));
    }
  }
  return Exchange(commands, Describe(commands));
}

}  // namespace tost::store
