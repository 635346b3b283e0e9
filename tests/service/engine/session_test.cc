// Session state plumbing: text release rules, the session store, and the authenticated blob codec.
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"

#include "service/engine/clock.h"
#include "service/engine/memory_session_store.h"
#include "service/engine/session_codec.h"
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
  MemorySessionStore store({}, &clock);
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
  ASSERT_TRUE(store.CheckinAndWait(*id, *st).ok());
  EXPECT_EQ(store.Get(*id, "alice")->sequence.position, 40);
  EXPECT_TRUE(store.Close(*id, "alice").ok());
  EXPECT_EQ(store.stats().sessions, 0);
  EXPECT_EQ(store.stats().state_bytes, 0);
}

TEST(SessionStore, EvictsLeastRecentlyUsedIdleSessionsToFit) {
  FakeClock clock;
  const int64_t one = static_cast<int64_t>(SmallState("m", 8).ByteSize());
  MemorySessionStore store({.max_sessions = 3, .max_state_bytes = 100 * one}, &clock);
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
  MemorySessionStore small({.max_sessions = 10, .max_state_bytes = 2 * one}, &clock);
  auto x = small.Add("u", SmallState("m", 8));
  auto y = small.Add("u", SmallState("m", 8));
  ASSERT_TRUE(small.Checkout(*x, "u").ok() && small.Checkout(*y, "u").ok());
  auto z = small.Add("u", SmallState("m", 8));
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(z.status().message().find("retry"), std::string::npos);
}

TEST(SessionStore, ADrainingStoreAddsNothingButKeepsWhatItHolds) {
  FakeClock clock;
  MemorySessionStore store({}, &clock);
  auto held = store.Add("u", SmallState("m", 8));
  ASSERT_TRUE(held.ok());
  store.StopAdding();
  auto late = store.Add("u", SmallState("m", 8));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(late.status().message().find("another replica"), std::string::npos);
  EXPECT_EQ(store.stats().sessions, 1);
  // The sessions it holds can still leave by export, and a Generate can still check one in.
  EXPECT_TRUE(store.Get(*held, "u").ok());
  auto st = store.Checkout(*held, "u");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(store.CheckinAndWait(*held, *st).ok());
  EXPECT_TRUE(store.Close(*held, "u").ok());
}

TEST(SessionStore, IdleSessionsExpireOnTheInjectedClock) {
  FakeClock clock;
  MemorySessionStore store({.idle_timeout = absl::Minutes(5)}, &clock);
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
  static constexpr char kKey[] = "0123456789abcdef-secret";
  const testing::FakeLanguageModel lm;
  const model::ModelConfig& config = lm.config();
  ModelIdentity identity{&config, std::string(32, 'h')};
  FakeClock clock;
  int64_t floats() const { return static_cast<int64_t>(lm.NewSequence().stats.size()); }
  SessionCodec Codec(std::vector<std::string> keys, absl::Duration ttl = absl::ZeroDuration()) {
    auto codec = SessionCodec::Create(std::move(keys), {.ttl = ttl, .clock = &clock});
    EXPECT_TRUE(codec.ok()) << codec.status();
    return *std::move(codec);
  }
  std::string Blob(const SessionCodec& codec, const std::string& caller = kAnonymousCaller) {
    return codec.Encode(SmallState(config.name, floats()), identity, caller);
  }
};

// A version 1 blob as the codec wrote it before owners and expiry existed: SmallState of the fake
// model, signed with kKey. Kept as bytes so that what old servers exported stays readable.
std::string VersionOneBlob() {
  return absl::HexStringToBytes(
      "544f53545345535301000000ba0000000a0766616b652d6c6d122068686868686868686868686868686868686868"
      "6868686868686868686868686818022004280230840238800440114a500000003f0000003f0000003f0000003f00"
      "00003f0000003f0000003f0000003f0000003f0000003f0000003f0000003f0000003f0000003f0000003f000000"
      "3f0000003f0000003f0000003f0000003f50415a130d3333333f1d0000803f2d0000803f3040386362020a0a7203"
      "0102037a01e28201010a9001b2bec2bfa034c56b7c5c264c41a5b23d704bc4dc53e75629fde457851a4807eef316"
      "5683fb61");
}

TEST_F(SessionCodecTest, RoundTripsEveryField) {
  auto codec = SessionCodec::Create({kKey});
  ASSERT_TRUE(codec.ok());
  GenerationState s = SmallState(config.name, floats());
  s.sequence.stats[3] = -1.25f;
  s.stop_token_ids = {10};
  const std::string blob = codec->Encode(s, identity, kAnonymousCaller);
  auto back = codec->Decode(blob, identity, kAnonymousCaller);
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
  // Opened once (authenticated and parsed), it names its model and decodes as the blob does.
  auto opened = codec->Open(blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->model(), config.name);
  auto from_opened = codec->Decode(*opened, identity, kAnonymousCaller);
  ASSERT_TRUE(from_opened.ok()) << from_opened.status();
  EXPECT_EQ(from_opened->sequence.stats, back->sequence.stats);
  EXPECT_EQ(from_opened->recent_tokens, back->recent_tokens);
  std::string tampered = blob;
  tampered[tampered.size() / 2] ^= 1;
  EXPECT_EQ(codec->Open(tampered).status().code(), absl::StatusCode::kInvalidArgument);
}

// A state in the middle of a constrained output carries its constraint and progress, as a version
// 3 blob (older replicas refuse it rather than continue unconstrained); every other state is still
// written as version 2. An inconsistent progress is refused.
TEST_F(SessionCodecTest, AConstraintInProgressRoundTripsAsVersionThree) {
  const SessionCodec codec = Codec({kKey});
  const auto version = [](const std::string& blob) {
    return static_cast<uint8_t>(blob[8]) | static_cast<uint8_t>(blob[9]) << 8;
  };
  EXPECT_EQ(version(Blob(codec)), 2);
  GenerationState s = SmallState(config.name, floats());
  s.constraint = ConstraintProgress{.spec = {.kind = structured::Constraint::Kind::kChoice,
                                             .text = "",
                                             .choices = {"yes", "no\n"}},
                                    .output = {'n', 'o'}};
  std::string blob = codec.Encode(s, identity, kAnonymousCaller);
  EXPECT_EQ(version(blob), 3);
  auto back = codec.Decode(blob, identity, kAnonymousCaller);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->constraint, s.constraint);
  s.constraint->spec = {.kind = structured::Constraint::Kind::kJsonSchema,
                        .text = R"({"type":"integer"})",
                        .choices = {}};
  back = codec.Decode(codec.Encode(s, identity, kAnonymousCaller), identity, kAnonymousCaller);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->constraint, s.constraint);
  s.constraint->spec = {.kind = structured::Constraint::Kind::kStructuralTag,
                        .text = R"({"type":"structural_tag","format":{"type":"const_string",)"
                                R"("value":"no"}})",
                        .choices = {}};
  back = codec.Decode(codec.Encode(s, identity, kAnonymousCaller), identity, kAnonymousCaller);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->constraint, s.constraint);

  // More output than the sequence holds (position 17 and a pending token), or ids outside the
  // vocabulary: not a state this server wrote.
  s.constraint->output.assign(19, '1');
  EXPECT_EQ(codec.Decode(codec.Encode(s, identity, kAnonymousCaller), identity, kAnonymousCaller)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  s.constraint->output = {static_cast<int32_t>(config.language.vocab_size)};
  const absl::Status outside =
      codec.Decode(codec.Encode(s, identity, kAnonymousCaller), identity, kAnonymousCaller)
          .status();
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("outside the vocabulary"), std::string::npos) << outside;
}

TEST_F(SessionCodecTest, RefusesTamperedTruncatedForeignAndMismatchedBlobs) {
  // Bound and expiring, so that flipping a bit of the owner or the expiry is caught too.
  const SessionCodec codec = Codec({kKey}, absl::Hours(1));
  const std::string blob = Blob(codec, "alice");
  for (size_t i = 0; i < blob.size(); i += 7) {  // flip one bit at a time across the blob
    std::string bad = blob;
    bad[i] ^= 0x10;
    EXPECT_EQ(codec.Decode(bad, identity, "alice").status().code(),
              absl::StatusCode::kInvalidArgument)
        << "byte " << i;
  }
  for (size_t len : {size_t{0}, size_t{10}, blob.size() / 2, blob.size() - 1}) {
    auto r = codec.Decode(blob.substr(0, len), identity, "alice");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << len;
  }
  auto other_key = SessionCodec::Create({"another-secret-key-0000"});
  auto foreign = other_key->Decode(blob, identity, "alice");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("not one of this server's"), std::string::npos)
      << foreign.status();
  ModelIdentity other_weights{identity.config, std::string(32, 'x')};
  auto mismatch = codec.Decode(blob, other_weights, "alice");
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.status().message().find("weights"), std::string::npos);
  EXPECT_FALSE(SessionCodec::Create({"short"}).ok());
  EXPECT_FALSE(SessionCodec::Create({kKey, "short"}).ok());
  EXPECT_FALSE(SessionCodec::Create({}).ok());
  EXPECT_FALSE(SessionCodec::Create({kKey}, {.ttl = absl::Seconds(-1)}).ok());
  EXPECT_FALSE(SessionCodec::Create({kKey}, {.clock = nullptr}).ok());
}

TEST_F(SessionCodecTest, RefusesBlobsOfAnotherModelOrOtherDimensions) {
  auto codec = SessionCodec::Create({kKey});
  ASSERT_TRUE(codec.ok());
  const std::string blob = Blob(*codec);

  const testing::FakeLanguageModel other({.name = "other-lm"});
  auto foreign = codec->Decode(blob, {&other.config(), identity.weights_sha256}, kAnonymousCaller);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(foreign.status().message().find("\"other-lm\""), std::string::npos) << foreign.status();

  const testing::FakeLanguageModel wider({.n_embd = 8});
  auto mismatch = codec->Decode(blob, {&wider.config(), identity.weights_sha256}, kAnonymousCaller);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.status().message().find("dimensions"), std::string::npos) << mismatch.status();
}

TEST_F(SessionCodecTest, RotatedKeysTheFirstSignsEveryOneVerifiesRetiredOnesAreRefused) {
  const SessionCodec before = Codec({"the-old-key-0000000"});
  const SessionCodec rotating = Codec({"the-new-key-1111111", "the-old-key-0000000"});
  const SessionCodec after = Codec({"the-new-key-1111111"});
  const std::string old_blob = Blob(before);
  const std::string new_blob = Blob(rotating);

  // Blobs exported before the rotation still verify while the old key is listed.
  EXPECT_TRUE(rotating.Decode(old_blob, identity, kAnonymousCaller).ok());
  // The first key signs: what the rotating server exports verifies where only the new key is...
  EXPECT_TRUE(after.Decode(new_blob, identity, kAnonymousCaller).ok());
  // ...and not where only the old one is.
  auto stale = before.Decode(new_blob, identity, kAnonymousCaller);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kInvalidArgument);
  // Once the old key is retired its blobs are refused, as any foreign key's.
  auto retired = after.Decode(old_blob, identity, kAnonymousCaller);
  EXPECT_EQ(retired.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(retired.status().message().find("not one of this server's"), std::string::npos)
      << retired.status();
  EXPECT_EQ(after.PeekModel(old_blob).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionCodecTest, BlobsExpireAfterTheTtlOnTheInjectedClock) {
  const SessionCodec codec = Codec({kKey}, absl::Seconds(60));
  const std::string blob = Blob(codec);
  clock.Advance(absl::Seconds(59));
  EXPECT_TRUE(codec.Decode(blob, identity, kAnonymousCaller).ok());
  clock.Advance(absl::Seconds(1));
  auto expired = codec.Decode(blob, identity, kAnonymousCaller);
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(expired.status().message().find("expired at 2023-11-14T22:14:20.000Z"),
            std::string::npos)
      << expired.status();
  EXPECT_NE(expired.status().message().find("export the session again"), std::string::npos);

  // TTL 0: never expires.
  const SessionCodec forever = Codec({kKey});
  const std::string eternal = Blob(forever);
  clock.Advance(absl::Hours(24 * 365 * 10));
  EXPECT_TRUE(forever.Decode(eternal, identity, kAnonymousCaller).ok());

  // A replica with a TTL refuses blobs older than it, even from a replica that set none (and the
  // expiry a blob was exported with holds on a replica without a TTL).
  const SessionCodec strict = Codec({kKey}, absl::Seconds(60));
  const std::string unlimited = Blob(forever);
  const std::string limited = Blob(strict);
  clock.Advance(absl::Seconds(61));
  EXPECT_EQ(strict.Decode(unlimited, identity, kAnonymousCaller).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(forever.Decode(limited, identity, kAnonymousCaller).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionCodecTest, BlobsOfAnAuthenticatedCallerContinueOnlyUnderItsIdentity) {
  const SessionCodec codec = Codec({kKey});
  const std::string alices = Blob(codec, "alice");
  EXPECT_TRUE(codec.Decode(alices, identity, "alice").ok());
  auto bob = codec.Decode(alices, identity, "bob");
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(bob.status().message().find("belongs to another caller"), std::string::npos)
      << bob.status();
  // The message names neither identity.
  EXPECT_EQ(bob.status().message().find("alice"), std::string::npos);
  EXPECT_EQ(bob.status().message().find("bob"), std::string::npos);
  // Nor does a server without authentication let anyone continue it.
  auto anonymous = codec.Decode(alices, identity, kAnonymousCaller);
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(anonymous.status().message().find("alice"), std::string::npos);
  EXPECT_EQ(codec.Decode(alices, identity, "tls:alice").status().code(),
            absl::StatusCode::kPermissionDenied);

  // Authentication off: the blob is bound to no one.
  const std::string unbound = Blob(codec);
  EXPECT_TRUE(codec.Decode(unbound, identity, kAnonymousCaller).ok());
  EXPECT_TRUE(codec.Decode(unbound, identity, "bob").ok());
}

TEST_F(SessionCodecTest, VersionOneBlobsAreReadOnlyWithoutOwnersAndExpiry) {
  const std::string v1 = VersionOneBlob();
  ASSERT_EQ(v1.substr(8, 4), std::string("\x01\0\0\0", 4));
  auto read = Codec({kKey}).Decode(v1, identity, kAnonymousCaller);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->sequence.position, 17);
  EXPECT_EQ(read->sequence.stats, SmallState(config.name, floats()).sequence.stats);
  // The old key may be any of a rotated list.
  EXPECT_TRUE(Codec({"the-new-key-1111111", kKey}).Decode(v1, identity, kAnonymousCaller).ok());

  auto bound = Codec({kKey}).Decode(v1, identity, "alice");
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(bound.status().message().find("format version 1"), std::string::npos) << bound.status();
  EXPECT_NE(bound.status().message().find("export the session again"), std::string::npos);
  auto expiring = Codec({kKey}, absl::Hours(1)).Decode(v1, identity, kAnonymousCaller);
  EXPECT_EQ(expiring.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(expiring.status().message().find("--session_blob_ttl_s"), std::string::npos)
      << expiring.status();

  // New blobs are version 2 (3 with a constraint in progress); unknown versions are not blobs of
  // this server.
  const std::string v2 = Blob(Codec({kKey}));
  EXPECT_EQ(v2.substr(8, 4), std::string("\x02\0\0\0", 4));
  std::string v4 = v2;
  v4[8] = 4;
  auto unknown = Codec({kKey}).Decode(v4, identity, kAnonymousCaller);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("version 4"), std::string::npos) << unknown.status();
}

TEST(SessionKeys, AFileWithoutTheHeaderIsOneKeyByteForByte) {
  // Exactly as servers before key lists read it: trailing newline and all.
  const std::string text = "a-text-secret-of-some-length\n";
  EXPECT_EQ(*ParseSessionKeys(text), std::vector<std::string>{text});
  std::string binary = std::string("\n#\0 ", 4) + std::string(28, '\xff');
  EXPECT_EQ(*ParseSessionKeys(binary), std::vector<std::string>{binary});
  EXPECT_EQ(ParseSessionKeys("short\n").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SessionKeys, AListHasOneKeyPerLineFirstSigns) {
  auto keys = ParseSessionKeys(
      "tost-session-keys\r\n"
      "# signs\n"
      "  the-new-key-1111111  \r\n"
      "\n"
      "base64:CiMAIP////////////////////////////////////8=\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0], "the-new-key-1111111");
  EXPECT_EQ((*keys)[1], std::string("\n#\0 ", 4) + std::string(28, '\xff'));

  auto empty = ParseSessionKeys("tost-session-keys\n# nothing\n");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto short_key = ParseSessionKeys("tost-session-keys\nthe-new-key-1111111\nshort\n");
  EXPECT_EQ(short_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_key.status().message().find("line 3"), std::string::npos) << short_key.status();
  auto bad_base64 = ParseSessionKeys("tost-session-keys\nbase64:not*base64*at*all*\n");
  EXPECT_EQ(bad_base64.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_base64.status().message().find("line 2"), std::string::npos);
  auto twice = ParseSessionKeys("tost-session-keys\nthe-new-key-1111111\nthe-new-key-1111111\n");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace tost::service
