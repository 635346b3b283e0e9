// The session store's byte budget holds when a session comes back bigger than it left (its held
// text or repetition window grew during a Generate), not only when sessions are added.
#include <string>

#include <gtest/gtest.h>

#include "service/engine/clock.h"
#include "service/engine/memory_session_store.h"

namespace tost::service {
namespace {

GenerationState StateOf(size_t held_bytes) {
  GenerationState s;
  s.model = "m";
  s.sequence.stats.assign(8, 0.f);
  s.held_text.assign(held_bytes, 'x');
  return s;
}

TEST(SessionStoreBudget, ACheckinThatGrowsEvictsIdleSessionsToStayInBudget) {
  FakeClock clock;
  const auto bytes = [](size_t held) { return static_cast<int64_t>(StateOf(held).ByteSize()); };
  // Room for three small sessions, or one grown one and one small.
  MemorySessionStore store({.max_sessions = 10, .max_state_bytes = 3 * bytes(0) + 8}, &clock);
  auto a = store.Add("u", StateOf(0));
  auto b = store.Add("u", StateOf(0));
  auto c = store.Add("u", StateOf(0));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto st = store.Checkout(*c, "u");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(
      store.CheckinAndWait(*c, StateOf(bytes(0) - 16)).ok());  // grew by about one small session
  EXPECT_LE(store.stats().state_bytes, store.options().max_state_bytes);
  EXPECT_EQ(store.stats().evicted_lru, 1);
  EXPECT_EQ(store.Get(*a, "u").status().code(), absl::StatusCode::kNotFound)
      << "the least recently used idle session made room";
  EXPECT_TRUE(store.Get(*b, "u").ok());
  EXPECT_EQ(store.Get(*c, "u")->held_text.size(), static_cast<size_t>(bytes(0) - 16));
}

}  // namespace
}  // namespace tost::service
