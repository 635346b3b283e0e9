// The fakes' own promises, which the engine tests rely on: the language model's output depends on
// its exact state (so session tests can catch a state carried wrongly), Prefill and Step agree,
// the context length is enforced, and the classifier answers each image on its own and can hold a
// batch in flight.
#include "tests/service/engine/fake_models.h"

#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tost::service::testing {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Tokens(const std::string& text) { return {text.begin(), text.end()}; }

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Greedy tokens from `state` on, fed one decode step at a time.
std::vector<int32_t> Greedy(const FakeLanguageModel& lm, model::SequenceState state, int32_t next,
                            int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    model::SequenceState* states[] = {&state};
    auto logits = lm.Step({next}, states, false);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) break;
    next = Argmax(*logits);
    out.push_back(next);
  }
  return out;
}

TEST(FakeLanguageModel, HasTheStateSizeOfARealModelOfItsDimensions) {
  const FakeLanguageModel lm({.n_layer = 3, .n_embd = 5, .n_head = 2});
  const model::SequenceState s = lm.NewSequence();
  EXPECT_EQ(s.position, 0);
  EXPECT_EQ(s.stats.size(), 3u * (2 * 5 + 2));
  EXPECT_EQ(static_cast<int64_t>(s.stats.size()),
            lm.config().language.n_layer * lm.config().language.state_floats_per_layer());
  EXPECT_EQ(lm.config().architecture, model::Architecture::kLanguage);
  EXPECT_EQ(lm.tokenizer().Encode("hi"), Tokens("hi"));
  EXPECT_EQ(lm.tokenizer().TokenBytes(256), "");
}

TEST(FakeLanguageModel, PrefillAndSingleStepsReachTheSameState) {
  const FakeLanguageModel lm;
  model::SequenceState prefilled = lm.NewSequence();
  auto from_prefill = lm.Prefill(Tokens("hello"), prefilled, 2);
  ASSERT_TRUE(from_prefill.ok()) << from_prefill.status();
  model::SequenceState stepped = lm.NewSequence();
  absl::StatusOr<std::vector<float>> from_steps;
  for (int32_t t : Tokens("hello")) {
    model::SequenceState* states[] = {&stepped};
    from_steps = lm.Step({t}, states, false);
    ASSERT_TRUE(from_steps.ok()) << from_steps.status();
  }
  EXPECT_EQ(prefilled.position, 5);
  EXPECT_EQ(prefilled.position, stepped.position);
  EXPECT_EQ(prefilled.stats, stepped.stats);
  EXPECT_EQ(*from_prefill, *from_steps);
}

TEST(FakeLanguageModel, OutputDependsOnEveryStatisticAndThePosition) {
  const FakeLanguageModel lm;
  model::SequenceState s = lm.NewSequence();
  ASSERT_TRUE(lm.Prefill(Tokens("Once upon a"), s, 16).ok());
  const std::vector<int32_t> reference = Greedy(lm, s, ' ', 12);
  for (size_t i = 0; i < s.stats.size(); ++i) {
    model::SequenceState off = s;
    off.stats[i] += 1.f;
    EXPECT_NE(Greedy(lm, off, ' ', 12), reference) << "statistic " << i << " is ignored";
  }
  model::SequenceState moved = s;
  ++moved.position;
  EXPECT_NE(Greedy(lm, moved, ' ', 12), reference) << "the position is ignored";
  EXPECT_EQ(Greedy(lm, s, ' ', 12), reference) << "not deterministic";
}

TEST(FakeLanguageModel, EachRowOfAStepIsIndependentOfTheOthers) {
  const FakeLanguageModel lm;
  model::SequenceState a = lm.NewSequence(), b = lm.NewSequence(), alone = lm.NewSequence();
  ASSERT_TRUE(lm.Prefill(Tokens("abc"), a, 8).ok());
  ASSERT_TRUE(lm.Prefill(Tokens("xyz"), b, 8).ok());
  ASSERT_TRUE(lm.Prefill(Tokens("abc"), alone, 8).ok());
  model::SequenceState* both[] = {&b, &a};
  auto batched = lm.Step({'q', 'r'}, both, false);
  model::SequenceState* one[] = {&alone};
  auto single = lm.Step({'r'}, one, false);
  ASSERT_TRUE(batched.ok() && single.ok());
  const size_t vocab = single->size();
  EXPECT_EQ(std::vector<float>(batched->begin() + vocab, batched->end()), *single);
  EXPECT_EQ(a.stats, alone.stats);
  EXPECT_THAT(lm.step_batch_sizes(), ElementsAre(2, 1));
  EXPECT_THAT(lm.prefill_sizes(), ElementsAre(3, 3, 3));
}

TEST(FakeLanguageModel, RefusesToFeedPastItsContextAndLeavesTheStateAlone) {
  const FakeLanguageModel lm({.context_length = 4});
  model::SequenceState s = lm.NewSequence();
  auto too_long = lm.Prefill(Tokens("abcde"), s, 8);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.position, 0);
  ASSERT_TRUE(lm.Prefill(Tokens("abcd"), s, 8).ok());
  const model::SequenceState full = s;
  model::SequenceState* states[] = {&s};
  EXPECT_EQ(lm.Step({'e'}, states, false).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.position, full.position);
  EXPECT_EQ(s.stats, full.stats);
}

TEST(FakeLanguageModel, InjectedFailuresLeaveTheStateAlone) {
  FakeLanguageModel lm;
  model::SequenceState s = lm.NewSequence();
  lm.FailPrefillWith(absl::InternalError("prefill broke"));
  EXPECT_EQ(lm.Prefill(Tokens("ab"), s, 8).status().message(), "prefill broke");
  lm.FailStepsWith(absl::UnavailableError("step broke"));
  model::SequenceState* states[] = {&s};
  EXPECT_EQ(lm.Step({'a'}, states, false).status().message(), "step broke");
  EXPECT_EQ(s.position, 0);
  lm.FailPrefillWith(absl::OkStatus());
  lm.FailStepsWith(absl::OkStatus());
  EXPECT_TRUE(lm.Step({'a'}, states, false).ok());
  EXPECT_EQ(lm.step_calls(), 2);
}

TEST(FakeLanguageModel, SaysEndOfTextFromTheConfiguredPosition) {
  const FakeLanguageModel lm({.eos_at_position = 3});
  model::SequenceState s = lm.NewSequence();
  auto before = lm.Prefill(Tokens("ab"), s, 8);
  ASSERT_TRUE(before.ok());
  EXPECT_NE(Argmax(*before), 256);
  auto at = lm.Prefill(Tokens("c"), s, 8);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(Argmax(*at), 256);
}

TEST(FakeClassifierModel, AnswersEachImageOnItsOwnAndRecordsBatchSizes) {
  FakeClassifierModel vit;
  std::vector<float> two(2 * vit.image_floats());
  for (size_t i = 0; i < two.size(); ++i) two[i] = static_cast<float>(i % 11) - 5.f;
  auto logits = vit.Classify(two, 2, 4, 4);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), 2u * 3u);
  const auto first = vit.ExpectedLogits(absl::MakeConstSpan(two).first(vit.image_floats()));
  const auto second = vit.ExpectedLogits(absl::MakeConstSpan(two).last(vit.image_floats()));
  EXPECT_EQ(std::vector<float>(logits->begin(), logits->begin() + 3), first);
  EXPECT_EQ(std::vector<float>(logits->begin() + 3, logits->end()), second);
  EXPECT_NE(first, second);
  EXPECT_NE(first[0], first[1]) << "classes should not share weights";

  EXPECT_EQ(vit.Classify(two, 3, 4, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(vit.Classify(two, 2, 8, 2).status().code(), absl::StatusCode::kInvalidArgument);
  auto explained = vit.ClassifyWithMembership(two, 2, 4, 4);
  ASSERT_TRUE(explained.ok());
  EXPECT_EQ(explained->logits, *logits);
  EXPECT_EQ(explained->grid_h, 2);
  EXPECT_EQ(explained->membership.size(), 2u * 2 * 2 * 2 * 2);  // images, depth, K, grid
  EXPECT_THAT(vit.batch_sizes(), ElementsAre(2, 3, 2, 2));
}

TEST(FakeClassifierModel, HoldsCallsAtTheGateUntilReleased) {
  FakeClassifierModel vit;
  vit.Hold();
  absl::StatusOr<std::vector<float>> result;
  std::thread caller(
      [&] { result = vit.Classify(std::vector<float>(vit.image_floats()), 1, 4, 4); });
  vit.AwaitCallsHeld(1);
  vit.Release();
  caller.join();
  EXPECT_TRUE(result.ok()) << result.status();
}

}  // namespace
}  // namespace tost::service::testing
