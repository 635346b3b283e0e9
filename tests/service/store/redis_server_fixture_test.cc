#include "tests/service/store/redis_server_fixture.h"

#include <signal.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "service/store/redis_client.h"
#include "service/store/redis_url.h"

namespace tost::store::testing {
namespace {

std::unique_ptr<RedisClient> ClientOf(const RedisServerProcess& server) {
  RedisClientOptions options;
  options.endpoint = *ParseRedisUrl(server.url());
  return *RedisClient::Create(options);
}

TEST(RedisServerFixtureTest, AppendOnlyDataSurvivesAKillAndARestart) {
  RedisServerOptions options;
  options.appendonly = true;
  options.appendfsync = "always";
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> server = RedisServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_TRUE(ClientOf(**server)->Command({"SET", "kept", "value"}).ok());

  (*server)->Kill();
  EXPECT_FALSE((*server)->running());
  ASSERT_TRUE((*server)->Restart().ok()) << (*server)->LogTail();
  EXPECT_EQ((*server)->port(), port);
  absl::StatusOr<RedisReply> kept = ClientOf(**server)->Command({"GET", "kept"});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->str, "value");
}

TEST(RedisServerFixtureTest, WithoutAppendOnlyARestartStartsEmpty) {
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> server = RedisServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(ClientOf(**server)->Command({"SET", "gone", "value"}).ok());
  ASSERT_TRUE((*server)->Restart().ok()) << (*server)->LogTail();
  absl::StatusOr<RedisReply> gone = ClientOf(**server)->Command({"GET", "gone"});
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(gone->is_nil());
}

TEST(RedisServerFixtureTest, TheDestructorLeavesNoProcessNorDirectory) {
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> server = RedisServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  pid_t pid = (*server)->pid();
  std::string dir = (*server)->dir();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  (*server)->Pause();  // even a stopped one
  server->reset();
  errno = 0;
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH) << "redis-server " << pid << " outlived its fixture";
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(RedisServerFixtureTest, TwoServersGetTwoPorts) {
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> a = RedisServerProcess::Start();
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> b = RedisServerProcess::Start();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->port(), (*b)->port());
  EXPECT_NE((*a)->dir(), (*b)->dir());
}

}  // namespace
}  // namespace tost::store::testing
