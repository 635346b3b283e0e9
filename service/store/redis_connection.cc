#include "service/store/redis_connection.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tost::store {
namespace {

constexpr size_t kReadChunkBytes = 16 * 1024;
constexpr size_t kMaxStoreMessageBytes = 300;  // of an error reply quoted in a message
// The type URL of CredentialsRefusedError's mark (absl::Status payloads are keyed by one).
constexpr absl::string_view kCredentialsRefusedPayload = "type.tost/store.CredentialsRefused";

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r: returns the message, which may or may not be buf.
  return strerror_r(err, buf, sizeof(buf));
}

RedisReply Convert(const redisReply& r) {
  RedisReply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) out.elements.push_back(Convert(*r.element[i]));
      break;
    default:  // REDIS_REPLY_NIL (a nil bulk string or a nil array)
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

// The commands in RESP, encoded by hiredis; false only when hiredis ran out of memory.
bool Encode(absl::Span<const std::vector<std::string>> commands, std::string& out) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::vector<std::string>& command : commands) {
    argv.clear();
    lengths.clear();
    for (const std::string& arg : command) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    char* encoded = nullptr;
    int len = redisFormatCommandArgv(&encoded, static_cast<int>(argv.size()), argv.data(),
                                     lengths.data());
    if (len < 0) return false;
    out.append(encoded, static_cast<size_t>(len));
    redisFreeCommand(encoded);
  }
  return true;
}

enum class Wait { kReady, kTimedOut, kFailed };

// Waits until the socket is ready for `events` or the deadline passes; errno is set on kFailed.
Wait WaitUntil(int fd, short events, RedisClock::time_point deadline) {
  while (true) {
    auto left = deadline - RedisClock::now();
    if (left <= RedisClock::duration::zero()) return Wait::kTimedOut;
    // Rounded up, so a wait never ends just before its deadline and spins.
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (n > 0) return Wait::kReady;  // POLLERR / POLLHUP too: the next send or recv says which
    if (n < 0 && errno != EINTR) return Wait::kFailed;
  }
}

std::string Quote(absl::string_view store_message, const std::string& password) {
  std::string quoted(store_message);
  // Redis' messages do not echo AUTH's argument, but a proxy in front of it might. Masked before
  // shortening, so that no part of the password survives at the cut.
  if (!password.empty()) absl::StrReplaceAll({{password, "***"}}, &quoted);
  if (quoted.size() > kMaxStoreMessageBytes)
    quoted = quoted.substr(0, kMaxStoreMessageBytes) + "...";
  return quoted;
}

}  // namespace

std::string DescribeStore(const RedisEndpoint& /*endpoint*/) {
  return absl::StrCat("the session store (", kSessionStoreFlag, ")");
}

std::string StoreDetail(const RedisEndpoint& endpoint) {
  return absl::StrCat("store ", endpoint.Address());
}

absl::Status CredentialsRefusedError(absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kCredentialsRefusedPayload, absl::Cord());
  return status;
}

bool IsCredentialsRefused(const absl::Status& status) {
  return status.GetPayload(kCredentialsRefusedPayload).has_value();
}

RedisConnection::RedisConnection(const RedisEndpoint& endpoint, absl::Duration command_timeout,
                                 redisContext* context)
    : endpoint_(endpoint), command_timeout_(command_timeout), context_(context) {}

RedisConnection::~RedisConnection() { redisFree(context_); }

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Open(
    const RedisEndpoint& endpoint, absl::Duration connect_timeout, absl::Duration command_timeout) {
  redisContext* c = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port,
                                            absl::ToTimeval(connect_timeout));
  if (c == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(DescribeStore(endpoint), ": could not connect: out of memory"));
  }
  if (c->err) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(absl::StrCat(DescribeStore(endpoint),
                                               ": could not connect: expected a TCP connection "
                                               "within the connect timeout of ",
                                               absl::FormatDuration(connect_timeout),
                                               ", got: ", why));
  }
  // Keepalive finds a store that vanished without a FIN (a host gone, a partition) while the
  // connection sat in the pool. The socket timeouts bound any blocking call hiredis itself makes;
  // the round trips below never block (MSG_DONTWAIT) and poll against their own deadline.
  if (redisEnableKeepAlive(c) != REDIS_OK ||
      redisSetTimeout(c, absl::ToTimeval(command_timeout)) != REDIS_OK) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(absl::StrCat(
        DescribeStore(endpoint), ": could not set up the connection's socket options: ", why));
  }
  std::unique_ptr<RedisConnection> conn(new RedisConnection(endpoint, command_timeout, c));

  std::vector<std::vector<std::string>> handshake;
  if (!endpoint.password.empty()) {
    if (endpoint.user.empty()) {
      handshake.push_back({"AUTH", endpoint.password});
    } else {
      handshake.push_back({"AUTH", endpoint.user, endpoint.password});  // Redis 6 ACL form
    }
  }
  if (endpoint.db != 0) handshake.push_back({"SELECT", absl::StrCat(endpoint.db)});
  if (handshake.empty()) return conn;
  absl::StatusOr<std::vector<RedisReply>> replies =
      conn->RoundTrip(handshake, RedisClock::now() + absl::ToChronoNanoseconds(command_timeout),
                      absl::StrCat(handshake.front().front(), " (connecting)"));
  if (!replies.ok()) return replies.status();
  size_t i = 0;
  if (!endpoint.password.empty()) {
    const RedisReply& auth = (*replies)[i++];
    if (auth.is_error()) {
      std::string as = endpoint.user.empty() ? std::string("with the password of the default user")
                                             : absl::StrCat("as user '", endpoint.user, "'");
      return CredentialsRefusedError(absl::StrCat(
          DescribeStore(endpoint), ": authentication failed: expected OK to AUTH ", as, ", got '",
          Quote(auth.str, endpoint.password), "'; check the credentials in ", kSessionStoreFlag));
    }
  }
  if (endpoint.db != 0 && (*replies)[i].is_error()) {
    return absl::UnavailableError(absl::StrCat(
        DescribeStore(endpoint), ": could not select database ", endpoint.db,
        ": expected OK to SELECT, got '", Quote((*replies)[i].str, endpoint.password),
        "' (the store has 16 databases, 0..15, unless its 'databases' setting says otherwise)"));
  }
  return conn;
}

absl::Status RedisConnection::Broken(absl::string_view what, absl::string_view detail) {
  healthy_ = false;
  return absl::UnavailableError(absl::StrCat(DescribeStore(endpoint_), ": ", what, ": ", detail,
                                             "; the connection was dropped"));
}

absl::Status RedisConnection::Send(const std::string& bytes, RedisClock::time_point deadline,
                                   absl::string_view what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n =
        send(context_->fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Wait w = WaitUntil(context_->fd, POLLOUT, deadline);
      if (w == Wait::kTimedOut) {
        return Broken(absl::StrCat("sending ", what),
                      absl::StrCat("the store took no bytes within the command timeout of ",
                                   absl::FormatDuration(command_timeout_)));
      }
      if (w == Wait::kFailed) return Broken(absl::StrCat("sending ", what), ErrnoText(errno));
      continue;
    }
    return Broken(absl::StrCat("sending ", what), ErrnoText(errno));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RedisReply>> RedisConnection::RoundTrip(
    absl::Span<const std::vector<std::string>> commands, RedisClock::time_point deadline,
    absl::string_view what) {
  if (!healthy_) return Broken(what, "the connection had already failed");
  std::string bytes;
  if (!Encode(commands, bytes)) return Broken(absl::StrCat("encoding ", what), "out of memory");
  if (absl::Status s = Send(bytes, deadline, what); !s.ok()) return s;

  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  redisReader* reader = context_->reader;
  char buf[kReadChunkBytes];
  while (replies.size() < commands.size()) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
      return Broken(
          absl::StrCat("reading the reply to ", what),
          absl::StrCat("expected a RESP reply, got bytes hiredis cannot parse: ", reader->errstr));
    }
    if (raw != nullptr) {
      replies.push_back(Convert(*static_cast<redisReply*>(raw)));
      freeReplyObject(raw);
      continue;
    }
    Wait w = WaitUntil(context_->fd, POLLIN, deadline);
    if (w == Wait::kTimedOut) {
      return Broken(absl::StrCat("waiting for the reply to ", what),
                    absl::StrCat("expected a reply within the command timeout of ",
                                 absl::FormatDuration(command_timeout_), ", got none"));
    }
    if (w == Wait::kFailed) {
      return Broken(absl::StrCat("waiting for the reply to ", what), ErrnoText(errno));
    }
    ssize_t n = recv(context_->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (redisReaderFeed(reader, buf, static_cast<size_t>(n)) != REDIS_OK) {
        return Broken(absl::StrCat("reading the reply to ", what), "out of memory");
      }
    } else if (n == 0) {
      return Broken(
          absl::StrCat("reading the reply to ", what),
          "expected a reply, got the end of the stream (the store closed the connection)");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Broken(absl::StrCat("reading the reply to ", what), ErrnoText(errno));
    }
  }
  return replies;
}

bool RedisConnection::StillOpen() const {
  if (!healthy_) return false;
  pollfd p{context_->fd, POLLIN, 0};
  int n = poll(&p, 1, 0);
  if (n == 0) return true;  // nothing to read: the store has not closed it
  if (n < 0) return errno == EINTR;
  char byte;
  ssize_t got = recv(context_->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace tost::store
