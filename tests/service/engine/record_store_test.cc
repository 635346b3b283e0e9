// The in-memory record store (stored responses, conversations) on a FakeClock: owners, versions,
// expiry from the last write, and the byte budget.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/engine/clock.h"
#include "service/engine/memory_record_store.h"
#include "service/engine/record_store.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;

RecordStoreOptions Options(absl::Duration ttl = absl::Hours(1), int64_t max_bytes = 1 << 20,
                           int64_t max_record_bytes = 1 << 16) {
  RecordStoreOptions o;
  o.ttl = ttl;
  o.max_bytes = max_bytes;
  o.max_record_bytes = max_record_bytes;
  return o;
}

TEST(MemoryRecordStore, CreateGetReplaceDelete) {
  FakeClock clock;
  MemoryRecordStore store(Options(), &clock);
  ASSERT_TRUE(store.Create("resp_1", "alice", "first").ok());
  auto got = store.Get("resp_1", "alice");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data, "first");
  EXPECT_EQ(got->version, 1);

  auto v2 = store.Replace("resp_1", "alice", 1, "second");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(*v2, 2);
  got = store.Get("resp_1", "alice");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->data, "second");
  EXPECT_EQ(got->version, 2);
  EXPECT_EQ(store.stats().records, 1);
  EXPECT_EQ(store.stats().bytes, static_cast<int64_t>(std::string("resp_1alicesecond").size()));

  ASSERT_TRUE(store.Delete("resp_1", "alice").ok());
  EXPECT_EQ(store.Get("resp_1", "alice").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Delete("resp_1", "alice").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Replace("resp_1", "alice", 2, "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.stats().records, 0);
  EXPECT_EQ(store.stats().bytes, 0);
}

TEST(MemoryRecordStore, AnIdIsCreatedOnce) {
  FakeClock clock;
  MemoryRecordStore store(Options(), &clock);
  ASSERT_TRUE(store.Create("resp_1", "alice", "a").ok());
  const absl::Status again = store.Create("resp_1", "bob", "b");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("resp_1"));
  EXPECT_EQ(store.Get("resp_1", "alice")->data, "a");
}

TEST(MemoryRecordStore, AnotherOwnerSeesWhatAnUnknownIdGets) {
  FakeClock clock;
  MemoryRecordStore store(Options(), &clock);
  ASSERT_TRUE(store.Create("resp_1", "alice", "a").ok());
  const absl::Status unknown = store.Get("resp_2", "bob").status();
  const absl::Status other = store.Get("resp_1", "bob").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  // The same words, but for the id: nothing tells bob that resp_1 exists.
  EXPECT_EQ(std::string(other.message()), std::string(RecordNotFound("resp_1").message()));
  EXPECT_EQ(std::string(unknown.message()), std::string(RecordNotFound("resp_2").message()));
  EXPECT_EQ(store.Replace("resp_1", "bob", 1, "b").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(store.Delete("resp_1", "bob"), RecordNotFound("resp_1"));
  auto mine = store.Get("resp_1", "alice");
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->data, "a");
  EXPECT_EQ(mine->version, 1);
}

TEST(MemoryRecordStore, AReplaceFromAStaleVersionIsAborted) {
  FakeClock clock;
  MemoryRecordStore store(Options(), &clock);
  ASSERT_TRUE(store.Create("conv_1", "alice", "turn 1").ok());
  // Two requests read version 1; the first to write wins.
  ASSERT_EQ(*store.Replace("conv_1", "alice", 1, "turn 2 (first)"), 2);
  auto late = store.Replace("conv_1", "alice", 1, "turn 2 (second)");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_THAT(std::string(late.status().message()),
              HasSubstr("changed by another request: expected version 1, it is at version 2"));
  EXPECT_EQ(store.Get("conv_1", "alice")->data, "turn 2 (first)");
  EXPECT_EQ(*store.Replace("conv_1", "alice", 2, "turn 3"), 3);
}

TEST(MemoryRecordStore, RecordsExpireTtlAfterTheirLastWriteNotTheirLastRead) {
  FakeClock clock;
  MemoryRecordStore store(Options(absl::Minutes(10)), &clock);
  ASSERT_TRUE(store.Create("resp_1", "alice", "a").ok());
  clock.Advance(absl::Minutes(6));
  ASSERT_TRUE(store.Get("resp_1", "alice").ok());  // a read: the expiry stays
  ASSERT_TRUE(store.Create("resp_2", "alice", "b").ok());
  clock.Advance(absl::Minutes(4) - absl::Milliseconds(1));
  ASSERT_TRUE(store.Get("resp_1", "alice").ok());
  clock.Advance(absl::Milliseconds(1));  // 10 minutes after its write
  EXPECT_EQ(store.Get("resp_1", "alice").status(), RecordNotFound("resp_1"));
  EXPECT_EQ(store.stats().records, 1) << "the expired record was dropped when asked for";

  // A write restarts the clock.
  ASSERT_EQ(*store.Replace("resp_2", "alice", 1, "b2"), 2);
  clock.Advance(absl::Minutes(9));
  EXPECT_TRUE(store.Get("resp_2", "alice").ok());
  clock.Advance(absl::Minutes(1));
  EXPECT_EQ(store.Replace("resp_2", "alice", 2, "b3").status().code(), absl::StatusCode::kNotFound);
  // An expired id may be created again (by anyone: it is gone).
  EXPECT_TRUE(store.Create("resp_2", "bob", "new").ok());
  EXPECT_EQ(store.stats().evicted, 0) << "expiry is not eviction";
}

TEST(MemoryRecordStore, ReapExpiredDropsOnlyExpiredRecords) {
  FakeClock clock;
  MemoryRecordStore store(Options(absl::Minutes(10)), &clock);
  ASSERT_TRUE(store.Create("a", "u", "1").ok());
  clock.Advance(absl::Minutes(2));
  ASSERT_TRUE(store.Create("b", "u", "2").ok());
  ASSERT_TRUE(store.Create("c", "u", "3").ok());
  clock.Advance(absl::Minutes(2));
  ASSERT_EQ(*store.Replace("a", "u", 1, "1'"), 2);  // now the last written
  clock.Advance(absl::Minutes(8));                  // b and c are 10 minutes old, a 8
  store.ReapExpired();
  EXPECT_EQ(store.stats().records, 1);
  EXPECT_EQ(store.stats().bytes, 4);  // "a" "u" "1'"
  EXPECT_TRUE(store.Get("a", "u").ok());
  clock.Advance(absl::Minutes(2));
  store.ReapExpired();
  EXPECT_EQ(store.stats().records, 0);
  EXPECT_EQ(store.stats().bytes, 0);
  EXPECT_EQ(store.stats().evicted, 0);
  store.ReapExpired();  // nothing left: nothing to do
}

TEST(MemoryRecordStore, TheLeastRecentlyUsedAreEvictedToFitTheByteBudget) {
  FakeClock clock;
  // Each record below is 1 + 1 + 8 = 10 bytes; room for three.
  MemoryRecordStore store(Options(absl::Hours(1), /*max_bytes=*/30, /*max_record_bytes=*/28),
                          &clock);
  ASSERT_TRUE(store.Create("a", "u", "aaaaaaaa").ok());
  ASSERT_TRUE(store.Create("b", "u", "bbbbbbbb").ok());
  ASSERT_TRUE(store.Create("c", "u", "cccccccc").ok());
  EXPECT_EQ(store.stats().bytes, 30);
  ASSERT_TRUE(store.Get("a", "u").ok());  // a is used: b is now the least recently used
  ASSERT_TRUE(store.Create("d", "u", "dddddddd").ok());
  EXPECT_EQ(store.stats().evicted, 1);
  EXPECT_EQ(store.Get("b", "u").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Get("a", "u").ok());
  EXPECT_TRUE(store.Get("c", "u").ok());
  EXPECT_TRUE(store.Get("d", "u").ok());

  // A Replace that grows makes room from the others, never from itself.
  auto grown = store.Replace("c", "u", 1, std::string(28, 'C'));  // 30 bytes: a and d must go
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(store.stats().evicted, 3);
  EXPECT_EQ(store.stats().records, 1);
  EXPECT_EQ(store.stats().bytes, 30);
  EXPECT_EQ(store.Get("c", "u")->data, std::string(28, 'C'));
  // One that shrinks evicts nothing.
  ASSERT_TRUE(store.Replace("c", "u", 2, "c").ok());
  EXPECT_EQ(store.stats().bytes, 3);
  EXPECT_EQ(store.stats().evicted, 3);
}

TEST(MemoryRecordStore, ExpiredRecordsMakingRoomAreNotCountedAsEvicted) {
  FakeClock clock;
  MemoryRecordStore store(Options(absl::Minutes(1), /*max_bytes=*/20, /*max_record_bytes=*/20),
                          &clock);
  ASSERT_TRUE(store.Create("a", "u", "aaaaaaaa").ok());
  ASSERT_TRUE(store.Create("b", "u", "bbbbbbbb").ok());
  clock.Advance(absl::Minutes(1));
  ASSERT_TRUE(store.Create("c", "u", "cccccccc").ok());
  EXPECT_EQ(store.stats().evicted, 0);
  EXPECT_EQ(store.stats().records, 2);
}

TEST(MemoryRecordStore, OversizedDataIsRefusedAndChangesNothing) {
  FakeClock clock;
  MemoryRecordStore store(Options(absl::Hours(1), /*max_bytes=*/100, /*max_record_bytes=*/50),
                          &clock);
  const absl::Status big = store.Create("a", "u", std::string(51, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_THAT(std::string(big.message()), HasSubstr("at most 50 bytes, got 51"));
  EXPECT_EQ(store.stats().records, 0);

  // The data fits its limit, but with its id and owner the record outgrows the whole store.
  MemoryRecordStore tight(Options(absl::Hours(1), /*max_bytes=*/52, /*max_record_bytes=*/50),
                          &clock);
  const absl::Status whole = tight.Create("id", "owner", std::string(50, 'x'));
  EXPECT_EQ(whole.code(), absl::StatusCode::kResourceExhausted) << whole;
  EXPECT_THAT(std::string(whole.message()), HasSubstr("--response_store_max_bytes=52"));

  ASSERT_TRUE(store.Create("a", "u", "small").ok());
  EXPECT_EQ(store.Replace("a", "u", 1, std::string(51, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto kept = store.Get("a", "u");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->data, "small");
  EXPECT_EQ(kept->version, 1);
}

TEST(RecordStoreOptions, ValidationNamesTheFlag) {
  EXPECT_TRUE(ValidateRecordStoreOptions(RecordStoreOptions{}).ok());
  const absl::Status ttl = ValidateRecordStoreOptions(Options(absl::ZeroDuration()));
  EXPECT_EQ(ttl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ttl.message()), HasSubstr("--response_ttl_s"));
  const absl::Status bytes = ValidateRecordStoreOptions(Options(absl::Hours(1), 0, 0));
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("--response_store_max_bytes"));
  EXPECT_FALSE(ValidateRecordStoreOptions(Options(absl::Hours(1), 100, 0)).ok());
  EXPECT_FALSE(ValidateRecordStoreOptions(Options(absl::Hours(1), 100, 101)).ok());
  EXPECT_TRUE(ValidateRecordStoreOptions(Options(absl::Hours(1), 100, 100)).ok());
}

}  // namespace
}  // namespace tost::service
