// The tenants file and the API-keys file's tenant fields: what they accept, and the refusal of
// each bad line naming the file, the line and the field.
#include "service/engine/tenants.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "service/engine/memory_session_store.h"
#include "service/engine/tenant_ledger.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;

TEST(TenantsTest, ParsesWeightsAndQuotas) {
  auto t = TenantTable::Parse(
      "# tenants\n"
      "alpha weight=3 max_concurrent=8 tokens_per_minute=60000\n"
      "\n"
      "tls:client-b max_sessions=10 max_session_bytes=1048576\n"
      "anonymous weight=0.5\n",
      "tenants.txt", TenantLineForm::kTenantsFile);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->tenants().size(), 3u);
  EXPECT_EQ(t->Weight("alpha"), 3.0);
  EXPECT_EQ(t->Find("alpha")->quotas.max_concurrent, 8);
  EXPECT_EQ(t->Find("alpha")->quotas.tokens_per_minute, 60000);
  EXPECT_FALSE(t->Find("alpha")->quotas.max_sessions.has_value());
  EXPECT_EQ(t->Find("tls:client-b")->quotas.max_session_bytes, 1048576);
  EXPECT_EQ(t->Weight("anonymous"), 0.5);
  EXPECT_EQ(t->Weight("unnamed"), 1.0);
  EXPECT_EQ(t->Find("unnamed"), nullptr);
}

TEST(TenantsTest, ApiKeysLinesCarryTenantFieldsAfterTheKey) {
  auto t = TenantTable::Parse("alpha 0123456789abcdef0123 weight=2\nbeta fedcba9876543210fedc\n",
                              "keys.txt", TenantLineForm::kApiKeysFile);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Weight("alpha"), 2.0);
  EXPECT_EQ(t->Weight("beta"), 1.0);
  EXPECT_EQ(t->Find("beta")->quotas.max_concurrent, std::nullopt);
}

TEST(TenantsTest, RefusesEachBadLineNamingItsLineAndField) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"a\nb\na weight=2\n", "t.txt:3: duplicate tenant \"a\" (first named at t.txt:1)"},
           {"a weight=0\n", "t.txt:1: field weight must be a number in (0, 1000]"},
           {"a weight=-1\n", "t.txt:1: field weight"},
           {"a weight=nan\n", "t.txt:1: field weight"},
           {"a weight=1001\n", "t.txt:1: field weight"},
           {"a weight=heavy\n", "got \"heavy\""},
           {"\n\na max_concurrent=0\n", "t.txt:3: field max_concurrent is 0: a quota of zero"},
           {"a tokens_per_minute=0\n", "field tokens_per_minute is 0"},
           {"a max_sessions=-4\n", "t.txt:1: field max_sessions must be an integer in [1, "},
           {"a max_session_bytes=1e9\n", "field max_session_bytes must be an integer"},
           {"a max_concurrent=99999999999999999999\n", "field max_concurrent must be an integer"},
           {"a max_concurrent=2 max_concurrent=3\n", "field max_concurrent is set twice"},
           {"a\nb highest_priority=high\n",
            "t.txt:2: field highest_priority must be an integer in [-1000000, 1000000]"},
           {"a highest_priority=1000001\n", "got \"1000001\""},
           {"a highest_priority=2.5\n", "field highest_priority must be an integer"},
           {"a highest_priority=1 highest_priority=2\n", "field highest_priority is set twice"},
           {"a speed=3\n", "t.txt:1: unknown field \"speed\""},
           {"a weight\n", "t.txt:1: expected field=value, got \"weight\""},
           {"weight=2\n", "t.txt:1: expected a tenant name before its fields"},
       }) {
    auto t = TenantTable::Parse(c.text, "t.txt", TenantLineForm::kTenantsFile);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.expected)) << c.text;
  }
}

TEST(TenantsTest, MergeRefusesATenantNamedInBothFiles) {
  auto keys = TenantTable::Parse("a 0123456789abcdef0123 weight=2\n", "keys.txt",
                                 TenantLineForm::kApiKeysFile);
  auto tenants = TenantTable::Parse("b\na weight=3\n", "tenants.txt", TenantLineForm::kTenantsFile);
  ASSERT_TRUE(keys.ok() && tenants.ok());
  auto merged = TenantTable::Merge(*keys, *tenants);
  ASSERT_FALSE(merged.ok());
  EXPECT_THAT(merged.status().message(),
              HasSubstr("tenants.txt:2: duplicate tenant \"a\" (first named at keys.txt:1)"));
}

TEST(TenantsTest, PriorityOutsideTheRangeIsRefusedNamingTheField) {
  TenantOptions o;
  o.max_priority = 10;
  FakeClock clock;
  TenantLedger ledger(o, &clock);
  EXPECT_TRUE(ledger.CheckPriority("a", -10).ok());
  EXPECT_TRUE(ledger.CheckPriority("a", 10).ok());
  const absl::Status s = ledger.CheckPriority("a", 11);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("priority must be in [-10, 10]"));
  EXPECT_THAT(s.message(), HasSubstr("got 11"));
  EXPECT_FALSE(ledger.CheckPriority("a", -2147483647 - 1).ok());
  o.max_priority = -1;
  EXPECT_FALSE(ValidateTenantOptions(o).ok());
  o.max_priority = 10;
  o.token_window = absl::ZeroDuration();
  EXPECT_FALSE(ValidateTenantOptions(o).ok());
}

// A tenant's highest_priority is the most urgent priority it may ask for: more urgent is refused,
// naming the tenant, the field and the value, while other tenants keep the whole range.
TEST(TenantsTest, HighestPriorityCapsWhatATenantMayAskFor) {
  auto t = TenantTable::Parse("batch highest_priority=0\nops highest_priority=-5\n", "t.txt",
                              TenantLineForm::kTenantsFile);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Find("batch")->highest_priority, 0);
  EXPECT_EQ(t->Find("ops")->highest_priority, -5);
  TenantOptions o{.table = *t, .max_priority = 10};
  ASSERT_TRUE(ValidateTenantOptions(o).ok());
  FakeClock clock;
  TenantLedger ledger(o, &clock);
  EXPECT_TRUE(ledger.CheckPriority("batch", 0).ok());
  EXPECT_TRUE(ledger.CheckPriority("batch", 10).ok());
  const absl::Status s = ledger.CheckPriority("batch", -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("tenant \"batch\" may ask for priority 0 or higher"));
  EXPECT_THAT(s.message(), HasSubstr("highest_priority=0"));
  EXPECT_THAT(s.message(), HasSubstr("got priority -1"));
  EXPECT_TRUE(ledger.CheckPriority("ops", -5).ok());
  EXPECT_EQ(ledger.CheckPriority("ops", -6).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ledger.CheckPriority("someone-else", -10).ok());
  // Out of --max_priority's range is INVALID_ARGUMENT first, whoever asks.
  EXPECT_EQ(ledger.CheckPriority("batch", -11).code(), absl::StatusCode::kInvalidArgument);

  // A cap outside --max_priority's range stops the start, naming the file, line and tenant.
  o.max_priority = 3;
  const absl::Status bad = ValidateTenantOptions(o);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("t.txt:2: field highest_priority of tenant \"ops\" must be "
                                       "within the priorities calls may ask for, [-3, 3]"));
  EXPECT_THAT(bad.message(), HasSubstr("got -5"));
}

TEST(TenantsTest, TokenWindowRefusalSaysWhenThereIsRoomAgain) {
  auto t = TenantTable::Parse("q tokens_per_minute=100\n", "t", TenantLineForm::kTenantsFile);
  ASSERT_TRUE(t.ok());
  FakeClock clock;
  TenantLedger ledger(TenantOptions{.table = *t}, &clock);
  ASSERT_TRUE(ledger.ChargePrompt("q", 60).ok());
  clock.Advance(absl::Seconds(30));
  ledger.ChargeGenerated("q", 40);
  EXPECT_FALSE(ledger.HasTokenRoom("q"));
  const absl::Status refused = ledger.ChargePrompt("q", 5);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  // The first 60 leave the window a minute (and a bucket, a second) after they came: 31 s on.
  EXPECT_THAT(refused.message(), HasSubstr("quota tokens_per_minute=100 reached (100 tokens"));
  EXPECT_THAT(refused.message(), HasSubstr("retry after about 31001 ms"));
  const absl::Status never = ledger.ChargePrompt("q", 101);
  EXPECT_THAT(never.message(), HasSubstr("can never fit quota tokens_per_minute=100"));
  EXPECT_TRUE(ledger.ChargePrompt("other", 1000000).ok()) << "an unnamed tenant has no quota";
  clock.Advance(absl::Seconds(31));
  EXPECT_TRUE(ledger.HasTokenRoom("q"));
  EXPECT_TRUE(ledger.ChargePrompt("q", 60).ok());
}

// max_sessions and max_session_bytes, held by the in-memory store: a tenant past either is refused
// a new session naming the quota, the others are not, and a closed session gives its room back.
TEST(TenantsTest, SessionQuotasHoldInTheMemoryStore) {
  auto t = TenantTable::Parse("s max_sessions=2\nb max_session_bytes=1000\n", "t",
                              TenantLineForm::kTenantsFile);
  ASSERT_TRUE(t.ok());
  FakeClock clock;
  TenantLedger ledger(TenantOptions{.table = *t}, &clock);
  SessionStoreOptions o;
  o.owner_quota = [&](const std::string& owner, int64_t held, int64_t bytes, int64_t more) {
    return ledger.CheckSessions(owner, held, bytes, more);
  };
  MemorySessionStore store(o, &clock);
  GenerationState state;
  state.sequence.stats.assign(100, 0.f);  // some 400 bytes and the struct's
  auto first = store.Add("s", state);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store.Add("s", state).ok());
  auto third = store.Add("s", state);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("quota max_sessions=2 reached (2 sessions"));
  EXPECT_TRUE(store.Add("other", state).ok());
  ASSERT_TRUE(store.Close(*first, "s").ok());
  EXPECT_TRUE(store.Add("s", state).ok()) << "a closed session gives its room back";
  ASSERT_TRUE(store.Add("b", state).ok());
  auto over = store.Add("b", state);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(over.status().message(), HasSubstr("quota max_session_bytes=1000 reached"));
  const std::vector<TenantUsage> usage = ledger.Usage();
  EXPECT_EQ(usage[0].refusals.at("max_sessions"), 1);
  EXPECT_EQ(usage[1].refusals.at("max_session_bytes"), 1);
}

}  // namespace
}  // namespace tost::service
