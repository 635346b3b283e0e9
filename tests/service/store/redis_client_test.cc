#include "service/store/redis_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/error_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/store/redis_url.h"
#include "tests/service/store/redis_server_fixture.h"

namespace tost::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::std::string_literals::operator""s;
using testing::RedisServerOptions;
using testing::RedisServerProcess;

class CountingObserver : public RedisClientObserver {
 public:
  void OnCommand(absl::Duration latency, bool ok) override {
    (ok ? ok_ : failed_).fetch_add(1);
    if (latency < absl::ZeroDuration()) negative_latency_.fetch_add(1);
  }
  void OnReconnect() override { reconnects_.fetch_add(1); }

  int ok() const { return ok_.load(); }
  int failed() const { return failed_.load(); }
  int reconnects() const { return reconnects_.load(); }
  int negative_latency() const { return negative_latency_.load(); }

 private:
  std::atomic<int> ok_{0};
  std::atomic<int> failed_{0};
  std::atomic<int> reconnects_{0};
  std::atomic<int> negative_latency_{0};
};

std::unique_ptr<RedisServerProcess> StartServer(RedisServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<RedisServerProcess>> server =
      RedisServerProcess::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

RedisClientOptions OptionsFor(const RedisServerProcess& server) {
  absl::StatusOr<RedisEndpoint> endpoint = ParseRedisUrl(server.url());
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  RedisClientOptions options;
  if (endpoint.ok()) options.endpoint = *endpoint;
  return options;
}

std::unique_ptr<RedisClient> MakeClient(RedisClientOptions options) {
  absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// The value of one field of INFO's text ("connected_clients" → "3").
std::string InfoField(const RedisReply& info, absl::string_view field) {
  for (absl::string_view line : absl::StrSplit(info.str, "\r\n")) {
    if (absl::ConsumePrefix(&line, absl::StrCat(field, ":"))) return std::string(line);
  }
  return "";
}

#define ASSERT_SERVER(server) \
  ASSERT_NE(server, nullptr); \
  ASSERT_TRUE(server->running())

TEST(RedisClientTest, BinaryStringsIntegersNilAndArraysRoundTrip) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  auto client = MakeClient(OptionsFor(*server));
  ASSERT_NE(client, nullptr);

  // NULs, CR LF and RESP's own markers inside keys and values.
  const std::string key = "k\0ey\r\n"s;
  const std::string value = "\0\r\n$3\r\n*1\xff\x80 end"s;
  ASSERT_EQ(key.size(), 6u);
  absl::StatusOr<RedisReply> set = client->Command({"SET", key, value});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->is_status());
  EXPECT_EQ(set->str, "OK");
  absl::StatusOr<RedisReply> get = client->Command({"GET", key});
  ASSERT_TRUE(get.ok()) << get.status();
  ASSERT_TRUE(get->is_string()) << get->DebugString();
  EXPECT_EQ(get->str, value);
  EXPECT_EQ(get->str.size(), 15u);

  absl::StatusOr<RedisReply> missing = client->Command({"GET", "no such key"});
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->is_nil()) << missing->DebugString();

  absl::StatusOr<RedisReply> incr = client->Command({"INCRBY", "n", "-9000000000"});
  ASSERT_TRUE(incr.ok()) << incr.status();
  ASSERT_TRUE(incr->is_integer()) << incr->DebugString();
  EXPECT_EQ(incr->integer, -9000000000LL);

  ASSERT_TRUE(client->Command({"RPUSH", "list", "a", std::string("\0b", 2), ""}).ok());
  absl::StatusOr<RedisReply> range = client->Command({"LRANGE", "list", "0", "-1"});
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE(range->is_array()) << range->DebugString();
  ASSERT_EQ(range->elements.size(), 3u);
  EXPECT_EQ(range->elements[0].str, "a");
  EXPECT_EQ(range->elements[1].str, std::string("\0b", 2));
  EXPECT_EQ(range->elements[2].str, "");
  EXPECT_TRUE(range->elements[2].is_string());

  // Nested arrays with nil inside (a pipeline inside MULTI/EXEC).
  ASSERT_TRUE(client->Command({"MULTI"}).ok());
  ASSERT_TRUE(client->Command({"GET", "no such key"}).ok());
  ASSERT_TRUE(client->Command({"LRANGE", "list", "0", "0"}).ok());
  absl::StatusOr<RedisReply> exec = client->Command({"EXEC"});
  ASSERT_TRUE(exec.ok()) << exec.status();
  ASSERT_EQ(exec->elements.size(), 2u) << exec->DebugString();
  EXPECT_TRUE(exec->elements[0].is_nil());
  ASSERT_TRUE(exec->elements[1].is_array());
  EXPECT_EQ(exec->elements[1].elements.at(0).str, "a");
}

bool HasIpv6Loopback() {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

TEST(RedisClientTest, Ipv6LiteralInTheUrl) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  RedisServerOptions server_options;
  server_options.extra_config = {"bind 127.0.0.1 ::1"};
  auto server = StartServer(server_options);
  ASSERT_SERVER(server);
  absl::StatusOr<RedisEndpoint> endpoint =
      ParseRedisUrl(absl::StrCat("redis://[::1]:", server->port(), "/2"));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  RedisClientOptions options;
  options.endpoint = *endpoint;
  auto client = MakeClient(options);
  ASSERT_TRUE(client->Command({"SET", "k", "v6"}).ok());
  absl::StatusOr<RedisReply> info = client->Command({"CLIENT", "INFO"});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->str, AllOf(HasSubstr("addr=[::1]:"), HasSubstr("db=2")));
}

TEST(RedisClientTest, LargeValuesRoundTrip) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  auto client = MakeClient(OptionsFor(*server));
  std::string value(8 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131 + (i >> 9));
  ASSERT_TRUE(client->Command({"SET", "big", value}).ok());
  absl::StatusOr<RedisReply> get = client->Command({"GET", "big"});
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_TRUE(get->str == value) << "8 MiB value changed on the way";
}

TEST(RedisClientTest, ErrorRepliesAreInternalWithTheStoresMessage) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  auto client = MakeClient(OptionsFor(*server));
  ASSERT_TRUE(client->Command({"SET", "s", "not a number"}).ok());
  absl::StatusOr<RedisReply> incr = client->Command({"INCR", "s"});
  ASSERT_FALSE(incr.ok());
  EXPECT_EQ(incr.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(incr.status().message(),
              AllOf(HasSubstr("not an integer"), HasSubstr("INCR"), HasSubstr("--session_store"),
                    Not(HasSubstr(server->url()))));
  // Where the store is goes to the log alone (the server detail), not to the client's message.
  EXPECT_THAT(ServerDetail(incr.status()), HasSubstr(server->url()));
  absl::StatusOr<RedisReply> unknown = client->Command({"NO-SUCH-COMMAND"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInternal) << unknown.status();
  // The connection survives error replies.
  EXPECT_TRUE(client->Command({"PING"}).ok());
  EXPECT_EQ(client->Command({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RedisClientTest, EvalFallsBackToTheSourceAfterScriptFlush) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  CountingObserver observer;
  RedisClientOptions options = OptionsFor(*server);
  options.observer = &observer;
  auto client = MakeClient(options);
  RedisScript script("return redis.call('INCRBY', KEYS[1], ARGV[1])");

  // The locally computed SHA-1 is the store's name for the script.
  absl::StatusOr<RedisReply> loaded = client->Command({"SCRIPT", "LOAD", script.source()});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(script.sha1(), loaded->str);
  EXPECT_EQ(script.sha1().size(), 40u);

  absl::StatusOr<RedisReply> first = client->Eval(script, {"counter"}, {"5"});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->integer, 5);
  int before_flush = observer.ok();

  ASSERT_TRUE(client->Command({"SCRIPT", "FLUSH"}).ok());
  absl::StatusOr<RedisReply> again = client->Eval(script, {"counter"}, {"7"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->integer, 12);
  // SCRIPT FLUSH, then EVALSHA (NOSCRIPT) and EVAL.
  EXPECT_EQ(observer.ok(), before_flush + 3);
  // EVAL cached it again: the next Eval is one EVALSHA.
  ASSERT_TRUE(client->Eval(script, {"counter"}, {"1"}).ok());
  EXPECT_EQ(observer.ok(), before_flush + 4);

  RedisScript failing("return redis.call('INCR', KEYS[1])");
  ASSERT_TRUE(client->Command({"SET", "text", "abc"}).ok());
  absl::StatusOr<RedisReply> error = client->Eval(failing, {"text"}, {});
  EXPECT_EQ(error.status().code(), absl::StatusCode::kInternal) << error.status();
  EXPECT_THAT(error.status().message(), HasSubstr("not an integer"));
}

TEST(RedisClientTest, PipelineKeepsErrorRepliesInTheirSlots) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  CountingObserver observer;
  RedisClientOptions options = OptionsFor(*server);
  options.observer = &observer;
  auto client = MakeClient(options);

  absl::StatusOr<std::vector<RedisReply>> replies = client->Pipeline(
      {{"SET", "a", "1"}, {"INCR", "a"}, {"HGET", "a", "field"}, {"GET", "a"}, {"GET", "b"}});
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 5u);
  EXPECT_EQ((*replies)[0].str, "OK");
  EXPECT_EQ((*replies)[1].integer, 2);
  EXPECT_TRUE((*replies)[2].is_error());
  EXPECT_THAT((*replies)[2].str, HasSubstr("WRONGTYPE"));
  EXPECT_EQ((*replies)[3].str, "2");
  EXPECT_TRUE((*replies)[4].is_nil());
  EXPECT_EQ(observer.ok(), 1);  // one batch, one observation

  absl::StatusOr<std::vector<RedisReply>> none = client->Pipeline({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(client->Pipeline({{"PING"}, {}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(observer.ok(), 1);  // neither reached the store
}

TEST(RedisClientTest, PasswordAuthentication) {
  const std::string password = "pw-Right-7f3a";
  RedisServerOptions server_options;
  server_options.requirepass = password;
  auto server = StartServer(server_options);
  ASSERT_SERVER(server);

  RedisClientOptions options = OptionsFor(*server);
  options.endpoint.password = password;
  auto client = MakeClient(options);
  absl::StatusOr<RedisReply> pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(pong->str, "PONG");

  options.endpoint.password = "pw-Wrong-0c1d";
  auto wrong = MakeClient(options);
  absl::StatusOr<RedisReply> refused = wrong->Command({"PING"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      refused.status().message(),
      AllOf(HasSubstr("authentication failed"), HasSubstr("--session_store"),
            Not(HasSubstr("127.0.0.1")), Not(HasSubstr("pw-Wrong")), Not(HasSubstr("pw-Right"))));
  EXPECT_THAT(
      ServerDetail(refused.status()),
      AllOf(HasSubstr("127.0.0.1"), Not(HasSubstr("pw-Wrong")), Not(HasSubstr("pw-Right"))));

  options.endpoint.password = "";
  auto none = MakeClient(options);
  absl::StatusOr<RedisReply> noauth = none->Command({"GET", "x"});
  ASSERT_FALSE(noauth.ok());
  EXPECT_EQ(noauth.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(noauth.status().message(),
              AllOf(HasSubstr("authentication failed"), HasSubstr("requires a password")));
}

TEST(RedisClientTest, AclUserAuthentication) {
  RedisServerOptions server_options;
  server_options.requirepass = "pw-Default-91";
  server_options.acl_user = "tost";
  server_options.acl_password = "pw-Acl-Right-44";
  auto server = StartServer(server_options);
  ASSERT_SERVER(server);

  RedisClientOptions options = OptionsFor(*server);
  options.endpoint.user = "tost";
  options.endpoint.password = "pw-Acl-Right-44";
  auto client = MakeClient(options);
  absl::StatusOr<RedisReply> whoami = client->Command({"ACL", "WHOAMI"});
  ASSERT_TRUE(whoami.ok()) << whoami.status();
  EXPECT_EQ(whoami->str, "tost");

  options.endpoint.password = "pw-Acl-Wrong-55";
  auto wrong = MakeClient(options);
  absl::StatusOr<RedisReply> refused = wrong->Command({"PING"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  // The message names the store by its flag; where it is, only the server detail says (the log's).
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("authentication failed"), HasSubstr("user 'tost'"),
                    HasSubstr("the session store (--session_store)"), Not(HasSubstr("redis://")),
                    Not(HasSubstr("pw-Acl")), Not(HasSubstr("pw-Default"))));
  EXPECT_THAT(ServerDetail(refused.status()),
              AllOf(HasSubstr("redis://127.0.0.1"), Not(HasSubstr("pw-Acl"))));
}

TEST(RedisClientTest, DatabasesAreSelectedAndIsolated) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  RedisClientOptions options = OptionsFor(*server);
  auto db0 = MakeClient(options);
  options.endpoint.db = 3;
  auto db3 = MakeClient(options);
  ASSERT_TRUE(db0->Command({"SET", "k", "zero"}).ok());
  ASSERT_TRUE(db3->Command({"SET", "k", "three"}).ok());
  EXPECT_EQ(db0->Command({"GET", "k"})->str, "zero");
  EXPECT_EQ(db3->Command({"GET", "k"})->str, "three");
  EXPECT_EQ(db3->Command({"DBSIZE"})->integer, 1);

  options.endpoint.db = 99;
  auto out_of_range = MakeClient(options);
  absl::StatusOr<RedisReply> refused = out_of_range->Command({"PING"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("could not select database 99"));
  EXPECT_THAT(ServerDetail(refused.status()), HasSubstr("/99"));
}

TEST(RedisClientTest, StoreNotRunningIsUnavailableWithinTheConnectTimeout) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  RedisClientOptions options = OptionsFor(*server);
  ASSERT_TRUE(server->Stop().ok());
  options.connect_timeout = absl::Milliseconds(300);
  CountingObserver observer;
  options.observer = &observer;
  // Creating the client does not connect: the store may be down at start-up.
  auto client = MakeClient(options);
  ASSERT_NE(client, nullptr);

  absl::Time start = absl::Now();
  absl::StatusOr<RedisReply> reply = client->Command({"PING"});
  absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reply.status().message(),
              AllOf(HasSubstr("could not connect"), HasSubstr("--session_store"),
                    HasSubstr("connect timeout of 300ms")));
  EXPECT_THAT(ServerDetail(reply.status()), HasSubstr(absl::StrCat(server->port())));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ(observer.failed(), 1);
  EXPECT_EQ(observer.ok(), 0);

  // It comes up later: the same client reaches it, no reconnect (nothing was ever lost).
  ASSERT_TRUE(server->Restart().ok());
  EXPECT_TRUE(client->Command({"PING"}).ok());
  EXPECT_EQ(observer.reconnects(), 0);
}

TEST(RedisClientTest, PausedStoreIsUnavailableWithinTheCommandTimeoutThenRecovers) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  RedisClientOptions options = OptionsFor(*server);
  options.command_timeout = absl::Milliseconds(300);
  CountingObserver observer;
  options.observer = &observer;
  auto client = MakeClient(options);
  ASSERT_TRUE(client->Command({"SET", "k", "v"}).ok());  // a pooled connection

  server->Pause();
  absl::Time start = absl::Now();
  absl::StatusOr<RedisReply> reply = client->Command({"GET", "k"});
  absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reply.status().message(),
              AllOf(HasSubstr("GET"), HasSubstr("command timeout of 300ms"),
                    HasSubstr("connection was dropped"), HasSubstr("--session_store")));
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));

  // A new connection to a paused store is accepted by the kernel, and times out the same way.
  start = absl::Now();
  EXPECT_EQ(client->Command({"GET", "k"}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  server->Resume();
  absl::StatusOr<RedisReply> after = client->Command({"GET", "k"});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->str, "v");
  EXPECT_EQ(observer.failed(), 2);
  EXPECT_GE(observer.reconnects(), 1);
}

TEST(RedisClientTest, RestartedStoreIsReachedAgainWithoutANewClient) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  CountingObserver observer;
  RedisClientOptions options = OptionsFor(*server);
  options.observer = &observer;
  auto client = MakeClient(options);
  ASSERT_TRUE(client->Command({"SET", "k", "v"}).ok());
  EXPECT_EQ(observer.reconnects(), 0);

  // A clean restart: the pooled connection was closed by the store while idle, which is noticed
  // before it is used, so not even one call fails.
  ASSERT_TRUE(server->Restart().ok());
  absl::StatusOr<RedisReply> pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(observer.reconnects(), 1);
  EXPECT_EQ(observer.failed(), 0);

  // A crash, and calls while the store is down: they fail, and the first after it is back works.
  server->Kill();
  absl::StatusOr<RedisReply> down = client->Command({"PING"});
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
  ASSERT_TRUE(server->Restart().ok());
  pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(observer.reconnects(), 2);
  EXPECT_EQ(observer.failed(), 1);
}

TEST(RedisClientTest, ConnectionsTheStoreClosedWhileIdleAreReplacedBeforeUse) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  CountingObserver observer;
  RedisClientOptions options = OptionsFor(*server);
  options.observer = &observer;
  auto client = MakeClient(options);
  ASSERT_TRUE(client->Command({"CLIENT", "SETNAME", "pooled"}).ok());
  auto admin = MakeClient(OptionsFor(*server));
  absl::StatusOr<RedisReply> killed = admin->Command({"CLIENT", "KILL", "SKIPME", "yes"});
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->integer, 1);

  absl::StatusOr<RedisReply> name = client->Command({"CLIENT", "GETNAME"});
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_TRUE(name->is_nil()) << "expected a new connection, got " << name->DebugString();
  EXPECT_EQ(observer.failed(), 0);
  EXPECT_EQ(observer.reconnects(), 1);
}

TEST(RedisClientTest, ConcurrentIncrementsOnABoundedPool) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  CountingObserver observer;
  RedisClientOptions options = OptionsFor(*server);
  options.max_connections = 4;
  options.observer = &observer;
  auto client = MakeClient(options);

  constexpr int kThreads = 8;
  constexpr int kIncrements = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        if (!client->Command({"INCR", "shared"}).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  absl::StatusOr<RedisReply> total = client->Command({"GET", "shared"});
  ASSERT_TRUE(total.ok()) << total.status();
  EXPECT_EQ(total->str, absl::StrCat(kThreads * kIncrements));
  EXPECT_EQ(observer.ok(), kThreads * kIncrements + 1);
  EXPECT_EQ(observer.failed(), 0);
  EXPECT_EQ(observer.negative_latency(), 0);

  // Never more connections than max_connections.
  absl::StatusOr<RedisReply> info = client->Command({"INFO", "clients"});
  ASSERT_TRUE(info.ok()) << info.status();
  int connected = 0;
  ASSERT_TRUE(absl::SimpleAtoi(InfoField(*info, "connected_clients"), &connected)) << info->str;
  EXPECT_GE(connected, 1);
  EXPECT_LE(connected, 4);
}

TEST(RedisClientTest, WaitingForAPooledConnectionIsBounded) {
  auto server = StartServer();
  ASSERT_SERVER(server);
  RedisClientOptions options = OptionsFor(*server);
  options.max_connections = 1;
  options.command_timeout = absl::Milliseconds(300);
  auto client = MakeClient(options);
  ASSERT_TRUE(client->Command({"PING"}).ok());

  server->Pause();
  std::vector<absl::Status> statuses(3);
  std::vector<absl::Duration> took(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      absl::Time start = absl::Now();
      statuses[i] = client->Command({"PING"}).status();
      took[i] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  bool busy_seen = false;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(statuses[i].code(), absl::StatusCode::kUnavailable) << statuses[i];
    EXPECT_LT(took[i], absl::Seconds(3)) << statuses[i];
    busy_seen =
        busy_seen || absl::StrContains(statuses[i].message(), "all 1 connections were busy");
  }
  EXPECT_TRUE(busy_seen) << "expected a caller to give up waiting for the one connection";
  server->Resume();
  EXPECT_TRUE(client->Command({"PING"}).ok());
}

TEST(RedisClientTest, BusyStoreIsUnavailable) {
  RedisServerOptions server_options;
  server_options.extra_config = {"busy-reply-threshold 100"};  // milliseconds before BUSY replies
  auto server = StartServer(server_options);
  ASSERT_SERVER(server);
  RedisClientOptions options = OptionsFor(*server);
  options.command_timeout = absl::Seconds(10);
  auto looping = MakeClient(options);
  auto other = MakeClient(options);
  ASSERT_TRUE(other->Command({"PING"}).ok());

  absl::Status loop_status;
  std::thread loop(
      [&] { loop_status = looping->Eval(RedisScript("while true do end"), {}, {}).status(); });
  absl::Status busy;
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    busy = other->Command({"PING"}).status();
    if (!busy.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable) << busy;
  EXPECT_THAT(busy.message(), AllOf(HasSubstr("BUSY"), HasSubstr("cannot serve PING now")));
  absl::StatusOr<RedisReply> killed = other->Command({"SCRIPT", "KILL"});
  EXPECT_TRUE(killed.ok()) << killed.status();
  loop.join();
  EXPECT_EQ(loop_status.code(), absl::StatusCode::kInternal) << loop_status;
  EXPECT_TRUE(other->Command({"PING"}).ok());
}

TEST(RedisClientTest, InvalidOptionsAreRefused) {
  RedisClientOptions good;
  good.endpoint.host = "127.0.0.1";
  EXPECT_TRUE(ValidateRedisClientOptions(good).ok());
  auto refused = [&](auto change) {
    RedisClientOptions o = good;
    change(o);
    absl::StatusOr<std::unique_ptr<RedisClient>> client = RedisClient::Create(o);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(client.status().message());
  };
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.endpoint.host = ""; }), HasSubstr("host"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.endpoint.port = 0; }), HasSubstr("got 0"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.endpoint.db = -1; }), HasSubstr("got -1"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.endpoint.user = "u"; }),
              HasSubstr("needs a password"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.connect_timeout = absl::ZeroDuration(); }),
              HasSubstr("connect timeout"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.command_timeout = -absl::Seconds(1); }),
              HasSubstr("command timeout"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.command_timeout = absl::InfiniteDuration(); }),
              HasSubstr("finite"));
  EXPECT_THAT(refused([](RedisClientOptions& o) { o.max_connections = 0; }),
              HasSubstr("max_connections"));
}

}  // namespace
}  // namespace tost::store
