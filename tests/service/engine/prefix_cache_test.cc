// The prefix-state cache alone (longest prefix, LRU by bytes, scopes, disabled at 0), then inside
// the generation scheduler on the fake LM, driven step by step on the test thread: a resent
// conversation starts from the previous turn's end, the pending token is fed like a cold run's,
// and with batch_invariant a hit is bit-identical to a cold prefill even on a model whose
// statistics depend on where prompts were cut.
#include "service/engine/prefix_cache.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "service/engine/generation_scheduler.h"
#include "tests/service/engine/engine_testing.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

using testing::FakeLanguageModel;
using testing::FakeLanguageOptions;

const PrefixCacheScope kScope{"m", std::string(32, 'w'), "alice"};

model::SequenceState StateOf(int64_t position, size_t floats = 8, float fill = 1.f) {
  model::SequenceState s;
  s.position = position;
  s.stats.assign(floats, fill + static_cast<float>(position));
  return s;
}

std::vector<int32_t> Tokens(std::initializer_list<int32_t> t) { return t; }

TEST(PrefixStateCacheTest, FindsTheLongestCachedPrefixWithinTheLimit) {
  PrefixStateCache cache({.max_bytes = 1 << 20});
  cache.Insert(kScope, Tokens({1, 2, 3}), StateOf(3), false);
  cache.Insert(kScope, Tokens({1, 2, 3, 4, 5}), StateOf(5), false);
  cache.Insert(kScope, Tokens({1, 2, 7}), StateOf(3, 8, 9.f), false);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};

  auto hit = cache.Lookup(kScope, prompt, 5, false);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 5);
  EXPECT_EQ(hit->state.position, 5);
  EXPECT_EQ(hit->state.stats, StateOf(5).stats);

  hit = cache.Lookup(kScope, prompt, 4, false);  // the 5-token entry is too long now
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens, 3);
  EXPECT_EQ(hit->state.stats, StateOf(3).stats);  // {1,2,3}'s, not {1,2,7}'s

  EXPECT_FALSE(cache.Lookup(kScope, Tokens({1, 2}), 2, false).has_value());
  EXPECT_FALSE(cache.Lookup(kScope, Tokens({9, 2, 3, 4}), 4, false).has_value());
  const PrefixCacheModelStats st = cache.stats("m");
  EXPECT_EQ(st.lookups, 4);
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.hit_tokens, 8);
  EXPECT_EQ(st.entries, 3);
}

TEST(PrefixStateCacheTest, OnGridOnlyLookupsSkipEntriesOffTheGrid) {
  PrefixStateCache cache({.max_bytes = 1 << 20});
  cache.Insert(kScope, Tokens({1, 2, 3, 4}), StateOf(4), /*on_grid=*/true);
  cache.Insert(kScope, Tokens({1, 2, 3, 4, 5, 6}), StateOf(6), /*on_grid=*/false);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(cache.Lookup(kScope, prompt, 6, false)->tokens, 6);
  auto exact = cache.Lookup(kScope, prompt, 6, true);
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->tokens, 4);
  EXPECT_TRUE(exact->on_grid);
  // The same key inserted on the grid replaces the state off it (it serves every lookup).
  cache.Insert(kScope, Tokens({1, 2, 3, 4, 5, 6}), StateOf(6, 8, 5.f), /*on_grid=*/true);
  exact = cache.Lookup(kScope, prompt, 6, true);
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->tokens, 6);
  EXPECT_EQ(exact->state.stats, StateOf(6, 8, 5.f).stats);
  EXPECT_EQ(cache.entries(), 2);
}

TEST(PrefixStateCacheTest, EvictsLeastRecentlyUsedByRealBytes) {
  // Measure one entry, then allow three of that size.
  int64_t one = 0;
  {
    PrefixStateCache probe({.max_bytes = 1 << 20});
    probe.Insert(kScope, Tokens({1, 1}), StateOf(2, 64), false);
    one = probe.bytes();
  }
  EXPECT_GT(one, static_cast<int64_t>(64 * sizeof(float) + 2 * sizeof(int32_t)));
  PrefixStateCache cache({.max_bytes = 3 * one});
  cache.Insert(kScope, Tokens({1, 1}), StateOf(2, 64), false);
  cache.Insert(kScope, Tokens({2, 2}), StateOf(2, 64), false);
  cache.Insert(kScope, Tokens({3, 3}), StateOf(2, 64), false);
  EXPECT_EQ(cache.bytes(), 3 * one);
  // A hit makes {1,1} the most recently used: {2,2} goes first.
  ASSERT_TRUE(cache.Lookup(kScope, Tokens({1, 1, 0}), 2, false).has_value());
  cache.Insert(kScope, Tokens({4, 4}), StateOf(2, 64), false);
  EXPECT_EQ(cache.entries(), 3);
  EXPECT_FALSE(cache.Lookup(kScope, Tokens({2, 2, 0}), 2, false).has_value());
  EXPECT_TRUE(cache.Lookup(kScope, Tokens({1, 1, 0}), 2, false).has_value());
  EXPECT_TRUE(cache.Lookup(kScope, Tokens({3, 3, 0}), 2, false).has_value());
  EXPECT_EQ(cache.stats("m").evictions, 1);
  // A larger state takes the room of two.
  cache.Insert(kScope, Tokens({5, 5}), StateOf(2, 128 + 16), false);
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_LE(cache.bytes(), 3 * one);
  EXPECT_EQ(cache.stats("m").bytes, cache.bytes());
  // An entry larger than the whole budget is not kept (and evicts nothing).
  cache.Insert(kScope, Tokens({6, 6}), StateOf(2, 4096), false);
  EXPECT_EQ(cache.entries(), 2);
}

TEST(PrefixStateCacheTest, EntriesAreScopedByModelWeightsAndOwner) {
  PrefixStateCache cache({.max_bytes = 1 << 20});
  cache.Insert(kScope, Tokens({1, 2, 3}), StateOf(3), false);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  EXPECT_TRUE(cache.Lookup(kScope, prompt, 3, false).has_value());
  PrefixCacheScope other_owner = kScope;
  other_owner.owner = "bob";
  EXPECT_FALSE(cache.Lookup(other_owner, prompt, 3, false).has_value());
  PrefixCacheScope other_weights = kScope;
  other_weights.weights_sha256 = std::string(32, 'v');
  EXPECT_FALSE(cache.Lookup(other_weights, prompt, 3, false).has_value());
  PrefixCacheScope other_model = kScope;
  other_model.model = "n";
  EXPECT_FALSE(cache.Lookup(other_model, prompt, 3, false).has_value());
  EXPECT_EQ(cache.stats("n").lookups, 1);
  EXPECT_EQ(cache.stats("n").hits, 0);
}

TEST(PrefixStateCacheTest, ZeroBytesDisablesIt) {
  PrefixStateCache cache({.max_bytes = 0});
  EXPECT_FALSE(cache.enabled());
  cache.Insert(kScope, Tokens({1, 2, 3}), StateOf(3), false);
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_FALSE(cache.Lookup(kScope, Tokens({1, 2, 3, 4}), 3, false).has_value());
  EXPECT_THAT(ValidatePrefixCacheOptions({.max_bytes = -1}).message(),
              ::testing::HasSubstr("prefix_cache_bytes must be >= 0"));
  // A state whose position is not its key's length is refused: it would be another sequence's.
  PrefixStateCache on({.max_bytes = 1 << 20});
  on.Insert(kScope, Tokens({1, 2, 3}), StateOf(2), false);
  EXPECT_EQ(on.entries(), 0);
}

TEST(PrefixStateCacheTest, AGroupReportsThePrefixItsPromptsShareWithinItsScopeAndBytes) {
  PrefixStateCache cache({.max_bytes = 1 << 20});
  EXPECT_EQ(cache.JoinGroup(kScope, "k", Tokens({1, 2, 3, 4})), 0);  // a new group
  EXPECT_EQ(cache.JoinGroup(kScope, "k", Tokens({1, 2, 3, 9, 9})), 3);
  // Against the group's last prompt, not its first.
  EXPECT_EQ(cache.JoinGroup(kScope, "k", Tokens({1, 2, 3, 9, 7})), 4);
  EXPECT_EQ(cache.JoinGroup(kScope, "other", Tokens({1, 2, 3, 9, 7})), 0);
  PrefixCacheScope bob = kScope;
  bob.owner = "bob";
  EXPECT_EQ(cache.JoinGroup(bob, "k", Tokens({1, 2, 3, 9, 7})), 0);
  EXPECT_EQ(cache.groups().groups(), 3);

  // Bounded by bytes: the least recently joined group goes first; a prompt too long for the bound
  // alone is not remembered.
  PrefixGroups small(300);
  const std::vector<int32_t> p(20, 5);
  EXPECT_EQ(small.Join("s", "a", p), 0);
  EXPECT_EQ(small.Join("s", "b", p), 0);
  EXPECT_LE(small.bytes(), 300);
  EXPECT_EQ(small.groups(), 1);
  EXPECT_EQ(small.Join("s", "a", p), 0);  // evicted by b
  EXPECT_EQ(small.Join("s", "c", std::vector<int32_t>(200, 5)), 0);
  EXPECT_EQ(small.Join("s", "c", std::vector<int32_t>(200, 5)), 0);
  EXPECT_EQ(small.Join("s", "a", p), 20);

  PrefixStateCache off({.max_bytes = 0});
  EXPECT_EQ(off.JoinGroup(kScope, "k", Tokens({1, 2})), 0);
  EXPECT_EQ(off.JoinGroup(kScope, "k", Tokens({1, 2})), 0);
}

// --- Inside the scheduler.

struct Turn {
  std::vector<int32_t> tokens;
  int32_t cached_tokens = -1;
  int64_t prefill_tokens = 0;  // fed by this run's prefill chunks
  std::vector<int64_t> prefill_sizes;
};

class PrefixSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset({}, {}); }
  void Reset(FakeLanguageOptions lm, GenerationSchedulerOptions o, int64_t cache_bytes = 1 << 20) {
    scheduler_.reset();
    lm_ = std::make_unique<FakeLanguageModel>(lm);
    cache_ = std::make_unique<PrefixStateCache>(PrefixCacheOptions{.max_bytes = cache_bytes});
    auto s = GenerationScheduler::Create(*lm_, o, &clock_,
                                         PrefixCacheBinding{cache_.get(), std::string(32, 'w')});
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = *std::move(s);
  }
  Turn Generate(const std::vector<int32_t>& prompt, int32_t max_new, const std::string& owner = "a",
                PrefixCacheUse use = PrefixCacheUse::kLookupAndInsert,
                const std::string& prompt_cache_key = "") {
    Turn out;
    GenerationRequest r;
    model::SamplingParams p;
    p.seed = 7;
    p.temperature = 1.0f;
    r.state = scheduler_->NewState(p);
    r.prompt = prompt;
    r.max_new_tokens = max_new;
    r.owner = owner;
    r.prefix_cache = use;
    r.prompt_cache_key = prompt_cache_key;
    const int64_t prefill_before = scheduler_->stats().prefill_tokens;
    const size_t calls_before = lm_->prefill_sizes().size();
    auto job = scheduler_->Submit(std::move(r));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return out;
    const testing::Collected run = testing::RunToEnd(*scheduler_, **job);
    EXPECT_TRUE(run.final.has_value()) << "the job never ended";
    if (run.final.has_value()) {
      EXPECT_TRUE(run.final->status.ok()) << run.final->status;
      out.cached_tokens = run.final->cached_tokens;
    }
    out.tokens = run.tokens;
    out.prefill_tokens = scheduler_->stats().prefill_tokens - prefill_before;
    const std::vector<int64_t> sizes = lm_->prefill_sizes();
    out.prefill_sizes.assign(sizes.begin() + calls_before, sizes.end());
    return out;
  }
  // The same request on a fresh scheduler without a cache: what a cold prefill gives.
  Turn Cold(FakeLanguageOptions lm, GenerationSchedulerOptions o,
            const std::vector<int32_t>& prompt, int32_t max_new) {
    auto keep_lm = std::move(lm_);
    auto keep_cache = std::move(cache_);
    auto keep_scheduler = std::move(scheduler_);
    Reset(lm, o, /*cache_bytes=*/0);
    Turn out = Generate(prompt, max_new);
    scheduler_ = std::move(keep_scheduler);
    cache_ = std::move(keep_cache);
    lm_ = std::move(keep_lm);
    return out;
  }
  static std::vector<int32_t> Text(const std::string& s) { return {s.begin(), s.end()}; }
  static std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  FakeClock clock_;
  std::unique_ptr<FakeLanguageModel> lm_;
  std::unique_ptr<PrefixStateCache> cache_;
  std::unique_ptr<GenerationScheduler> scheduler_;
};

TEST_F(PrefixSchedulerTest, AResentConversationPrefillsOnlyItsNewTokens) {
  const std::vector<int32_t> p1 = Text("Once upon a time, ");
  const Turn t1 = Generate(p1, 6);
  EXPECT_EQ(t1.cached_tokens, 0);
  EXPECT_EQ(t1.prefill_tokens, static_cast<int64_t>(p1.size()) - 1);

  // The previous turn's end state holds p1 and every reply token but the last, which was drawn
  // and never fed: the resent conversation starts there and prefills that token and the new text
  // but its last token (fed by the first decode step, as in a cold run).
  const std::vector<int32_t> p2 = Cat(Cat(p1, t1.tokens), Text(" and then"));
  const Turn t2 = Generate(p2, 6);
  EXPECT_EQ(t2.cached_tokens, static_cast<int32_t>(p1.size() + t1.tokens.size()) - 1);
  EXPECT_EQ(t2.prefill_tokens, static_cast<int64_t>(Text(" and then").size()));
  EXPECT_EQ(t2.tokens, Cold({}, {}, p2, 6).tokens);
  const PrefixCacheModelStats st = cache_->stats("fake-lm");
  EXPECT_EQ(st.lookups, 2);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.hit_tokens, t2.cached_tokens);
}

TEST_F(PrefixSchedulerTest, AWhollyCachedPromptStillFeedsItsLastTokenAndDrawsTheSameTokens) {
  const std::vector<int32_t> p = Text("the same prompt twice");
  const Turn first = Generate(p, 5);
  const Turn again = Generate(p, 5);
  // The prompt's end state holds all but the last prompt token: nothing left to prefill, and the
  // first decode step feeds the last one, exactly as in the cold run.
  EXPECT_EQ(again.cached_tokens, static_cast<int32_t>(p.size()) - 1);
  EXPECT_EQ(again.prefill_tokens, 0);
  EXPECT_EQ(again.tokens, first.tokens);

  // An entry holding every prompt token is never taken: there would be no token left to feed,
  // and a state keeps no logits to draw from. A shorter one is.
  const std::vector<int32_t> q = Text("a fresh prompt");
  cache_->Insert(
      {"fake-lm", std::string(32, 'w'), "a"}, q,
      [&] {
        model::SequenceState s = lm_->NewSequence();
        for (int32_t t : q) lm_->Feed(t, s);
        return s;
      }(),
      false);
  const Turn fresh = Generate(q, 5);
  EXPECT_LT(fresh.cached_tokens, static_cast<int32_t>(q.size()));
  EXPECT_EQ(fresh.tokens, Cold({}, {}, q, 5).tokens);
}

TEST_F(PrefixSchedulerTest, BatchInvariantHitsAreBitIdenticalToAColdPrefill) {
  // A model whose statistics depend on every cut: a hit is exact only if the cached state and
  // every chunk after it are cut where a cold prefill of the whole prompt cuts.
  const FakeLanguageOptions lm{.cut_sensitive = true};
  const GenerationSchedulerOptions o{.prefill_chunk_tokens = 4, .batch_invariant = true};
  Reset(lm, o);
  const std::vector<int32_t> p1 = Text("It was a truth ");  // 15 tokens: 14 prefilled
  const Turn t1 = Generate(p1, 5);
  EXPECT_EQ(t1.prefill_sizes, (std::vector<int64_t>{4, 4, 4, 2}));
  const std::vector<int32_t> p2 = Cat(Cat(p1, t1.tokens), Text(" universally so"));
  const Turn t2 = Generate(p2, 8);
  const Turn cold = Cold(lm, o, p2, 8);
  // Only states on the grid are taken (12: the last multiple of 4 the first prompt reached), and
  // the rest is cut at 16, 20, ... as the cold prefill cuts it.
  EXPECT_EQ(t2.cached_tokens, 12);
  EXPECT_EQ(t2.prefill_sizes.front(), 4);
  EXPECT_EQ(t2.tokens, cold.tokens);
  EXPECT_EQ(t2.prefill_tokens + t2.cached_tokens, cold.prefill_tokens);

  // The same conversation without batch_invariant takes the previous turn's end state, off the
  // grid: on this model its draws differ from a cold run's (the real model's only in the last
  // bits of its statistics).
  Reset(lm, {.prefill_chunk_tokens = 4});
  const Turn d1 = Generate(p1, 5);
  EXPECT_EQ(d1.tokens, t1.tokens);
  const Turn d2 = Generate(p2, 8);
  EXPECT_EQ(d2.cached_tokens, static_cast<int32_t>(p1.size() + t1.tokens.size()) - 1);
  EXPECT_NE(d2.tokens, cold.tokens);
}

TEST_F(PrefixSchedulerTest, BatchInvariantChunksAreCutAtAbsolutePositions) {
  // A state left at position 10 (a session's, say) is continued in pieces that end at multiples
  // of the chunk from position 0: 16, 24, ...; without batch_invariant, where the budget ends.
  for (const bool invariant : {true, false}) {
    Reset({}, {.prefill_chunk_tokens = 8, .batch_invariant = invariant});
    GenerationRequest first;
    first.state = scheduler_->NewState({});
    first.prompt = Text("0123456789!");
    first.max_new_tokens = 0;
    first.persistent = true;
    auto job = scheduler_->Submit(std::move(first));
    ASSERT_TRUE(job.ok());
    testing::Collected ran = testing::RunToEnd(*scheduler_, **job, /*max_steps=*/100);
    ASSERT_TRUE(ran.final.has_value());
    std::optional<GenerationState> state = std::move(ran.final->snapshot);
    ASSERT_EQ(state->sequence.position, 10);
    GenerationRequest next;
    next.state = *std::move(state);
    next.prompt = Text("abcdefghijklmnopqrst");  // with the pending '!': 20 tokens to prefill
    next.max_new_tokens = 1;
    const size_t calls_before = lm_->prefill_sizes().size();
    job = scheduler_->Submit(std::move(next));
    ASSERT_TRUE(job.ok());
    for (int i = 0; i < 100; ++i) scheduler_->StepOnce();
    const std::vector<int64_t> sizes = lm_->prefill_sizes();
    const std::vector<int64_t> want =
        invariant ? std::vector<int64_t>{6, 8, 6} : std::vector<int64_t>{8, 8, 4};
    EXPECT_EQ(std::vector<int64_t>(sizes.begin() + calls_before, sizes.end()), want);
  }
}

TEST_F(PrefixSchedulerTest, APromptCacheKeyStoresThePrefixItsGroupShares) {
  // Three prompts share an 11-token prefix, then differ. On their own they find only the state at
  // 8 (the first chunk's end); in one prompt_cache_key group the second prompt's prefill is cut at
  // 11 and stores that state, and the third starts there.
  const std::vector<int32_t> shared = Text("You are kin");
  const std::vector<std::vector<int32_t>> prompts = {Cat(shared, Text("d. Tell me of Bath")),
                                                     Cat(shared, Text("g. Tell me of Kent")),
                                                     Cat(shared, Text("! Tell me of Derbyshire"))};
  const GenerationSchedulerOptions o{.prefill_chunk_tokens = 8};
  for (const std::string key : {"", "group-1"}) {
    Reset({}, o);
    std::vector<Turn> turns;
    for (const auto& p : prompts)
      turns.push_back(Generate(p, 4, "a", PrefixCacheUse::kLookupAndInsert, key));
    EXPECT_EQ(turns[0].cached_tokens, 0) << key;
    EXPECT_EQ(turns[1].cached_tokens, 8) << key;
    EXPECT_EQ(turns[2].cached_tokens, key.empty() ? 8 : 11) << key;
    if (!key.empty()) {
      EXPECT_EQ(turns[1].prefill_sizes.front(), 3);  // cut at the shared prefix
    }
    // The cut changes where the statistics were cut, never which tokens a prompt holds.
    EXPECT_EQ(turns[2].tokens.size(), 4u);
  }
}

TEST_F(PrefixSchedulerTest, ABatchInvariantGroupStoresItsPrefixOnTheGrid) {
  // Batch-invariant serving keeps every cut on the grid: a group's 13-token prefix is stored at
  // 12, the chunk multiple before it, which a cold prefill passes through too (and which the
  // cache alone does not keep: 12 is the third chunk's end, not a power of two's).
  const FakeLanguageOptions lm{.cut_sensitive = true};
  const GenerationSchedulerOptions o{.prefill_chunk_tokens = 4, .batch_invariant = true};
  const std::vector<int32_t> shared = Text("You are kind,");
  const std::vector<std::vector<int32_t>> prompts = {Cat(shared, Text(" tell me of Bath")),
                                                     Cat(shared, Text(" say, of Kent")),
                                                     Cat(shared, Text(" and of Derbyshire"))};
  for (const std::string key : {"", "group-1"}) {
    Reset(lm, o);
    std::vector<Turn> turns;
    for (const auto& p : prompts) {
      turns.push_back(Generate(p, 4, "a", PrefixCacheUse::kLookupAndInsert, key));
    }
    EXPECT_EQ(turns[2].cached_tokens, key.empty() ? 8 : 12) << key;
    EXPECT_EQ(turns[2].tokens, Cold(lm, o, prompts[2], 4).tokens) << key;
  }
}

TEST_F(PrefixSchedulerTest, OwnersDoNotShareEntries) {
  const std::vector<int32_t> p = Text("a private prompt");
  EXPECT_EQ(Generate(p, 3, "alice").cached_tokens, 0);
  EXPECT_EQ(Generate(p, 3, "bob").cached_tokens, 0);
  EXPECT_EQ(Generate(p, 3, "alice").cached_tokens, static_cast<int32_t>(p.size()) - 1);
}

TEST_F(PrefixSchedulerTest, InsertOnlyRequestsDoNotLookUpAndZeroBytesDisablesTheCache) {
  const std::vector<int32_t> p = Text("stored but not read");
  EXPECT_EQ(Generate(p, 3, "a", PrefixCacheUse::kInsert).cached_tokens, 0);
  EXPECT_EQ(Generate(p, 3, "a", PrefixCacheUse::kInsert).cached_tokens, 0);
  EXPECT_EQ(Generate(p, 3, "a", PrefixCacheUse::kOff).cached_tokens, 0);
  EXPECT_EQ(Generate(p, 3).cached_tokens, static_cast<int32_t>(p.size()) - 1);

  Reset({}, {}, /*cache_bytes=*/0);
  EXPECT_EQ(Generate(p, 3).cached_tokens, 0);
  const Turn again = Generate(p, 3);
  EXPECT_EQ(again.cached_tokens, 0);
  EXPECT_EQ(again.prefill_tokens, static_cast<int64_t>(p.size()) - 1);
  EXPECT_EQ(cache_->entries(), 0);
  EXPECT_EQ(cache_->stats("fake-lm").lookups, 0);
}

}  // namespace
}  // namespace tost::service
