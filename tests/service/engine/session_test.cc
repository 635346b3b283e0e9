// Session state plumbing: text release rules, the session store, and the authenticated blob codec.
#include <gtest/gtest.h>

#include "service/engine/clock.h"
#include "service/engine/session_codec.h"
#include "service/engine/session_store.h"
#include "service/engine/text_stream.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

TEST(TextStream, HoldsBackPossibleStopStringsAndCutsAtTheFirstMatch) {
  TextStream t({"END", "\n\n"});
  EXPECT_EQ(t.Push("Hello ").text, "Hello ");
  EXPECT_EQ(t.Push("E").text, "");  // may become END
  EXPECT_EQ(t.Push("N").text, "");
  auto out = t.Push("X");
  EXPECT_EQ(out.text, "ENX");
  EXPECT_FALSE(out.stop_matched);
  EXPECT_EQ(t.Push("a\n").text, "a");
  out = t.Push("\nrest");
  EXPECT_TRUE(out.stop_matched);
  EXPECT_EQ(out.text, "");
}

TEST(TextStream, StateRoundTripsThroughItsParts) {
  TextStream a({"STOP"});
  a.Push("x");
  a.Push("ST");
  ASSERT_EQ(a.held(), "ST");
  a.Push("\xE2\x82");  // an incomplete euro sign
  ASSERT_EQ(a.utf8_pending(), "\xE2\x82");
  TextStream b({"STOP"}, a.utf8_pending(), a.held());
  const auto from_parts = b.Push("\xAC");
  const auto original = a.Push("\xAC");
  EXPECT_EQ(from_parts.text, "ST\xE2\x82\xAC");
  EXPECT_EQ(from_parts.text, original.text);
}

TEST(TextStream, FlushReleasesEverything) {
  TextStream t({"abc"});
  t.Push("xab");
  t.Push("\xF0\x9F");
  EXPECT_EQ(t.Flush(), "ab\xEF\xBF\xBD");
}

GenerationState SmallState(const std::string& model, int64_t floats) {
  GenerationState s;
  s.model = model;
  s.sequence.stats.assign(floats, 0.5f);
  s.sequence.position = 17;
  s.pending_token = 65;
  s.sampling.seed = 99;
  s.sampling.temperature = 0.7f;
  s.stop_strings = {"\n\n"};
  s.recent_tokens = {1, 2, 3};
  s.held_text = "\n";
  s.utf8_pending = "\xE2";
  return s;
}

TEST(SessionStore, OwnershipBusyAndCheckin) {
  FakeClock clock;
  SessionStore store({}, &clock);
  auto id = store.Add("alice", SmallState("m", 8));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 32u);  // 128 random bits, hex
  EXPECT_EQ(store.Checkout(*id, "bob").status().code(), absl::StatusCode::kNotFound);
  auto st = store.Checkout(*id, "alice");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(store.Checkout(*id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Get(*id, "alice").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Close(*id, "alice").code(), absl::StatusCode::kFailedPrecondition);
  st->sequence.position = 40;
  store.Checkin(*id, *st);
  EXPECT_EQ(store.Get(*id, "alice")->sequence.position, 40);
  EXPECT_TRUE(store.Close(*id, "alice").ok());
  EXPECT_EQ(store.stats().sessions, 0);
  EXPECT_EQ(store.stats().state_bytes, 0);
}

TEST(SessionStore, EvictsLeastRecentlyUsedIdleSessionsToFit) {
  FakeClock clock;
  const int64_t one = static_cast<int64_t>(SmallState("m", 8).ByteSize());
  SessionStore store({.max_sessions = 3, .max_state_bytes = 100 * one}, &clock);
  auto a = store.Add("u", SmallState("m", 8));
  auto b = store.Add("u", SmallState("m", 8));
  auto c = store.Add("u", SmallState("m", 8));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(store.Get(*a, "u").ok());  // a is now the most recent; b the least
  auto busy = store.Checkout(*c, "u");
  ASSERT_TRUE(busy.ok());
  auto d = store.Add("u", SmallState("m", 8));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(store.Get(*b, "u").status().code(), absl::StatusCode::kNotFound);  // evicted
  EXPECT_TRUE(store.Get(*a, "u").ok());
  EXPECT_EQ(store.stats().evicted_lru, 1);
  EXPECT_EQ(store.stats().state_bytes, 3 * one);

  // Byte budget: a store that fits two states refuses a third while both are busy.
  SessionStore small({.max_sessions = 10, .max_state_bytes = 2 * one}, &clock);
  auto x = small.Add("u", SmallState("m", 8));
  auto y = small.Add("u", SmallState("m", 8));
  ASSERT_TRUE(small.Checkout(*x, "u").ok() && small.Checkout(*y, "u").ok());
  auto z = small.Add("u", SmallState("m", 8));
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(z.status().message().find("retry"), std::string::npos);
}

TEST(SessionStore, IdleSessionsExpireOnTheInjectedClock) {
  FakeClock clock;
  SessionStore store({.idle_timeout = absl::Minutes(5)}, &clock);
  auto a = store.Add("u", SmallState("m", 8));
  auto b = store.Add("u", SmallState("m", 8));
  clock.Advance(absl::Minutes(4));
  ASSERT_TRUE(store.Get(*b, "u").ok());  // touched
  clock.Advance(absl::Minutes(1));
  store.ReapIdle();
  EXPECT_EQ(store.Get(*a, "u").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.Get(*b, "u").ok());
  EXPECT_EQ(store.stats().evicted_idle, 1);
}

class SessionCodecTest : public ::testing::Test {
 protected:
  const testing::FakeLanguageModel lm;
  const model::ModelConfig& config = lm.config();
  ModelIdentity identity{&config, std::string(32, 'h')};
  int64_t floats() const { return static_cast<int64_t>(lm.NewSequence().stats.size()); }
};

TEST_F(SessionCodecTest, RoundTripsEveryField) {
  auto codec = SessionCodec::Create("0123456789abcdef-secret");
  ASSERT_TRUE(codec.ok());
  GenerationState s = SmallState(config.name, floats());
  s.sequence.stats[3] = -1.25f;
  s.stop_token_ids = {10};
  const std::string blob = codec->Encode(s, identity);
  auto back = codec->Decode(blob, identity);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sequence.stats, s.sequence.stats);
  EXPECT_EQ(back->sequence.position, 17);
  EXPECT_EQ(back->pending_token, 65);
  EXPECT_EQ(back->sampling.seed, 99u);
  EXPECT_EQ(back->sampling.temperature, 0.7f);
  EXPECT_EQ(back->stop_strings, s.stop_strings);
  EXPECT_EQ(back->stop_token_ids, s.stop_token_ids);
  EXPECT_EQ(back->recent_tokens, s.recent_tokens);
  EXPECT_EQ(back->held_text, "\n");
  EXPECT_EQ(back->utf8_pending, "\xE2");
  EXPECT_EQ(*codec->PeekModel(blob), config.name);
}

TEST_F(SessionCodecTest, RefusesTamperedTruncatedForeignAndMismatchedBlobs) {
  auto codec = SessionCodec::Create("0123456789abcdef-secret");
  ASSERT_TRUE(codec.ok());
  const std::string blob = codec->Encode(SmallState(config.name, floats()), identity);
  for (size_t i = 0; i < blob.size(); i += 7) {  // flip one bit at a time across the blob
    std::string bad = blob;
    bad[i] ^= 0x10;
    EXPECT_EQ(codec->Decode(bad, identity).status().code(), absl::StatusCode::kInvalidArgument)
        << "byte " << i;
  }
  for (size_t len : {size_t{0}, size_t{10}, blob.size() / 2, blob.size() - 1}) {
    auto r = codec->Decode(blob.substr(0, len), identity);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << len;
  }
  auto other_key = SessionCodec::Create("another-secret-key-0000");
  auto foreign = other_key->Decode(blob, identity);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("another session key"), std::string::npos);
  ModelIdentity other_weights{identity.config, std::string(32, 'x')};
  auto mismatch = codec->Decode(blob, other_weights);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.status().message().find("weights"), std::string::npos);
  EXPECT_FALSE(SessionCodec::Create("short").ok());
}

TEST_F(SessionCodecTest, RefusesBlobsOfAnotherModelOrOtherDimensions) {
  auto codec = SessionCodec::Create("0123456789abcdef-secret");
  ASSERT_TRUE(codec.ok());
  const std::string blob = codec->Encode(SmallState(config.name, floats()), identity);

  const testing::FakeLanguageModel other({.name = "other-lm"});
  auto foreign = codec->Decode(blob, {&other.config(), identity.weights_sha256});
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(foreign.status().message().find("\"other-lm\""), std::string::npos) << foreign.status();

  const testing::FakeLanguageModel wider({.n_embd = 8});
  auto mismatch = codec->Decode(blob, {&wider.config(), identity.weights_sha256});
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.status().message().find("dimensions"), std::string::npos) << mismatch.status();
}

}  // namespace
}  // namespace tost::service
