// The shared session store against a real redis-server: two stores on one Redis are two replicas.
#include "service/store/redis_session_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/error_detail.h"
#include "service/engine/clock.h"
#include "service/engine/session_codec.h"
#include "service/store/shared_store_flags.h"
#include "tests/service/engine/fake_models.h"
#include "tests/service/store/redis_server_fixture.h"

namespace tost::store {
namespace {

using service::GenerationState;
using service::ModelIdentity;
using service::SessionCodec;
using service::SessionStoreContext;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKey[] = "0123456789abcdef-shared-secret";

// The owner as the store's keys name it (redis_session_store.cc's OwnerDigest).
std::string OwnerDigestForTest(const std::string& owner) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  const std::string tagged = absl::StrCat("tost-session-owner", std::string(1, '\0'), owner);
  SHA256(reinterpret_cast<const unsigned char*>(tagged.data()), tagged.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

RedisSessionStoreOptions Lease(absl::Duration lease) {
  RedisSessionStoreOptions o;
  o.lease = lease;
  return o;
}

service::SessionStoreOptions IdleTimeout(absl::Duration idle) {
  service::SessionStoreOptions o;
  o.idle_timeout = idle;
  return o;
}

class RedisSessionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto redis = testing::RedisServerProcess::Start(redis_options_);
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    auto codec = SessionCodec::Create({kKey});
    ASSERT_TRUE(codec.ok()) << codec.status();
    codec_ = std::make_unique<SessionCodec>(*std::move(codec));
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
  std::unique_ptr<RedisSessionStore> Replica(RedisSessionStoreOptions options = {},
                                             service::SessionStoreOptions sessions = {}) {
    auto client = RedisClient::Create(ClientOptions());
    EXPECT_TRUE(client.ok()) << client.status();
    SessionStoreContext context;
    context.options = sessions;
    context.codec = codec_.get();
    context.identity = [this](const std::string& model) -> absl::StatusOr<ModelIdentity> {
      if (model != lm_.config().name) return absl::NotFoundError("no such model");
      return ModelIdentity{&lm_.config(), std::string(32, 'w')};
    };
    context.clock = &clock_;
    auto store = RedisSessionStore::Create(std::move(context), *std::move(client), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }

  GenerationState State(int64_t position) const {
    GenerationState s;
    s.model = lm_.config().name;
    s.sequence = lm_.NewSequence();
    s.sequence.position = position;
    for (size_t i = 0; i < s.sequence.stats.size(); ++i) s.sequence.stats[i] = 0.25f * i;
    s.pending_token = 65;
    s.sampling.seed = 7;
    return s;
  }

  testing::RedisServerOptions redis_options_;
  std::unique_ptr<testing::RedisServerProcess> redis_;
  std::unique_ptr<SessionCodec> codec_;
  std::unique_ptr<RedisClient> raw_;
  service::testing::FakeLanguageModel lm_;
  service::FakeClock clock_;
};

TEST_F(RedisSessionStoreTest, EveryReplicaContinuesEverySession) {
  auto a = Replica();
  auto b = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(id.ok()) << id.status();

  // B checks it out, advances it; A (holding a stale hot copy) reads the new state.
  auto on_b = b->Checkout(*id, "alice");
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(on_b->sequence.position, 3);
  EXPECT_EQ(on_b->sequence.stats, State(3).sequence.stats);
  ASSERT_TRUE(b->CheckinAndWait(*id, State(9)).ok());
  auto on_a = a->Get(*id, "alice");
  ASSERT_TRUE(on_a.ok()) << on_a.status();
  EXPECT_EQ(on_a->sequence.position, 9);

  // And back on A, from its hot copy or the store: the same state either way.
  auto again = a->Checkout(*id, "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->sequence.position, 9);
  ASSERT_TRUE(a->CheckinAndWait(*id, State(12)).ok());
  EXPECT_EQ(b->Get(*id, "alice")->sequence.position, 12);

  ASSERT_TRUE(b->Close(*id, "alice").ok());
  EXPECT_EQ(a->Get(*id, "alice").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RedisSessionStoreTest, AnotherOwnerSeesNotFoundAndTakesNoLease) {
  auto a = Replica();
  auto b = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(b->Checkout(*id, "bob").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Get(*id, "bob").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Close(*id, "bob").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Checkout("0123456789abcdef0123456789abcdef", "alice").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(a->Checkout(*id, "alice").ok());  // bob's tries held nothing
  a->Release(*id);
}

TEST_F(RedisSessionStoreTest, OneGenerationAtATimeAcrossReplicas) {
  auto a = Replica();
  auto b = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(a->Checkout(*id, "alice").ok());
  auto second = b->Checkout(*id, "alice");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use by another Generate"));
  EXPECT_EQ(a->Checkout(*id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Get(*id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Close(*id, "alice").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->stats().busy, 1);
  ASSERT_TRUE(a->CheckinAndWait(*id, State(5)).ok());
  EXPECT_EQ(a->stats().busy, 0);
  auto now = b->Checkout(*id, "alice");
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->sequence.position, 5);
  b->Release(*id);
}

TEST_F(RedisSessionStoreTest, ManyReplicasRacingForOneSessionOneWins) {
  std::vector<std::unique_ptr<RedisSessionStore>> replicas;
  for (int i = 0; i < 4; ++i) replicas.push_back(Replica());
  auto id = replicas[0]->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  std::atomic<int> won{0};
  std::atomic<int> busy{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto s = replicas[i]->Checkout(*id, "alice");
      if (s.ok()) {
        ++won;
      } else if (s.status().code() == absl::StatusCode::kFailedPrecondition) {
        ++busy;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(busy.load(), 3);
}

TEST_F(RedisSessionStoreTest, ADeadReplicasLeaseExpiresAndTheSessionIsAtItsLastSavedState) {
  const RedisSessionStoreOptions short_lease = Lease(absl::Milliseconds(300));
  auto b = Replica(short_lease);
  std::string id;
  {
    auto a = Replica(short_lease);
    id = *a->Add("alice", State(3));
    ASSERT_TRUE(a->Checkout(id, "alice").ok());
    // `a` goes without checking in or releasing: as a killed replica would (its destructor only
    // stops its threads).
  }
  EXPECT_EQ(b->Checkout(id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<GenerationState> s = b->Checkout(id, "alice");
  while (!s.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    s = b->Checkout(id, "alice");
  }
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sequence.position, 3);
  b->Release(id);
}

TEST_F(RedisSessionStoreTest, ALeaseHeldLongerThanItsExpiryIsRenewed) {
  auto a = Replica(Lease(absl::Milliseconds(300)));
  auto b = Replica(Lease(absl::Milliseconds(300)));
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(a->Checkout(*id, "alice").ok());
  absl::SleepFor(absl::Seconds(1));  // three leases long: only renewal keeps it
  EXPECT_EQ(b->Checkout(*id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->CheckinAndWait(*id, State(4)).ok());
}

TEST_F(RedisSessionStoreTest, ACheckinAfterTheLeaseWasLostIsAbortedAndWritesNothing) {
  auto a = Replica();
  auto b = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(a->Checkout(*id, "alice").ok());
  // The lease lapses (a replica stalled past it) and another replica takes the session.
  ASSERT_TRUE(raw_->Command({"DEL", "tost:l:" + *id}).ok());
  ASSERT_TRUE(b->Checkout(*id, "alice").ok());
  ASSERT_TRUE(b->CheckinAndWait(*id, State(20)).ok());
  const absl::Status late = a->CheckinAndWait(*id, State(4));
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("lease"));
  EXPECT_EQ(b->Get(*id, "alice")->sequence.position, 20);
  EXPECT_EQ(a->Get(*id, "alice")->sequence.position, 20);
}

TEST_F(RedisSessionStoreTest, StateTamperedWithInTheStoreIsRefused) {
  auto a = Replica();
  auto b = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(raw_->Command({"HSET", "tost:s:" + *id, "blob", "TOSTSESS forged"}).ok());
  ASSERT_TRUE(raw_->Command({"HINCRBY", "tost:s:" + *id, "ver", "1"}).ok());
  auto s = b->Checkout(*id, "alice");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("failed authentication"));
  // Refused without keeping the lease.
  EXPECT_EQ(raw_->Command({"EXISTS", "tost:l:" + *id})->integer, 0);

  // A blob of another owner swapped in (owner digest left as alice's) is not alice's.
  auto mallory = a->Add("mallory", State(4));
  auto blob = raw_->Command({"HGET", "tost:s:" + *mallory, "blob"});
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(raw_->Command({"HSET", "tost:s:" + *id, "blob", blob->str}).ok());
  ASSERT_TRUE(raw_->Command({"HINCRBY", "tost:s:" + *id, "ver", "1"}).ok());
  EXPECT_EQ(b->Checkout(*id, "alice").status().code(), absl::StatusCode::kDataLoss);
}

// What a replica refused from the store, and the line it logged: a store that hands out the wrong
// state must leave a trace on the replica, whatever the caller does with its error.
struct Refusal {
  absl::Status status;
  std::string log;
};

template <typename Read>
Refusal Refused(Read read) {
  ::testing::internal::CaptureStderr();
  absl::Status status = read();
  return Refusal{std::move(status), ::testing::internal::GetCapturedStderr()};
}

std::string Position(const absl::StatusOr<GenerationState>& s) {
  return s.ok() ? absl::StrCat("OK at position ", s->sequence.position) : s.status().ToString();
}

TEST_F(RedisSessionStoreTest, StatesSwappedBetweenTwoSessionIdsAreRefused) {
  auto one = Replica();
  auto x = one->Add("alice", State(23));
  auto y = one->Add("alice", State(3));
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:" + *x, "tost:s:swap"}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:" + *y, "tost:s:" + *x}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:swap", "tost:s:" + *y}).ok());

  // Another replica (nothing of either held hot) is asked for Y, then for X.
  auto two = Replica();
  absl::StatusOr<GenerationState> at_y;
  const Refusal get = Refused([&] {
    at_y = two->Get(*y, "alice");
    return at_y.status();
  });
  EXPECT_EQ(get.status.code(), absl::StatusCode::kDataLoss) << Position(at_y);
  EXPECT_THAT(std::string(get.status.message()), HasSubstr("sealed for another session id"));
  EXPECT_THAT(get.log, HasSubstr("ERROR"));
  EXPECT_THAT(get.log, HasSubstr("sealed for another session id"));
  absl::StatusOr<GenerationState> at_x;
  const Refusal checkout = Refused([&] {
    at_x = two->Checkout(*x, "alice");
    return at_x.status();
  });
  EXPECT_EQ(checkout.status.code(), absl::StatusCode::kDataLoss) << Position(at_x);
  EXPECT_THAT(checkout.log, HasSubstr("sealed for another session id"));
  EXPECT_EQ(raw_->Command({"EXISTS", "tost:l:" + *x})->integer, 0) << "refused without a lease";

  // Swapped back, each is itself again.
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:" + *x, "tost:s:swap"}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:" + *y, "tost:s:" + *x}).ok());
  ASSERT_TRUE(raw_->Command({"RENAME", "tost:s:swap", "tost:s:" + *y}).ok());
  EXPECT_EQ(Position(two->Get(*x, "alice")), "OK at position 23");
  EXPECT_EQ(Position(two->Get(*y, "alice")), "OK at position 3");
}

TEST_F(RedisSessionStoreTest, AStateCopiedToAnotherIdOrHandedToAnotherOwnerIsRefused) {
  auto one = Replica();
  auto x = one->Add("alice", State(23));
  auto y = one->Add("alice", State(3));
  auto b = one->Add("bob", State(5));
  ASSERT_TRUE(x.ok() && y.ok() && b.ok());
  const std::string bobs_digest = raw_->Command({"HGET", "tost:s:" + *b, "owner"})->str;
  auto two = Replica();

  // X copied over Y, both alice's.
  ASSERT_TRUE(raw_->Command({"COPY", "tost:s:" + *x, "tost:s:" + *y, "REPLACE"}).ok());
  absl::StatusOr<GenerationState> at_y;
  const Refusal same_owner = Refused([&] {
    at_y = two->Get(*y, "alice");
    return at_y.status();
  });
  EXPECT_EQ(same_owner.status.code(), absl::StatusCode::kDataLoss) << Position(at_y);
  EXPECT_THAT(same_owner.log, HasSubstr("sealed for another session id"));

  // X copied over bob's session, its owner field made bob's.
  ASSERT_TRUE(raw_->Command({"COPY", "tost:s:" + *x, "tost:s:" + *b, "REPLACE"}).ok());
  ASSERT_TRUE(raw_->Command({"HSET", "tost:s:" + *b, "owner", bobs_digest}).ok());
  const Refusal to_bob = Refused([&] { return two->Get(*b, "bob").status(); });
  EXPECT_EQ(to_bob.status.code(), absl::StatusCode::kDataLoss) << to_bob.status;
  EXPECT_THAT(to_bob.log, HasSubstr("sealed for another session id"));

  // X itself handed to bob: its owner field rewritten in place.
  ASSERT_TRUE(raw_->Command({"HSET", "tost:s:" + *x, "owner", bobs_digest}).ok());
  const Refusal handed = Refused([&] { return two->Checkout(*x, "bob").status(); });
  EXPECT_EQ(handed.status.code(), absl::StatusCode::kDataLoss) << handed.status;
  EXPECT_THAT(std::string(handed.status.message()), HasSubstr("sealed for another owner"));
  EXPECT_THAT(handed.log, HasSubstr("sealed for another owner"));
  EXPECT_EQ(two->Get(*x, "alice").status().code(), absl::StatusCode::kNotFound)
      << "the store says it is bob's: alice is refused before any state is read";
}

TEST_F(RedisSessionStoreTest, AnOlderStateWrittenBackIsRefusedWhereItCanBeTold) {
  auto one = Replica();
  auto id = one->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  const std::string key = "tost:s:" + *id;
  const std::string at_1 = raw_->Command({"HGET", key, "blob"})->str;
  ASSERT_TRUE(one->Checkout(*id, "alice").ok());
  ASSERT_TRUE(one->CheckinAndWait(*id, State(9)).ok());
  const std::string at_2 = raw_->Command({"HGET", key, "blob"})->str;
  ASSERT_EQ(raw_->Command({"HGET", key, "ver"})->str, "2");

  // The state of version 1 written back under version 2: every replica can tell.
  ASSERT_TRUE(raw_->Command({"HSET", key, "blob", at_1}).ok());
  auto fresh = Replica();
  absl::StatusOr<GenerationState> read;
  const Refusal stale_blob = Refused([&] {
    read = fresh->Get(*id, "alice");
    return read.status();
  });
  EXPECT_EQ(stale_blob.status.code(), absl::StatusCode::kDataLoss) << Position(read);
  EXPECT_THAT(std::string(stale_blob.status.message()),
              HasSubstr("sealed as version 1 but the store's version field says 2"));
  EXPECT_THAT(stale_blob.log, HasSubstr("sealed as version 1"));
  // (The replica that wrote version 2 still holds it hot: it serves that, not the store's blob.)
  EXPECT_EQ(Position(one->Get(*id, "alice")), "OK at position 9");

  // The whole of version 1, state and version field: the replica that saw version 2 can tell.
  ASSERT_TRUE(raw_->Command({"HSET", key, "blob", at_1, "ver", "1"}).ok());
  const Refusal rolled_back = Refused([&] {
    read = one->Checkout(*id, "alice");
    return read.status();
  });
  EXPECT_EQ(rolled_back.status.code(), absl::StatusCode::kDataLoss) << Position(read);
  EXPECT_THAT(std::string(rolled_back.status.message()),
              HasSubstr("is at version 1 but this replica already saw version 2"));
  EXPECT_THAT(rolled_back.log, HasSubstr("already saw version 2"));
  EXPECT_EQ(raw_->Command({"EXISTS", "tost:l:" + *id})->integer, 0) << "refused without a lease";
  // A replica that never saw version 2 cannot: version 1 is an authentic state of this session,
  // and nothing outside the store says it is not the latest (docs/sessions.md states this limit).
  EXPECT_EQ(Position(Replica()->Get(*id, "alice")), "OK at position 3");

  // Version 2 back; a version field moved while a replica holds the lease: its write is refused.
  ASSERT_TRUE(raw_->Command({"HSET", key, "blob", at_2, "ver", "2"}).ok());
  ASSERT_EQ(Position(one->Checkout(*id, "alice")), "OK at position 9");
  ASSERT_TRUE(raw_->Command({"HINCRBY", key, "ver", "1"}).ok());
  const Refusal moved = Refused([&] { return one->CheckinAndWait(*id, State(12)); });
  EXPECT_EQ(moved.status.code(), absl::StatusCode::kAborted) << moved.status;
  EXPECT_THAT(std::string(moved.status.message()), HasSubstr("from version 2 to 3"));
  EXPECT_THAT(moved.log, HasSubstr("from version 2 to 3"));
  EXPECT_EQ(raw_->Command({"HGET", key, "blob"})->str, at_2) << "nothing written";
}

TEST_F(RedisSessionStoreTest, AStateStoredWithoutItsIdIsRefusedAskingForANewSession) {
  auto one = Replica();
  auto id = one->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  // What servers before the binding stored: the blob ExportSession returns, authentic but bound to
  // no session id, so it could be any of its owner's sessions.
  const std::string exported =
      codec_->Encode(State(7), ModelIdentity{&lm_.config(), std::string(32, 'w')}, "alice");
  ASSERT_TRUE(raw_->Command({"HSET", "tost:s:" + *id, "blob", exported}).ok());
  absl::StatusOr<GenerationState> read;
  const Refusal old = Refused([&] {
    read = Replica()->Get(*id, "alice");
    return read.status();
  });
  EXPECT_EQ(old.status.code(), absl::StatusCode::kDataLoss) << Position(read);
  EXPECT_THAT(std::string(old.status.message()), HasSubstr("create the session again"));
  EXPECT_THAT(old.log, HasSubstr("create the session again"));
}

TEST_F(RedisSessionStoreTest, IdleSessionsExpireThroughTheStoresTtl) {
  auto a = Replica(Lease(absl::Milliseconds(100)), IdleTimeout(absl::Milliseconds(400)));
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  auto ttl = raw_->Command({"PTTL", "tost:s:" + *id});
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 400);
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_EQ(a->Get(*id, "alice").status().code(), absl::StatusCode::kNotFound);
}

// Session options with alice's quotas as a tenants file would set them, refused in the ledger's
// words (TenantLedger::CheckSessions); bob has none.
service::SessionStoreOptions AliceQuota(std::optional<int64_t> max_sessions,
                                        std::optional<int64_t> max_bytes,
                                        absl::Duration idle = absl::Minutes(30)) {
  service::SessionStoreOptions o = IdleTimeout(idle);
  o.owner_limits = [=](const std::string& owner) {
    service::OwnerSessionLimits l;
    if (owner == "alice") l = {max_sessions, max_bytes};
    return l;
  };
  o.owner_quota = [=](const std::string& owner, int64_t held, int64_t held_bytes,
                      int64_t new_bytes) -> absl::Status {
    if (owner != "alice") return absl::OkStatus();
    if (max_sessions.has_value() && held >= *max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("quota max_sessions=", *max_sessions, " reached (", held, " held)"));
    }
    if (max_bytes.has_value() && held_bytes + new_bytes > *max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("quota max_session_bytes=", *max_bytes, " reached (", held_bytes, " held)"));
    }
    return absl::OkStatus();
  };
  return o;
}

// Two replicas count an owner's sessions in the store, not each its own: the quota holds over
// both, room comes back when a session is closed on either, and other owners are not limited.
TEST_F(RedisSessionStoreTest, AnOwnersSessionQuotaHoldsAcrossReplicas) {
  auto a = Replica({}, AliceQuota(2, std::nullopt));
  auto b = Replica({}, AliceQuota(2, std::nullopt));
  auto first = a->Add("alice", State(3));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(b->Add("alice", State(3)).ok());
  for (auto* replica : {a.get(), b.get()}) {
    auto third = replica->Add("alice", State(3));
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
    EXPECT_THAT(std::string(third.status().message()),
                HasSubstr("quota max_sessions=2 reached (2"));
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Add("bob", State(1)).ok());
  // Used and written back on the other replica, the session still counts once.
  ASSERT_TRUE(b->Checkout(*first, "alice").ok());
  ASSERT_TRUE(b->CheckinAndWait(*first, State(5)).ok());
  EXPECT_EQ(a->Add("alice", State(3)).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(b->Close(*first, "alice").ok());
  auto again = a->Add("alice", State(3));
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(b->Add("alice", State(3)).status().code(), absl::StatusCode::kResourceExhausted);
}

// The quota on bytes counts the states' sizes, updated by each check-in.
TEST_F(RedisSessionStoreTest, AnOwnersSessionBytesQuotaCountsEveryStatesSize) {
  const int64_t one = static_cast<int64_t>(State(3).ByteSize());
  auto a = Replica({}, AliceQuota(std::nullopt, 2 * one + one / 2));
  auto b = Replica({}, AliceQuota(std::nullopt, 2 * one + one / 2));
  auto first = a->Add("alice", State(3));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(b->Add("alice", State(3)).ok());
  auto third = b->Add("alice", State(3));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr(absl::StrCat("quota max_session_bytes=", 2 * one + one / 2, " reached (",
                                     2 * one, " held)")));
  // A state that grew is counted at its new size.
  GenerationState grown = State(4);
  grown.held_text = std::string(static_cast<size_t>(one), 'x');
  ASSERT_TRUE(b->Checkout(*first, "alice").ok());
  ASSERT_TRUE(b->CheckinAndWait(*first, grown).ok());
  const int64_t grown_bytes = static_cast<int64_t>(grown.ByteSize());
  auto index = raw_->Command({"HGET", "tost:o:" + OwnerDigestForTest("alice"), *first});
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->str, absl::StrCat(grown_bytes));
}

// Replicas racing for an owner's last places get exactly as many as the quota allows.
TEST_F(RedisSessionStoreTest, ReplicasRacingForAnOwnersLastSessionsPlaceExactlyTheQuota) {
  std::vector<std::unique_ptr<RedisSessionStore>> replicas;
  for (int i = 0; i < 4; ++i) replicas.push_back(Replica({}, AliceQuota(3, std::nullopt)));
  std::atomic<int> added{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 12; ++i) {
    threads.emplace_back([&, i] {
      auto id = replicas[i % 4]->Add("alice", State(2));
      if (id.ok()) {
        ++added;
      } else if (id.status().code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(added.load(), 3);
  EXPECT_EQ(refused.load(), 9);
}

// A session that expires through the store's TTL gives its room back with no replica's help, and
// the owner's index expires with its sessions.
TEST_F(RedisSessionStoreTest, AnExpiredSessionGivesItsRoomBackAndTheIndexExpiresWithIt) {
  const auto sessions = AliceQuota(1, std::nullopt, absl::Seconds(1));
  auto a = Replica(Lease(absl::Milliseconds(100)), sessions);
  auto b = Replica(Lease(absl::Milliseconds(100)), sessions);
  ASSERT_TRUE(a->Add("alice", State(3)).ok());
  EXPECT_EQ(b->Add("alice", State(3)).status().code(), absl::StatusCode::kResourceExhausted);
  absl::SleepFor(absl::Milliseconds(1300));
  auto id = b->Add("alice", State(3));
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string index = "tost:o:" + OwnerDigestForTest("alice");
  auto ttl = raw_->Command({"PTTL", index});
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 1000);
  // A read extends the session's life, and the index's with it.
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_TRUE(a->Get(*id, "alice").ok());
  absl::SleepFor(absl::Milliseconds(600));
  auto exists = raw_->Command({"EXISTS", index});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->integer, 1);
  EXPECT_EQ(a->Add("alice", State(3)).status().code(), absl::StatusCode::kResourceExhausted);
  absl::SleepFor(absl::Milliseconds(1500));
  exists = raw_->Command({"EXISTS", index});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->integer, 0);
}

TEST_F(RedisSessionStoreTest, StoreDownIsUnavailableWithinTheTimeoutNamingTheStore) {
  auto a = Replica();
  auto id = a->Add("alice", State(3));
  ASSERT_TRUE(id.ok());
  redis_->Pause();
  absl::Time start = absl::Now();
  auto add = a->Add("alice", State(1));
  EXPECT_EQ(add.status().code(), absl::StatusCode::kUnavailable);
  const std::string where = "127.0.0.1:" + std::to_string(redis_->port());
  EXPECT_THAT(std::string(add.status().message()),
              HasSubstr("the session store (--session_store)"));
  EXPECT_THAT(std::string(add.status().message()), Not(HasSubstr(where)));
  EXPECT_THAT(ServerDetail(add.status()), HasSubstr(where));  // for the log
  EXPECT_EQ(a->Checkout(*id, "alice").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  redis_->Resume();
  auto s = a->Checkout(*id, "alice");
  ASSERT_TRUE(s.ok()) << s.status();

  // A check-in while the store is down fails (UNAVAILABLE); the session stays at its old state.
  redis_->Pause();
  const absl::Status lost = a->CheckinAndWait(*id, State(8));
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  redis_->Resume();
  EXPECT_EQ(a->stats().busy, 0);
}

TEST(RedisSessionStoreOptions, RefusesALeaseLongerThanTheIdleTimeoutAndBadFlags) {
  const service::SessionStoreOptions sessions = IdleTimeout(absl::Seconds(5));
  EXPECT_TRUE(ValidateRedisSessionStoreOptions(Lease(absl::Seconds(5)), sessions).ok());
  EXPECT_FALSE(ValidateRedisSessionStoreOptions(Lease(absl::Seconds(6)), sessions).ok());
  EXPECT_FALSE(ValidateRedisSessionStoreOptions(Lease(absl::Milliseconds(10)), sessions).ok());
  SharedStoreFlags no_host;
  no_host.url = "redis://";
  EXPECT_FALSE(MakeSharedStoreFactories(no_host).ok());
  SharedStoreFlags memory_with_password;
  memory_with_password.password_file = "/x";
  EXPECT_FALSE(MakeSharedStoreFactories(memory_with_password).ok());
  auto memory = MakeSharedStoreFactories({});
  ASSERT_TRUE(memory.ok());
  EXPECT_FALSE(static_cast<bool>(memory->sessions));
  EXPECT_FALSE(static_cast<bool>(memory->prefix_tier));
  SharedStoreFlags shared;
  shared.url = "redis://127.0.0.1:1/0";
  auto redis = MakeSharedStoreFactories(shared);
  ASSERT_TRUE(redis.ok()) << redis.status();
  EXPECT_TRUE(static_cast<bool>(redis->sessions));
  EXPECT_TRUE(static_cast<bool>(redis->prefix_tier));
}

}  // namespace
}  // namespace tost::store
