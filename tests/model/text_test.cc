// Byte tokenizer, incremental UTF-8 assembly and the sampler.
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "model/sampler.h"
#include "model/tokenizer.h"

namespace tost::model {
namespace {

TEST(ByteTokenizer, EncodesBytesAndDecodesSpecialsToNothing) {
  ByteTokenizer tok(257, 256);
  EXPECT_EQ(tok.Encode("A\xC3\xA9"), (std::vector<int32_t>{65, 0xC3, 0xA9}));
  EXPECT_EQ(tok.TokenBytes(65), "A");
  EXPECT_EQ(tok.TokenBytes(256), "");
  EXPECT_TRUE(tok.IsSpecial(256));
}

TEST(Utf8Assembler, HoldsIncompleteCharactersBack) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("h"), "h");
  EXPECT_EQ(a.Push("\xE2"), "");  // first byte of a 3-byte euro sign
  EXPECT_EQ(a.Push("\x82"), "");
  EXPECT_EQ(a.Push("\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(a.Push("\xF0\x9F"), "");
  EXPECT_EQ(a.Flush(), "\xEF\xBF\xBD");  // an unfinished character at the end becomes U+FFFD
  EXPECT_EQ(a.pending(), "");
}

TEST(Utf8Assembler, ReplacesInvalidBytesWithoutBlocking) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("\xFF" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(a.Push("\xC3" "b"), "\xEF\xBF\xBD" "b");      // lead byte followed by ASCII
  EXPECT_EQ(a.Push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate is not UTF-8
  EXPECT_EQ(a.Push("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
}

TEST(Sampler, GreedyTakesTheArgmax) {
  const std::vector<float> logits = {0.1f, 3.f, -1.f, 3.f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleToken(logits, p, 0), 1);  // ties go to the lowest id
}

TEST(Sampler, DrawsAreAPureFunctionOfSeedAndPosition) {
  const std::vector<float> logits = {1.f, 1.2f, 0.8f, 1.1f, 0.9f};
  SamplingParams p;
  p.seed = 42;
  std::vector<int32_t> first, second;
  for (uint64_t pos = 0; pos < 50; ++pos) first.push_back(SampleToken(logits, p, pos));
  for (uint64_t pos = 0; pos < 50; ++pos) second.push_back(SampleToken(logits, p, pos));
  EXPECT_EQ(first, second);
  p.seed = 43;
  std::vector<int32_t> other;
  for (uint64_t pos = 0; pos < 50; ++pos) other.push_back(SampleToken(logits, p, pos));
  EXPECT_NE(first, other);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {0.f, std::log(3.f)};  // p = 1/4, 3/4
  SamplingParams p;
  p.seed = 7;
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += SampleToken(logits, p, i);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  const std::vector<float> logits = {5.f, 4.f, 0.f, -1.f, 4.5f};
  SamplingParams p;
  p.seed = 3;
  p.top_k = 2;
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[SampleToken(logits, p, i)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(4));
  p.top_k = 0;
  p.top_p = 0.5f;  // the top token alone holds > 50%
  for (int i = 0; i < 200; ++i) EXPECT_EQ(SampleToken(logits, p, i), 0);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p).message().find("temperature"), std::string::npos);
  p = {};
  p.top_k = -3;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_k"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

TEST(Sampler, MinPDropsTheUnlikelyTail) {
  const std::vector<float> logits = {2.f, 1.9f, -3.f, -4.f};
  SamplingParams p;
  p.seed = 11;
  p.min_p = 0.2f;
  for (int i = 0; i < 500; ++i) EXPECT_LT(SampleToken(logits, p, i), 2);
}

TEST(Sampler, RepetitionPenaltyDiscouragesRecentTokens) {
  const std::vector<float> logits = {1.f, 0.9f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleToken(logits, p, 0), 0);
  p.repetition_penalty = 1.5f;
  const std::vector<int32_t> recent = {0, 0, 0};
  EXPECT_EQ(SampleToken(logits, p, 0, recent), 1);  // 1/1.5 < 0.9
}

TEST(Sampler, TopLogprobsAreNormalisedAndSorted) {
  const std::vector<float> logits = {0.f, 2.f, 1.f};
  const auto top = TopLogprobs(logits, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(top[0].second, 2.0 - std::log(z), 1e-6);
}

}  // namespace
}  // namespace tost::model
