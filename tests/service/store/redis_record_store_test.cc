// The shared record store against a real redis-server: two stores on one Redis are two replicas.
#include "service/store/redis_record_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/error_detail.h"
#include "service/engine/record_store.h"
#include "service/engine/session_store.h"
#include "service/store/shared_store_flags.h"
#include "tests/service/store/redis_server_fixture.h"

namespace tost::store {
namespace {

using service::RecordNotFound;
using ::testing::HasSubstr;
using ::testing::Not;

class RedisRecordStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto redis = testing::RedisServerProcess::Start();
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    auto raw = RedisClient::Create(ClientOptions());
    ASSERT_TRUE(raw.ok()) << raw.status();
    raw_ = *std::move(raw);
  }

  RedisClientOptions ClientOptions() const {
    RedisClientOptions o;
    o.endpoint.host = "127.0.0.1";
    o.endpoint.port = redis_->port();
    o.connect_timeout = absl::Milliseconds(300);
    o.command_timeout = absl::Milliseconds(300);
    return o;
  }

  // A replica: its own client and store on the shared Redis.
  std::unique_ptr<RedisRecordStore> Replica(service::RecordStoreOptions records = {}) {
    auto client = RedisClient::Create(ClientOptions());
    EXPECT_TRUE(client.ok()) << client.status();
    RedisRecordStoreOptions options;
    options.records = records;
    auto store = RedisRecordStore::Make(*std::move(client), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }

  int64_t Pttl(const std::string& key) {
    auto ttl = raw_->Command({"PTTL", key});
    EXPECT_TRUE(ttl.ok()) << ttl.status();
    return ttl.ok() ? ttl->integer : -3;
  }

  std::unique_ptr<testing::RedisServerProcess> redis_;
  std::unique_ptr<RedisClient> raw_;
};

TEST_F(RedisRecordStoreTest, EveryReplicaReadsAndWritesEveryRecord) {
  auto a = Replica();
  auto b = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "first").ok());
  auto got = b->Get("resp_1", "alice");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data, "first");
  EXPECT_EQ(got->version, 1);

  auto v2 = b->Replace("resp_1", "alice", 1, "second");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(*v2, 2);
  got = a->Get("resp_1", "alice");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data, "second");
  EXPECT_EQ(got->version, 2);

  ASSERT_TRUE(a->Delete("resp_1", "alice").ok());
  EXPECT_EQ(b->Get("resp_1", "alice").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(b->Delete("resp_1", "alice"), RecordNotFound("resp_1"));
  EXPECT_EQ(b->Replace("resp_1", "alice", 2, "x").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(raw_->Command({"EXISTS", a->RecordKey("resp_1")})->integer, 0);
  EXPECT_EQ(a->stats().records, 0);
}

TEST_F(RedisRecordStoreTest, TheValueIsOneStringOfOwnerDigestVersionIdDigestAndData) {
  auto a = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "data").ok());
  EXPECT_EQ(a->RecordKey("resp_1"), "tost:r:resp_1");
  auto type = raw_->Command({"TYPE", "tost:r:resp_1"});
  ASSERT_TRUE(type.ok());
  EXPECT_EQ(type->str, "string");
  auto value = raw_->Command({"GET", "tost:r:resp_1"});
  ASSERT_TRUE(value.ok());
  ASSERT_EQ(value->str.size(), 32u + 16u + 32u + 4u);
  EXPECT_EQ(value->str.substr(32, 16), "0000000000000001");
  EXPECT_EQ(value->str.substr(80), "data");
  EXPECT_EQ(value->str.find("alice"), std::string::npos) << "the store holds no caller names";
  EXPECT_EQ(value->str.find("resp_1"), std::string::npos);
  ASSERT_TRUE(a->Replace("resp_1", "alice", 1, "data2").ok());
  auto replaced = raw_->Command({"GET", "tost:r:resp_1"});
  EXPECT_EQ(replaced->str.substr(32, 16), "0000000000000002");
  EXPECT_EQ(replaced->str.substr(48, 32), value->str.substr(48, 32)) << "the same id";
  EXPECT_EQ(replaced->str.substr(80), "data2");
}

TEST_F(RedisRecordStoreTest, ARecordMovedOrCopiedToAnotherIdIsRefused) {
  auto a = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "first").ok());
  ASSERT_TRUE(a->Create("resp_2", "alice", "second").ok());
  // Swapped: each id holds the other's record.
  ASSERT_TRUE(raw_->Command({"RENAME", a->RecordKey("resp_1"), a->RecordKey("swap")}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", a->RecordKey("resp_2"), a->RecordKey("resp_1")}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", a->RecordKey("swap"), a->RecordKey("resp_2")}).ok());
  auto b = Replica();
  for (const char* id : {"resp_1", "resp_2"}) {
    auto got = b->Get(id, "alice");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss)
        << id << ": " << (got.ok() ? got->data : got.status().ToString());
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("another record's value"));
  }
  // Copied to an id of its own: refused there, still itself where it was.
  ASSERT_TRUE(raw_->Command({"COPY", a->RecordKey("resp_1"), a->RecordKey("resp_3")}).ok());
  auto copy = b->Get("resp_3", "alice");
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kDataLoss)
      << (copy.ok() ? copy->data : copy.status().ToString());
  ASSERT_TRUE(raw_->Command({"RENAME", a->RecordKey("resp_1"), a->RecordKey("resp_2")}).ok());
  EXPECT_EQ(b->Get("resp_2", "alice")->data, "second");
}

TEST_F(RedisRecordStoreTest, AnIdIsCreatedOnce) {
  auto a = Replica();
  auto b = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "a").ok());
  const absl::Status again = b->Create("resp_1", "bob", "b");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("resp_1"));
  EXPECT_EQ(a->Get("resp_1", "alice")->data, "a");
}

TEST_F(RedisRecordStoreTest, AnotherOwnerSeesWhatAnUnknownIdGets) {
  auto a = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "a").ok());
  EXPECT_EQ(a->Get("resp_1", "bob").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(a->Get("resp_2", "bob").status(), RecordNotFound("resp_2"));
  EXPECT_EQ(a->Replace("resp_1", "bob", 1, "b").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(a->Delete("resp_1", "bob"), RecordNotFound("resp_1"));
  auto mine = a->Get("resp_1", "alice");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->data, "a");
  EXPECT_EQ(mine->version, 1);
}

TEST_F(RedisRecordStoreTest, AReplaceFromAStaleVersionIsAbortedAndWritesNothing) {
  auto a = Replica();
  auto b = Replica();
  ASSERT_TRUE(a->Create("conv_1", "alice", "turn 1").ok());
  ASSERT_EQ(*a->Replace("conv_1", "alice", 1, "turn 2 (a)"), 2);
  auto late = b->Replace("conv_1", "alice", 1, "turn 2 (b)");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("changed by another request: expected version 1, it is at version 2"));
  EXPECT_EQ(b->Get("conv_1", "alice")->data, "turn 2 (a)");
}

TEST_F(RedisRecordStoreTest, ManyReplicasAdvancingOneConversationOneWins) {
  std::vector<std::unique_ptr<RedisRecordStore>> replicas;
  for (int i = 0; i < 4; ++i) replicas.push_back(Replica());
  ASSERT_TRUE(replicas[0]->Create("conv_1", "alice", "turn 1").ok());
  std::atomic<int> won{0};
  std::atomic<int> aborted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto v = replicas[i]->Replace("conv_1", "alice", 1, absl::StrCat("turn 2 from ", i));
      if (v.ok()) {
        ++won;
      } else if (v.status().code() == absl::StatusCode::kAborted) {
        ++aborted;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_EQ(replicas[0]->Get("conv_1", "alice")->version, 2);
}

TEST_F(RedisRecordStoreTest, EveryWriteSetsTheTtlAndReadsDoNotRefreshIt) {
  service::RecordStoreOptions records;
  records.ttl = absl::Hours(1);
  auto a = Replica(records);
  const std::string key = a->RecordKey("resp_1");
  ASSERT_TRUE(a->Create("resp_1", "alice", "a").ok());
  EXPECT_GT(Pttl(key), 3'500'000);
  EXPECT_LE(Pttl(key), 3'600'000);

  // Shortened by hand (as if an hour were nearly over): a read leaves it, a write restarts it.
  ASSERT_TRUE(raw_->Command({"PEXPIRE", key, "50000"}).ok());
  ASSERT_TRUE(a->Get("resp_1", "alice").ok());
  EXPECT_GT(Pttl(key), 0);
  EXPECT_LE(Pttl(key), 50'000);
  ASSERT_TRUE(a->Replace("resp_1", "alice", 1, "b").ok());
  EXPECT_GT(Pttl(key), 3'500'000);
  // A failed write leaves it too.
  ASSERT_TRUE(raw_->Command({"PEXPIRE", key, "50000"}).ok());
  EXPECT_EQ(a->Replace("resp_1", "alice", 1, "c").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Replace("resp_1", "bob", 2, "c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_LE(Pttl(key), 50'000);

  // Expired in the store (the store's TTL ran out): gone for everyone.
  ASSERT_TRUE(raw_->Command({"DEL", key}).ok());
  EXPECT_EQ(a->Get("resp_1", "alice").status(), RecordNotFound("resp_1"));
}

TEST_F(RedisRecordStoreTest, OversizedDataIsRefusedBeforeTheStore) {
  service::RecordStoreOptions records;
  records.max_record_bytes = 100;
  auto a = Replica(records);
  const absl::Status big = a->Create("resp_1", "alice", std::string(101, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_THAT(std::string(big.message()), HasSubstr("at most 100 bytes, got 101"));
  EXPECT_EQ(raw_->Command({"EXISTS", a->RecordKey("resp_1")})->integer, 0);
  ASSERT_TRUE(a->Create("resp_1", "alice", std::string(100, 'x')).ok());
  EXPECT_EQ(a->Replace("resp_1", "alice", 1, std::string(101, 'y')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Get("resp_1", "alice")->data, std::string(100, 'x'));
}

TEST_F(RedisRecordStoreTest, AStoredFiveKilobyteResponseCostsTheStoreUnderEightKilobytes) {
  auto a = Replica();
  // An id as the server makes them, and data that no encoding shrinks.
  const std::string id = absl::StrCat("resp_", service::NewSessionId());
  std::string data;
  while (data.size() < 5 * 1024) data += service::NewSessionId();
  data.resize(5 * 1024);
  ASSERT_TRUE(a->Create(id, "an-api-key-name", data).ok());
  auto usage = raw_->Command({"MEMORY", "USAGE", a->RecordKey(id), "SAMPLES", "0"});
  ASSERT_TRUE(usage.ok()) << usage.status();
  ASSERT_TRUE(usage->is_integer()) << usage->DebugString();
  EXPECT_LT(usage->integer, 8192);
  std::cout << "MEMORY USAGE of a record of " << data.size() << " bytes of data: " << usage->integer
            << " bytes\n";
  EXPECT_EQ(a->Get(id, "an-api-key-name")->data, data);
}

TEST_F(RedisRecordStoreTest, StoreDownIsUnavailableNamingTheStoreWithARetryHint) {
  auto a = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "a").ok());
  redis_->Pause();
  const absl::Time start = absl::Now();
  const std::string where = "127.0.0.1:" + std::to_string(redis_->port());
  for (const absl::Status& s :
       {a->Create("resp_2", "alice", "b"), a->Get("resp_1", "alice").status(),
        a->Replace("resp_1", "alice", 1, "c").status(), a->Delete("resp_1", "alice")}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the session store (--session_store)"));
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr(where)));
    EXPECT_THAT(ServerDetail(s), HasSubstr(where));  // for the log
    EXPECT_THAT(std::string(s.message()), HasSubstr("retry after about 1000 ms"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  redis_->Resume();
  EXPECT_EQ(a->Get("resp_1", "alice")->data, "a");

  // Gone altogether: refused at once, the same way.
  redis_->Kill();
  const absl::Status gone = a->Get("resp_1", "alice").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
  EXPECT_THAT(std::string(gone.message()), HasSubstr("retry after about 1000 ms"));
}

TEST_F(RedisRecordStoreTest, AStoreOutOfMemoryIsUnavailableWithARetryHint) {
  auto a = Replica();
  ASSERT_TRUE(a->Create("resp_1", "alice", "a").ok());
  ASSERT_TRUE(raw_->Command({"CONFIG", "SET", "maxmemory", "1"}).ok());
  const absl::Status create = a->Create("resp_2", "alice", "b");
  EXPECT_EQ(create.code(), absl::StatusCode::kUnavailable) << create;
  EXPECT_THAT(std::string(create.message()), HasSubstr("retry after about 1000 ms"));
  const absl::Status replace = a->Replace("resp_1", "alice", 1, "c").status();
  EXPECT_EQ(replace.code(), absl::StatusCode::kUnavailable) << replace;
  EXPECT_TRUE(a->Get("resp_1", "alice").ok()) << "reads still work";
  ASSERT_TRUE(raw_->Command({"CONFIG", "SET", "maxmemory", "0"}).ok());
  EXPECT_TRUE(a->Replace("resp_1", "alice", 1, "c").ok());
}

TEST_F(RedisRecordStoreTest, AValueThisServerDidNotWriteIsDataLoss) {
  auto a = Replica();
  ASSERT_TRUE(raw_->Command({"SET", a->RecordKey("resp_1"), "short"}).ok());
  const absl::Status s = a->Get("resp_1", "alice").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("resp_1"));
}

TEST(RedisRecordStoreOptions, RefusesBadOptionsAndTheFactoryFollowsTheUrl) {
  RedisClientOptions nowhere;
  nowhere.endpoint.host = "127.0.0.1";
  nowhere.endpoint.port = 1;
  auto client = RedisClient::Create(nowhere);
  ASSERT_TRUE(client.ok()) << client.status();
  RedisRecordStoreOptions bad;
  bad.records.ttl = absl::ZeroDuration();
  EXPECT_EQ(RedisRecordStore::Make(*std::move(client), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RedisRecordStore::Make(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto memory = MakeSharedStoreFactories({});
  ASSERT_TRUE(memory.ok());
  EXPECT_FALSE(static_cast<bool>(memory->records));
  SharedStoreFlags shared;
  shared.url = "redis://127.0.0.1:1/0";
  shared.redis.key_prefix = "other:";
  auto redis = MakeSharedStoreFactories(shared);
  ASSERT_TRUE(redis.ok()) << redis.status();
  ASSERT_TRUE(static_cast<bool>(redis->records));
  auto store = redis->records(service::RecordStoreOptions{});
  ASSERT_TRUE(store.ok()) << store.status();  // nothing connects yet
  EXPECT_EQ(dynamic_cast<RedisRecordStore&>(**store).RecordKey("x"), "other:r:x");
  service::RecordStoreOptions invalid;
  invalid.max_record_bytes = 0;
  EXPECT_FALSE(redis->records(invalid).ok());
}

}  // namespace
}  // namespace tost::store
