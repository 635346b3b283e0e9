// The prefix-state cache's shared tier against a real redis-server: two caches with a tier each on
// one Redis are two replicas.
#include "service/store/redis_prefix_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "service/engine/clock.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/session_codec.h"
#include "tests/service/store/redis_server_fixture.h"

namespace tost::store {
namespace {

using service::PrefixCacheScope;
using service::PrefixStateCache;

class RedisPrefixTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto redis = testing::RedisServerProcess::Start();
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    codec_ = std::make_unique<service::SessionCodec>(
        *service::SessionCodec::Create({"0123456789abcdef-shared-secret"}));
    raw_ = *RedisClient::Create(ClientOptions());
  }

  RedisClientOptions ClientOptions() const {
    RedisClientOptions o;
    o.endpoint.host = "127.0.0.1";
    o.endpoint.port = redis_->port();
    o.connect_timeout = absl::Milliseconds(200);
    o.command_timeout = absl::Milliseconds(200);
    return o;
  }

  std::unique_ptr<RedisPrefixTier> Tier(const service::SessionCodec* codec = nullptr) {
    return std::make_unique<RedisPrefixTier>(codec != nullptr ? codec : codec_.get(),
                                             *RedisClient::Create(ClientOptions()),
                                             RedisPrefixTierOptions{}, &clock_);
  }

  static model::SequenceState StateOf(int64_t position) {
    model::SequenceState s;
    s.position = position;
    s.stats.resize(24);
    std::iota(s.stats.begin(), s.stats.end(), 0.5f * static_cast<float>(position));
    return s;
  }

  // Waits for the entry of `tokens` to reach the store (publishing is asynchronous).
  void AwaitPublished(size_t keys) {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (absl::Now() < deadline) {
      auto n = raw_->Command({"DBSIZE"});
      if (n.ok() && n->integer >= static_cast<int64_t>(keys)) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    FAIL() << "the entry was not published within 3 s";
  }

  std::unique_ptr<testing::RedisServerProcess> redis_;
  std::unique_ptr<service::SessionCodec> codec_;
  std::unique_ptr<RedisClient> raw_;
  service::FakeClock clock_;
  const PrefixCacheScope alice_{"lm", std::string(32, 'w'), "alice"};
  const std::vector<int32_t> prompt_{5, 6, 7, 8, 9, 10, 11, 12};
};

TEST_F(RedisPrefixTierTest, APrefixCachedOnOneReplicaIsAHitOnAnother) {
  auto tier_a = Tier();
  auto tier_b = Tier();
  PrefixStateCache a({});
  PrefixStateCache b({});
  a.SetSharedTier(tier_a.get());
  b.SetSharedTier(tier_b.get());
  a.Insert(alice_, absl::MakeConstSpan(prompt_).first(5), StateOf(5), /*on_grid=*/true);
  AwaitPublished(1);

  b.Prefetch(alice_, prompt_, /*max_tokens=*/7, /*on_grid_only=*/false);
  auto hit = b.Lookup(alice_, prompt_, 7, false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 5);
  EXPECT_TRUE(hit->on_grid);
  EXPECT_EQ(hit->state.stats, StateOf(5).stats);
  EXPECT_EQ(b.stats("lm").shared_hits, 1);

  // Nothing longer in the store than what B holds now: no second fetch is counted.
  b.Prefetch(alice_, prompt_, 7, false);
  EXPECT_EQ(b.stats("lm").shared_hits, 1);
}

TEST_F(RedisPrefixTierTest, OtherScopesAndTooLongOrOffGridEntriesMiss) {
  auto tier = Tier();
  tier->Publish(alice_, absl::MakeConstSpan(prompt_).first(6), StateOf(6), /*on_grid=*/false);
  AwaitPublished(1);
  const PrefixCacheScope bob{"lm", std::string(32, 'w'), "bob"};
  const PrefixCacheScope reloaded{"lm", std::string(32, 'x'), "alice"};
  EXPECT_FALSE(tier->Fetch(bob, prompt_, 0, 7, false).has_value());
  EXPECT_FALSE(tier->Fetch(reloaded, prompt_, 0, 7, false).has_value());
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 0, 5, false).has_value());  // longer than allowed
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 6, 7, false).has_value());  // not longer than held
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 0, 7, /*on_grid_only=*/true).has_value());
  std::vector<int32_t> other = prompt_;
  other[2] = 99;
  EXPECT_FALSE(tier->Fetch(alice_, other, 0, 7, false).has_value());
  auto hit = tier->Fetch(alice_, prompt_, 0, 7, false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 6);
}

TEST_F(RedisPrefixTierTest, RecordsTamperedWithOrSealedByAnotherKeyAreMisses) {
  auto tier = Tier();
  tier->Publish(alice_, absl::MakeConstSpan(prompt_).first(4), StateOf(4), true);
  AwaitPublished(1);
  auto keys = raw_->Command({"KEYS", "tost:p:*"});
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->elements.size(), 1u);
  const std::string key = keys->elements[0].str;
  std::string record = raw_->Command({"GET", key})->str;

  auto other_codec = *service::SessionCodec::Create({"another-key-of-16-bytes-or-more"});
  auto stranger = Tier(&other_codec);
  EXPECT_FALSE(stranger->Fetch(alice_, prompt_, 0, 7, false).has_value());

  record[10] ^= 1;  // one bit of the scope
  ASSERT_TRUE(raw_->Command({"SET", key, record}).ok());
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 0, 7, false).has_value());
  EXPECT_FALSE(tier->Decode(record).has_value());
  EXPECT_FALSE(tier->Decode("").has_value());
}

TEST_F(RedisPrefixTierTest, EncodeDecodeRoundTripsAndRefusesTruncation) {
  auto tier = Tier();
  const std::string record = tier->Encode("scope", prompt_, StateOf(8), true);
  auto back = tier->Decode(record);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->scope_key, "scope");
  EXPECT_EQ(back->tokens, prompt_);
  EXPECT_EQ(back->state.position, 8);
  EXPECT_EQ(back->state.stats, StateOf(8).stats);
  EXPECT_TRUE(back->on_grid);
  EXPECT_FALSE(tier->Decode(record.substr(0, record.size() - 1)).has_value());
}

TEST_F(RedisPrefixTierTest, AStoreThatIsDownCostsOneTimeoutThenIsSkipped) {
  auto tier = Tier();
  redis_->Pause();
  absl::Time start = absl::Now();
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 0, 7, false).has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  start = absl::Now();
  EXPECT_FALSE(tier->Fetch(alice_, prompt_, 0, 7, false).has_value());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(50));  // skipped: no round trip
  redis_->Resume();
  clock_.Advance(absl::Seconds(6));  // past retry_after_failure
  tier->Publish(alice_, absl::MakeConstSpan(prompt_).first(3), StateOf(3), true);
  AwaitPublished(1);
  EXPECT_TRUE(tier->Fetch(alice_, prompt_, 0, 7, false).has_value());
}

}  // namespace
}  // namespace tost::store
