// Priority, per-tenant fair share and token quotas in the generation scheduler, on the
// deterministic fake LM driven step by step on the test's thread; time is a FakeClock.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "service/engine/generation_scheduler.h"
#include "service/engine/recent_arrivals.h"
#include "service/engine/tenant_ledger.h"
#include "service/engine/tenants.h"
#include "tests/service/engine/engine_testing.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

using testing::Collected;
using testing::Drain;
using testing::FakeLanguageModel;
using testing::FakeLanguageOptions;
using ::testing::HasSubstr;

class FairShareTest : public ::testing::Test {
 protected:
  // A scheduler whose tenants come from `tenants_file` (a tenants file's text).
  std::unique_ptr<GenerationScheduler> Make(GenerationSchedulerOptions o,
                                            const std::string& tenants_file = "",
                                            absl::Duration window = absl::Minutes(1),
                                            const GenerativeModel* model = nullptr) {
    auto table = TenantTable::Parse(tenants_file, "tenants", TenantLineForm::kTenantsFile);
    EXPECT_TRUE(table.ok()) << table.status();
    TenantOptions t;
    t.table = *table;
    t.token_window = window;
    ledger_ = std::make_unique<TenantLedger>(std::move(t), &clock_);
    o.tenants = ledger_.get();
    auto s = GenerationScheduler::Create(model != nullptr ? *model : lm_, o, &clock_);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  GenerationRequest Request(GenerationScheduler& s, const std::string& tenant, int32_t priority,
                            const std::string& prompt, int32_t max_new, uint64_t seed = 1) {
    GenerationRequest r;
    model::SamplingParams p;
    p.seed = seed;
    p.temperature = 1.0f;
    r.state = s.NewState(p);
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = max_new;
    r.owner = tenant;
    r.priority = priority;
    return r;
  }
  std::shared_ptr<GenerationJob> Submit(GenerationScheduler& s, GenerationRequest r) {
    auto job = s.Submit(std::move(r));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : nullptr;
  }

  FakeLanguageModel lm_;
  FakeClock clock_;
  std::unique_ptr<TenantLedger> ledger_;
};

// Jobs of two tenants and the tokens each has taken, stepped together.
struct Streams {
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  std::vector<std::string> tenant;
  std::vector<Collected> out;
  void Add(std::shared_ptr<GenerationJob> job, std::string t) {
    jobs.push_back(std::move(job));
    tenant.push_back(std::move(t));
    out.emplace_back();
  }
  void DrainAll() {
    for (size_t i = 0; i < jobs.size(); ++i) Drain(*jobs[i], out[i]);
  }
  std::map<std::string, int64_t> Tokens() const {
    std::map<std::string, int64_t> n;
    for (size_t i = 0; i < jobs.size(); ++i)
      n[tenant[i]] += static_cast<int64_t>(out[i].tokens.size());
    return n;
  }
};

// Both tenants hold more work than the places: with equal weights each gets half of every step's
// decode rows; with weights 3:1, three quarters and one quarter. A tenant that arrives with 16
// jobs does not take places from one with 16 running.
TEST_F(FairShareTest, DecodePlacesAreSharedByWeight) {
  for (const auto& [file, expected_a_share] :
       std::vector<std::pair<std::string, double>>{{"", 0.5}, {"a weight=3\nb weight=1\n", 0.75}}) {
    GenerationSchedulerOptions o;
    o.max_active_jobs = 8;
    o.max_queued_jobs = 64;
    auto s = Make(o, file);
    Streams st;
    for (int i = 0; i < 16; ++i) st.Add(Submit(*s, Request(*s, "a", 0, "A", 400, i)), "a");
    for (int i = 0; i < 4; ++i) s->StepOnce();  // a alone: it takes every place
    for (int i = 0; i < 16; ++i) st.Add(Submit(*s, Request(*s, "b", 0, "B", 400, i)), "b");
    st.DrainAll();
    const auto before = st.Tokens();
    for (int step = 0; step < 200; ++step) {
      s->StepOnce();
      st.DrainAll();
    }
    const auto after = st.Tokens();
    const double a = static_cast<double>(after.at("a") - before.at("a"));
    const double b = static_cast<double>(after.at("b") - before.at("b"));
    EXPECT_NEAR(a / (a + b), expected_a_share, 0.02) << file << ": a " << a << ", b " << b;
    EXPECT_GT(s->stats().preemptions_fair_share, 0);
    EXPECT_EQ(s->stats().preemptions_priority, 0);
  }
}

// A share that is not a whole number of places is given over steps: 2 places at 3:1 are 1.5 and
// 0.5, so b runs every other step rather than never.
TEST_F(FairShareTest, FractionalSharesAreKeptOverSteps) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 2;
  auto s = Make(o, "a weight=3\nb weight=1\n");
  Streams st;
  for (int i = 0; i < 4; ++i) st.Add(Submit(*s, Request(*s, "a", 0, "A", 1000, i)), "a");
  for (int i = 0; i < 4; ++i) st.Add(Submit(*s, Request(*s, "b", 0, "B", 1000, i)), "b");
  for (int step = 0; step < 400; ++step) {
    s->StepOnce();
    st.DrainAll();
  }
  const auto n = st.Tokens();
  const double ratio = static_cast<double>(n.at("a")) / static_cast<double>(n.at("b"));
  EXPECT_NEAR(ratio, 3.0, 0.3) << n.at("a") << " vs " << n.at("b");
}

// Tenant B's one request, behind 4 × max_active of A's: its first token comes out of the first
// step after it arrives (its prefill and one decode), never behind A's queue.
TEST_F(FairShareTest, OneStreamIsNotStarvedByManyOfAnotherTenant) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 4;
  auto s = Make(o);
  Streams st;
  for (int i = 0; i < 16; ++i) st.Add(Submit(*s, Request(*s, "a", 0, "A", 1000, i)), "a");
  for (int i = 0; i < 3; ++i) s->StepOnce();
  for (int round = 0; round < 20; ++round) {
    Collected b;
    auto job = Submit(*s, Request(*s, "b", 0, "hello there", 3, round));
    int steps = 0;
    while (!b.final.has_value() && steps < 100) {
      s->StepOnce();
      ++steps;
      Drain(*job, b);
      st.DrainAll();
      if (steps == 1) {
        EXPECT_EQ(b.tokens.size(), 1u) << "round " << round;
      }
    }
    EXPECT_EQ(steps, 3) << "round " << round;
  }
}

// Queue places are shared by weight too: with every place taken by a's jobs, b's one request
// takes the place of a's newest queued job (refused RESOURCE_EXHAUSTED with a retry hint, its
// state untouched), while a's next request is refused as before.
TEST_F(FairShareTest, AFullQueueGivesAPlaceToATenantHoldingNone) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 2;
  o.max_queued_jobs = 4;
  auto s = Make(o);
  Streams st;
  for (int i = 0; i < 6; ++i) st.Add(Submit(*s, Request(*s, "a", 0, "A", 50, i)), "a");
  s->StepOnce();
  auto refused = s->Submit(Request(*s, "a", 0, "A", 50, 9));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  auto b = Submit(*s, Request(*s, "b", 0, "B", 5, 1));
  ASSERT_NE(b, nullptr);
  st.DrainAll();
  ASSERT_TRUE(st.out[5].final.has_value()) << "a's newest queued job gave its place up";
  EXPECT_EQ(st.out[5].final->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.out[5].final->status.message(), HasSubstr("retry after a short backoff"));
  EXPECT_EQ(st.out[5].final->snapshot.sequence.position, 0) << "its state as it came";
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(st.out[i].final.has_value()) << i;
  EXPECT_EQ(s->stats().displaced, 1);
  // a holds 3 queued and b 1: a's next is refused (a holds the most), b's second takes one more
  // of a's places (a's 3 against b's 2 with it).
  EXPECT_FALSE(s->Submit(Request(*s, "a", 0, "A", 50, 10)).ok());
  EXPECT_TRUE(s->Submit(Request(*s, "b", 0, "B", 5, 2)).ok());
  EXPECT_EQ(s->stats().displaced, 2);
  EXPECT_FALSE(s->Submit(Request(*s, "b", 0, "B", 5, 3)).ok())
      << "a holds 2 and b would hold 3: b is at its share";
  Collected bc = testing::RunToEnd(*s, *b);
  ASSERT_TRUE(bc.final.has_value());
  EXPECT_TRUE(bc.final->status.ok());
}

// A call ready for its first token (its prompt fed) does not wait for another tenant's prefill
// chunk: its step runs the decode first and feeds that chunk after it, so the other tenant's
// prompt is fed at the same rate. The same tenant's prompts still start together.
TEST_F(FairShareTest, AFirstTokenDoesNotWaitForAnotherTenantsPrefillChunk) {
  GenerationSchedulerOptions o;
  o.prefill_chunk_tokens = 16;
  auto s = Make(o);
  auto a = Submit(*s, Request(*s, "a", 0, std::string(100, 'x'), 2, 1));
  s->StepOnce();  // a's first 16 prompt tokens
  // A one-token prompt: its token is the pending one, so it needs no prefill at all.
  auto b = Submit(*s, Request(*s, "b", 0, "h", 1, 2));
  s->StepOnce();
  Collected bc;
  Drain(*b, bc);
  ASSERT_TRUE(bc.final.has_value()) << "b's one token came in the step it was placed";
  EXPECT_EQ(bc.tokens.size(), 1u);
  EXPECT_EQ(bc.final->timeline.first_step_prefill_tokens, 0) << "no prefill before its decode";
  EXPECT_EQ(s->stats().prefill_tokens, 32) << "a's chunk was fed after it, in the same step";

  // Two of one tenant's short prompts beside a ready call of theirs: fed before the decode, and
  // all three draw in one step.
  auto c1 = Submit(*s, Request(*s, "c", 0, "h", 2, 3));
  auto c2 = Submit(*s, Request(*s, "c", 0, "hello", 2, 4));
  auto c3 = Submit(*s, Request(*s, "c", 0, "hi there", 2, 5));
  const int64_t decode_steps = s->stats().decode_steps;
  s->StepOnce();
  for (auto* job : {&c1, &c2, &c3}) {
    Collected cc;
    Drain(**job, cc);
    EXPECT_EQ(cc.tokens.size(), 1u);
  }
  EXPECT_EQ(s->stats().decode_steps, decode_steps + 1);
  Collected ac = testing::RunToEnd(*s, *a);
  ASSERT_TRUE(ac.final.has_value());
  EXPECT_EQ(ac.tokens.size(), 2u);
}

// A lower priority value preempts the highest-valued running job: its first token comes from the
// step it arrives at (one prefill and one decode), the preempted job is parked, and resumes.
TEST_F(FairShareTest, HigherPriorityPreemptsAndTheParkedJobResumes) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 2;
  auto s = Make(o);
  Collected low1, low2, high;
  auto j1 = Submit(*s, Request(*s, "a", 5, "low one", 20, 1));
  auto j2 = Submit(*s, Request(*s, "a", 7, "low two", 20, 2));
  // The second's prompt is fed after the first's first token (a lower priority value's first
  // token waits for no prefill of a higher one), so it draws from the second step on.
  for (int i = 0; i < 4; ++i) s->StepOnce();
  Drain(*j1, low1);
  Drain(*j2, low2);
  ASSERT_EQ(low1.tokens.size(), 4u);
  ASSERT_EQ(low2.tokens.size(), 3u);
  auto h = Submit(*s, Request(*s, "b", -3, "urgent", 4, 3));
  s->StepOnce();
  Drain(*h, high);
  Drain(*j1, low1);
  Drain(*j2, low2);
  EXPECT_EQ(high.tokens.size(), 1u);
  EXPECT_EQ(low1.tokens.size(), 5u) << "priority 5 keeps its place";
  EXPECT_EQ(low2.tokens.size(), 3u) << "priority 7, the highest value, was parked";
  EXPECT_EQ(s->stats().preemptions_priority, 1);
  EXPECT_EQ(s->stats().parked, 1);
  EXPECT_EQ(s->in_flight(), 3);
  for (int i = 0; i < 100 && !(low1.final && low2.final && high.final); ++i) {
    s->StepOnce();
    Drain(*h, high);
    Drain(*j1, low1);
    Drain(*j2, low2);
  }
  ASSERT_TRUE(low2.final.has_value());
  EXPECT_EQ(low2.tokens.size(), 20u);
  EXPECT_EQ(low2.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(s->stats().parked, 0);
}

// Under batch_invariant, a generation preempted many times (in the middle of its prompt's prefill
// and of its decode) draws exactly the tokens it draws uninterrupted, on a model whose statistics
// show any change in how its prompt was cut.
TEST_F(FairShareTest, ManyPreemptionsLeaveTheTokensExactlyAsUninterrupted) {
  FakeLanguageModel lm(FakeLanguageOptions{.cut_sensitive = true});
  GenerationSchedulerOptions o;
  o.max_active_jobs = 1;
  o.prefill_chunk_tokens = 4;
  o.batch_invariant = true;
  const std::string prompt = "a prompt long enough for ten prefill chunks of four tok";
  std::vector<int32_t> alone;
  {
    auto s = Make(o, "", absl::Minutes(1), &lm);
    Collected c;
    auto job = Submit(*s, Request(*s, "low", 10, prompt, 60, 77));
    for (int i = 0; i < 1000 && !c.final.has_value(); ++i) {
      s->StepOnce();
      Drain(*job, c);
    }
    ASSERT_TRUE(c.final.has_value());
    alone = c.tokens;
  }
  ASSERT_EQ(alone.size(), 60u);
  auto s = Make(o, "", absl::Minutes(1), &lm);
  Collected low;
  auto job = Submit(*s, Request(*s, "low", 10, prompt, 60, 77));
  int urgent = 0;
  for (int i = 0; i < 5000 && !low.final.has_value(); ++i) {
    if (i % 3 == 1) {
      // Every third step one more urgent request takes the only place for its prefill and two
      // tokens, then gives it back.
      Collected h;
      auto hj = Submit(*s, Request(*s, "high", -10, "hi", 2, i));
      for (int k = 0; k < 10 && !h.final.has_value(); ++k) {
        s->StepOnce();
        Drain(*hj, h);
      }
      ASSERT_TRUE(h.final.has_value());
      ++urgent;
    }
    s->StepOnce();
    Drain(*job, low);
  }
  ASSERT_TRUE(low.final.has_value());
  EXPECT_GE(s->stats().preemptions_priority, 20);
  EXPECT_EQ(s->stats().preemptions_priority, urgent);
  EXPECT_EQ(low.tokens, alone);
  EXPECT_EQ(low.final->finish_reason, FinishReason::kLength);
}

// The prefill chunk goes to the tenant fed the fewest prompt tokens so far: a's long prompts take
// turns with b's, not every chunk before b's first.
TEST_F(FairShareTest, PrefillTokensAreSharedBetweenTenants) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 8;
  o.prefill_chunk_tokens = 16;
  auto s = Make(o);
  Streams st;
  const std::string long_prompt(200, 'x');
  for (int i = 0; i < 4; ++i) st.Add(Submit(*s, Request(*s, "a", 0, long_prompt, 1, i)), "a");
  st.Add(Submit(*s, Request(*s, "b", 0, std::string(30, 'y'), 1, 9)), "b");
  // b's 30 tokens (29 to prefill) need two chunks' worth; shared, they are fed within 4 steps,
  // where a's 800 alone would take 50.
  for (int i = 0; i < 4; ++i) s->StepOnce();
  st.DrainAll();
  EXPECT_EQ(st.out.back().tokens.size(), 1u) << "b's prompt was fed and its token drawn";
}

// Who arrived lately: a job gives way to calls of another tenant at its priority and to any more
// urgent call, and to nothing else; the window counts from the latest such arrival.
TEST(RecentArrivalsTest, TellsWhichArrivalsGoBefore) {
  const absl::Time t0 = absl::FromUnixSeconds(1'000);
  RecentArrivals r;
  EXPECT_FALSE(r.PrecedingSince("a", 0, absl::InfinitePast())) << "nobody yet";
  r.Note("a", 0, t0);
  r.Note("a", 0, t0 + absl::Seconds(1));
  EXPECT_FALSE(r.PrecedingSince("a", 0, absl::InfinitePast())) << "its own tenant's calls";
  EXPECT_TRUE(r.PrecedingSince("b", 0, t0)) << "a's calls, for b";
  EXPECT_FALSE(r.PrecedingSince("b", 0, t0 + absl::Seconds(2))) << "too long ago";
  EXPECT_FALSE(r.PrecedingSince("b", -1, absl::InfinitePast())) << "b is more urgent than a";
  r.Note("b", 0, t0 + absl::Seconds(3));
  r.Note("b", 0, t0 + absl::Seconds(4));
  // The latest is b's; a's latest, before it, is still the latest of another tenant than b.
  EXPECT_TRUE(r.PrecedingSince("a", 0, t0 + absl::Seconds(4)));
  EXPECT_TRUE(r.PrecedingSince("b", 0, t0 + absl::Seconds(1)));
  EXPECT_FALSE(r.PrecedingSince("b", 0, t0 + absl::Seconds(2)));
  r.Note("a", -5, t0 + absl::Seconds(5));
  EXPECT_TRUE(r.PrecedingSince("a", 0, t0 + absl::Seconds(5))) << "a more urgent call, any tenant";
  EXPECT_TRUE(r.PrecedingSince("c", 3, t0 + absl::Seconds(5)));
  EXPECT_FALSE(r.PrecedingSince("a", -5, t0 + absl::Seconds(5)));
  EXPECT_FALSE(r.PrecedingSince("b", -9, absl::InfinitePast()));
}

// A running prefill gives way. A tenant alone is fed whole chunks. Once another tenant's call has
// come (within the window), the prefill runs in prefill_yield_tokens pieces, and a call of that
// tenant arriving while a piece runs stops the step's prefill there: it is admitted, fed, and
// draws its first token in the same step's decode, and the rest of the chunk is fed after it.
// Past the window, whole chunks again.
TEST_F(FairShareTest, APrefillGivesWayToAnotherTenantsArrival) {
  GenerationSchedulerOptions o;
  o.prefill_chunk_tokens = 128;
  o.prefill_yield_tokens = 16;
  o.prefill_yield_window = absl::Seconds(1);
  FakeLanguageModel lm(FakeLanguageOptions{.context_length = 4096});
  auto s = Make(o, "", absl::Minutes(1), &lm);
  auto a = Submit(*s, Request(*s, "a", 0, std::string(2000, 'x'), 2, 1));
  int a_arrivals = 0;
  lm.OnEachPrefill([&](int64_t) {
    if (a_arrivals++ == 0) Submit(*s, Request(*s, "a", 0, std::string(300, 'z'), 1, 7));
  });
  s->StepOnce();
  s->StepOnce();
  EXPECT_THAT(lm.prefill_sizes(), ::testing::ElementsAre(128, 128))
      << "a alone, its own arrivals included: whole chunks";

  // b calls once: from now on a's prefill gives way to b.
  auto b1 = Submit(*s, Request(*s, "b", 0, "hi", 1, 2));
  Collected b1c = testing::RunToEnd(*s, *b1);
  ASSERT_TRUE(b1c.final.has_value());
  const size_t before = lm.prefill_sizes().size();
  clock_.Advance(absl::Milliseconds(500));

  // b's next call arrives while a's first piece of the step runs.
  std::shared_ptr<GenerationJob> b2;
  lm.OnEachPrefill([&](int64_t) {
    if (b2 == nullptr) b2 = Submit(*s, Request(*s, "b", 0, "hello there", 2, 3));
  });
  s->StepOnce();
  lm.OnEachPrefill(nullptr);
  ASSERT_NE(b2, nullptr);
  Collected b2c;
  Drain(*b2, b2c);
  const std::vector<int64_t> sizes = lm.prefill_sizes();
  ASSERT_EQ(b2c.tokens.size(), 1u)
      << "b drew its first token in the step it arrived in: " << ::testing::PrintToString(sizes)
      << " from " << before;
  ASSERT_GE(sizes.size(), before + 3) << ::testing::PrintToString(sizes);
  EXPECT_EQ(sizes[before], 16) << "a's piece, while b is around: " << before << " "
                               << ::testing::PrintToString(sizes);
  EXPECT_EQ(sizes[before + 1], 10) << "b's prompt (all but its pending token), fed next";
  for (size_t i = before + 2; i < sizes.size(); ++i) EXPECT_LE(sizes[i], 16) << i;
  int64_t fed = 0;
  for (size_t i = before; i < sizes.size(); ++i) fed += sizes[i];
  EXPECT_EQ(fed, 128) << "one chunk in all: a's piece, b's prompt, the rest after the decode";
  Collected rest = testing::RunToEnd(*s, *b2);
  EXPECT_EQ(b2c.tokens.size() + rest.tokens.size(), 2u);

  // Past the window, a is alone again: whole chunks.
  clock_.Advance(absl::Seconds(2));
  const size_t later = lm.prefill_sizes().size();
  s->StepOnce();
  const std::vector<int64_t> after = lm.prefill_sizes();
  ASSERT_GT(after.size(), later);
  EXPECT_EQ(after[later], 128);
  Collected ac = testing::RunToEnd(*s, *a);
  EXPECT_EQ(ac.tokens.size(), 2u);
}

// A more urgent call of the same tenant stops the prefill too; under batch_invariant pieces stay
// whole chunks on the grid (their cut must not depend on who else calls) and the step still stops
// between them.
TEST_F(FairShareTest, AMoreUrgentArrivalStopsThePrefillAndInvariantPiecesStayWhole) {
  for (const bool invariant : {false, true}) {
    SCOPED_TRACE(invariant ? "batch_invariant" : "batched");
    FakeLanguageModel lm;
    GenerationSchedulerOptions o;
    o.prefill_chunk_tokens = 32;
    o.prefill_yield_tokens = 8;
    o.batch_invariant = invariant;
    auto s = Make(o, "", absl::Minutes(1), &lm);
    auto u0 = Submit(*s, Request(*s, "a", 0, "u", 1, 3));  // urgent calls are around
    ASSERT_TRUE(testing::RunToEnd(*s, *u0).final.has_value());
    // Two prompts of a's less urgent calls, more than half a chunk each.
    auto a1 = Submit(*s, Request(*s, "a", 5, std::string(20, 'x'), 1, 1));
    auto a2 = Submit(*s, Request(*s, "a", 5, std::string(20, 'y'), 1, 2));
    std::shared_ptr<GenerationJob> u1;
    lm.OnEachPrefill([&](int64_t) {
      if (u1 == nullptr) u1 = Submit(*s, Request(*s, "a", 0, "urgent!", 1, 4));
    });
    s->StepOnce();
    lm.OnEachPrefill(nullptr);
    ASSERT_NE(u1, nullptr);
    Collected uc;
    Drain(*u1, uc);
    EXPECT_EQ(uc.tokens.size(), 1u) << "the urgent call drew in the step it arrived in";
    const std::vector<int64_t> sizes = lm.prefill_sizes();
    ASSERT_GE(sizes.size(), 2u);
    EXPECT_EQ(sizes[0], invariant ? 19 : 8) << "a1's first piece";
    EXPECT_EQ(sizes[1], 6) << "then the urgent prompt, ahead of a's";
    for (auto* job : {&a1, &a2}) {
      Collected c = testing::RunToEnd(*s, **job);
      EXPECT_TRUE(c.final.has_value());
    }
  }
}

// A tokens_per_minute quota holds over the window: the tenant's prompt and generated tokens in any
// minute stay within it (to a step's rows), its generations wait with their state while it has no
// room and then go on, a call past it is refused naming the quota with a retry hint, and another
// tenant's rate is what it would be alone.
TEST_F(FairShareTest, TokensPerMinuteQuotaHoldsAndLeavesOthersAlone) {
  FakeLanguageModel lm(FakeLanguageOptions{.context_length = 4096});
  GenerationSchedulerOptions o;
  o.max_active_jobs = 8;
  auto s = Make(o, "q tokens_per_minute=600\n", absl::Minutes(1), &lm);
  Streams st;
  for (int i = 0; i < 4; ++i) st.Add(Submit(*s, Request(*s, "q", 0, "Q", 100000, i)), "q");
  for (int i = 0; i < 4; ++i) st.Add(Submit(*s, Request(*s, "free", 0, "F", 100000, i)), "free");
  // 100 ms a step for three minutes; per 10-s mark, the tokens each tenant had.
  std::vector<std::map<std::string, int64_t>> marks;
  for (int step = 0; step < 1800; ++step) {
    st.DrainAll();
    if (step % 100 == 0) marks.push_back(st.Tokens());
    s->StepOnce();
    clock_.Advance(absl::Milliseconds(100));
    if (step == 900) {
      auto refused = s->Submit(Request(*s, "q", 0, "more", 10, 1));
      if (!refused.ok()) {
        EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
        EXPECT_THAT(refused.status().message(), HasSubstr("tokens_per_minute=600"));
        EXPECT_THAT(refused.status().message(), HasSubstr("retry after about"));
      } else {
        ADD_FAILURE() << "a call of a tenant out of its window was admitted";
      }
    }
  }
  st.DrainAll();
  marks.push_back(st.Tokens());
  // No window of 60 s (six marks apart) holds more than 600 and 5%; the three minutes hold three
  // times 600 within 5% (the tenant runs in bursts: its window counts each second's tokens for up
  // to a second more than a minute, on the safe side).
  const int64_t total = marks.back()["q"] - marks.front()["q"];
  EXPECT_GE(total, 3 * 600 * 95 / 100);
  EXPECT_LE(total, 3 * 600 * 105 / 100);
  for (size_t i = 0; i + 6 < marks.size(); ++i) {
    const int64_t q = marks[i + 6]["q"] - marks[i]["q"];
    EXPECT_LE(q, 630) << "window from mark " << i;
    // 8 places, 4 of them q's while it has room: free's 4 rows decode every step.
    const int64_t f = marks[i + 6]["free"] - marks[i]["free"];
    EXPECT_EQ(f, 4 * 600) << "window from mark " << i;
  }
}

// max_concurrent counts a tenant's generations from its place's reservation to its end.
TEST_F(FairShareTest, MaxConcurrentRefusesPastTheQuotaAndOthersGoOn) {
  GenerationSchedulerOptions o;
  auto s = Make(o, "c max_concurrent=2\n");
  auto r1 = s->Reserve("c");
  auto r2 = s->Reserve("c");
  ASSERT_TRUE(r1.ok() && r2.ok());
  auto r3 = s->Reserve("c");
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r3.status().message(), HasSubstr("max_concurrent=2"));
  EXPECT_THAT(r3.status().message(), HasSubstr("retry after"));
  EXPECT_TRUE(s->Reserve("other").ok());
  auto job = s->Submit(*std::move(r1), Request(*s, "c", 0, "x", 2, 1));
  ASSERT_TRUE(job.ok());
  EXPECT_FALSE(s->Reserve("c").ok());
  Collected c = testing::RunToEnd(*s, **job);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_TRUE(s->Reserve("c").ok()) << "a finished generation gives its count back";
  {
    // A reservation moved onto another carries its count; the one it replaced gives its back.
    { GenerationScheduler::Reservation gone = *std::move(r2); }
    auto x = s->Reserve("c");
    auto y = s->Reserve("c");
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_FALSE(s->Reserve("c").ok());
    *x = *std::move(y);
    y = absl::CancelledError("the moved-from reservation goes");
    auto z = s->Reserve("c");
    EXPECT_TRUE(z.ok());
    EXPECT_FALSE(s->Reserve("c").ok()) << "y's count moved with it into x";
  }
  const std::vector<TenantUsage> usage = ledger_->Usage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].tenant, "c");
  EXPECT_EQ(usage[0].refusals.at("max_concurrent"), 4);
}

}  // namespace
}  // namespace tost::service
