// Start-up's check of the shared store's credentials (SharedStoreFactories::check_credentials) and
// the mark under it (IsCredentialsRefused): a store that answers and refuses the credentials is
// FAILED_PRECONDITION naming --session_store, so the server does not start; a store that is down,
// paused or otherwise not serving is not a refusal, so the server starts anyway. Against real
// redis-server processes (redis_server_fixture.h).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/store/redis_client.h"
#include "service/store/redis_url.h"
#include "service/store/shared_store_flags.h"
#include "tests/service/store/redis_server_fixture.h"

namespace tost::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RedisServerBinary;
using testing::RedisServerOptions;
using testing::RedisServerProcess;

constexpr char kRight[] = "pw-Right-a41";
constexpr char kWrong[] = "pw-Wrong-b52";
constexpr char kAclRight[] = "pw-Acl-Right-c63";

std::unique_ptr<RedisServerProcess> StartServer() {
  RedisServerOptions options;
  options.requirepass = kRight;
  options.acl_user = "tost";
  options.acl_password = kAclRight;
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> server =
      RedisServerProcess::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// redis://[user:password@]127.0.0.1:PORT/db
std::string Url(int port, const std::string& user, const std::string& password, int db = 0) {
  const std::string auth = password.empty() ? "" : absl::StrCat(user, ":", password, "@");
  return absl::StrCat("redis://", auth, "127.0.0.1:", port, "/", db);
}

// A loopback port nothing listens on (bound, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

absl::Status Check(const std::string& url, const std::string& password_file = "",
                   absl::Duration timeout = absl::Seconds(2)) {
  SharedStoreFlags flags;
  flags.url = url;
  flags.password_file = password_file;
  flags.timeout = timeout;
  absl::StatusOr<SharedStoreFactories> factories = MakeSharedStoreFactories(flags);
  EXPECT_TRUE(factories.ok()) << factories.status();
  if (!factories.ok()) return factories.status();
  EXPECT_TRUE(factories->check_credentials != nullptr) << url;
  if (factories->check_credentials == nullptr) return absl::InternalError("no check");
  return factories->check_credentials();
}

#define ASSERT_SERVER(server) \
  ASSERT_NE(server, nullptr) << "redis-server did not start: " << RedisServerBinary()

TEST(CredentialsRefused, EveryRefusalIsMarkedAndNothingElse) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  const auto command = [&](const std::string& url, int db = 0) {
    absl::StatusOr<RedisEndpoint> endpoint = ParseRedisUrl(url);
    EXPECT_TRUE(endpoint.ok()) << endpoint.status();
    RedisClientOptions options;
    if (endpoint.ok()) options.endpoint = *endpoint;
    options.endpoint.db = db;
    std::unique_ptr<RedisClient> client = *RedisClient::Create(options);
    return client->Command({"PING"}).status();
  };
  const int port = server->port();
  // Refused: a wrong password (AUTH), an ACL user's wrong one, none where one is required (NOAUTH).
  for (const absl::Status& s : {command(Url(port, "default", kWrong)),
                                command(Url(port, "tost", kWrong)), command(Url(port, "", ""))}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(IsCredentialsRefused(s)) << s;
  }
  // Not refusals: taken, a database out of range, nothing listening.
  EXPECT_TRUE(command(Url(port, "default", kRight)).ok());
  const absl::Status db = command(Url(port, "default", kRight), 99);
  EXPECT_EQ(db.code(), absl::StatusCode::kUnavailable) << db;
  EXPECT_FALSE(IsCredentialsRefused(db)) << db;
  const absl::Status down = command(Url(FreePort(), "default", kRight));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_FALSE(IsCredentialsRefused(down)) << down;
  EXPECT_FALSE(IsCredentialsRefused(absl::UnavailableError("authentication failed")));
}

TEST(SharedStoreCheck, RefusedCredentialsAreFailedPreconditionNamingTheFlags) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  const int port = server->port();
  const std::string store = absl::StrCat("redis://127.0.0.1:", port, "/0");

  const absl::Status wrong = Check(Url(port, "default", kWrong));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
  EXPECT_THAT(wrong.message(),
              AllOf(HasSubstr("refused this server's credentials"), HasSubstr("--session_store"),
                    HasSubstr(store), HasSubstr("authentication failed"), Not(HasSubstr(kWrong)),
                    Not(HasSubstr(kRight))));

  const absl::Status acl = Check(Url(port, "tost", kWrong));
  EXPECT_EQ(acl.code(), absl::StatusCode::kFailedPrecondition) << acl;
  EXPECT_THAT(acl.message(), AllOf(HasSubstr("user 'tost'"), Not(HasSubstr(kWrong))));

  const absl::Status none = Check(Url(port, "", ""));
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition) << none;
  EXPECT_THAT(none.message(), AllOf(HasSubstr("requires a password"), HasSubstr(store)));

  // The password from --session_store_password_file: the refusal names the file.
  const std::string file = absl::StrCat(server->dir(), "/wrong.password");
  std::ofstream(file) << kWrong << "\n";
  const absl::Status from_file = Check(absl::StrCat("redis://127.0.0.1:", port, "/0"), file);
  EXPECT_EQ(from_file.code(), absl::StatusCode::kFailedPrecondition) << from_file;
  EXPECT_THAT(from_file.message(),
              AllOf(HasSubstr(absl::StrCat("--session_store_password_file ", file)),
                    Not(HasSubstr(kWrong))));

  // Taken: the right passwords.
  EXPECT_TRUE(Check(Url(port, "default", kRight)).ok());
  EXPECT_TRUE(Check(Url(port, "tost", kAclRight)).ok());
}

TEST(SharedStoreCheck, AStoreNotReachedIsNoRefusal) {
  // Nothing listening: UNAVAILABLE, and the server starts anyway.
  const absl::Status down = Check(Url(FreePort(), "default", kRight));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_THAT(down.message(), HasSubstr("--session_store"));

  // Paused (connections accepted, nothing answered): UNAVAILABLE within the timeout, the
  // connection's and the handshake's.
  auto server = StartServer();
  ASSERT_SERVER(server);
  server->Pause();
  const absl::Time start = absl::Now();
  const absl::Status paused =
      Check(Url(server->port(), "default", kWrong), "", absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  server->Resume();
  EXPECT_EQ(paused.code(), absl::StatusCode::kUnavailable) << paused;
  EXPECT_FALSE(IsCredentialsRefused(paused)) << paused;
  EXPECT_LT(took, absl::Seconds(2)) << paused;

  // The in-memory store has nothing to check.
  absl::StatusOr<SharedStoreFactories> memory = MakeSharedStoreFactories({});
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->check_credentials, nullptr);
}

}  // namespace
}  // namespace tost::store
