// Where the shared session store is: a redis:// URL (the --session_store flag) parsed into host,
// port, credentials and database. The password never leaves this struct in text: Redacted() and
// every parse error print it as ***.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tost::store {

// The flag whose value ParseRedisUrl reads, named in every error about the store's address.
inline constexpr char kSessionStoreFlag[] = "--session_store";

struct RedisEndpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without its brackets
  int port = 6379;
  std::string user;      // Redis 6 ACL user; empty: the default user (AUTH password)
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECTed on every connection when not 0

  // "redis://user:***@host:port/db": for logs and error messages, never the password.
  std::string Redacted() const;
  // "redis://host:port/db": which store, without credentials (what errors of a running store say).
  std::string Address() const;
};

// Parses redis://[[user]:password@]host[:port][/db]. User and password are percent-decoded; an IPv6
// address is written in brackets (redis://[::1]:6379); the port is 1..65535 (default 6379); db is a
// non-negative integer (default 0). rediss:// (TLS) is refused: Debian 12's hiredis 0.14 has no
// TLS. INVALID_ARGUMENT otherwise, saying what was expected and what was received, password
// redacted.
absl::StatusOr<RedisEndpoint> ParseRedisUrl(std::string_view url);

}  // namespace tost::store
