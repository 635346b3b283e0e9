// The continuous-batching scheduler, driven step by step on the test thread (no scheduler thread,
// no sleeps), on the shipped byte-level LM.
#include <map>

#include <gtest/gtest.h>

#include "service/generation_scheduler.h"
#include "tests/service/engine_test_util.h"

namespace tost::service {
namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::string text;
  std::optional<GenerationEvent> final;
  int snapshots = 0;
};

// Pulls whatever events are ready (never waits).
void Drain(GenerationJob& job, Collected& out) {
  while (auto e = job.Next(absl::ZeroDuration())) {
    if (e->kind == GenerationEvent::Kind::kToken) {
      out.tokens.push_back(e->token.id);
      out.positions.push_back(e->token.position);
      out.text += e->token.text;
    } else if (e->kind == GenerationEvent::Kind::kSnapshot) {
      ++out.snapshots;
    } else {
      out.final = std::move(*e);
    }
  }
}

class SchedulerTest : public ::testing::Test {
 protected:
  std::unique_ptr<GenerationScheduler> Make(GenerationSchedulerOptions o = {}) {
    auto s = GenerationScheduler::Create(*lm_.language, o, &clock_);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  GenerationRequest Request(GenerationScheduler& s, const std::string& prompt, int32_t max_new,
                            uint64_t seed = 1, float temperature = 1.0f) {
    GenerationRequest r;
    model::SamplingParams p;
    p.seed = seed;
    p.temperature = temperature;
    r.state = s.NewState(p);
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = max_new;
    return r;
  }
  // Steps until every job is finished (bounded).
  void RunAll(GenerationScheduler& s,
              std::vector<std::pair<std::shared_ptr<GenerationJob>, Collected*>> jobs) {
    for (int i = 0; i < 10000; ++i) {
      for (auto& [job, out] : jobs) Drain(*job, *out);
      bool all = true;
      for (auto& [job, out] : jobs) all = all && out->final.has_value();
      if (all) return;
      s.StepOnce();
    }
    FAIL() << "scheduler did not finish";
  }

  const model::LoadedModel& lm_ = testing::ShippedLanguageModel();
  FakeClock clock_;
};

TEST_F(SchedulerTest, GeneratesWithConsecutivePositionsAndFinishReasons) {
  auto s = Make();
  Collected c;
  auto job = s->Submit(Request(*s, "Hello", 12));
  ASSERT_TRUE(job.ok()) << job.status();
  RunAll(*s, {{*job, &c}});
  ASSERT_EQ(c.tokens.size(), 12u);
  for (size_t i = 0; i < c.positions.size(); ++i)
    EXPECT_EQ(c.positions[i], 5 + static_cast<int64_t>(i));
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.final->prompt_tokens, 5);
  EXPECT_EQ(c.final->snapshot.sequence.position, 16);  // 5 prompt + 12 new, the last one pending
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
}

TEST_F(SchedulerTest, SixtyFourSessionsShareEachDecodeStep) {
  auto s = Make({.max_active_jobs = 64});
  std::vector<Collected> out(64);
  std::vector<std::pair<std::shared_ptr<GenerationJob>, Collected*>> jobs;
  for (int i = 0; i < 64; ++i) {
    auto job = s->Submit(Request(*s, "ab", 8, i));
    ASSERT_TRUE(job.ok());
    jobs.emplace_back(*job, &out[i]);
  }
  RunAll(*s, jobs);
  const GenerationSchedulerStats st = s->stats();
  size_t received = 0, longest = 0;
  for (const auto& c : out)
    received += c.tokens.size(), longest = std::max(longest, c.tokens.size());
  // All 64 prompts are prefilled in the first step and decode together from then on (a job may
  // leave early on its end-of-text token, so later steps may carry fewer).
  EXPECT_EQ(st.max_decode_batch, 64);
  EXPECT_GE(st.decode_batch_histogram[64], 1);
  EXPECT_EQ(st.decoded_tokens, static_cast<int64_t>(received));
  EXPECT_EQ(st.decode_steps, static_cast<int64_t>(longest))
      << "each decode step should carry every running sequence";
}

TEST_F(SchedulerTest, CancelFreesTheSlotWithinOneStep) {
  auto s = Make({.max_active_jobs = 1, .max_queued_jobs = 1});
  Collected a, b;
  auto ja = s->Submit(Request(*s, "x", 1000));
  auto jb = s->Submit(Request(*s, "y", 3));
  ASSERT_TRUE(ja.ok() && jb.ok());
  EXPECT_EQ(s->Submit(Request(*s, "z", 3)).status().code(), absl::StatusCode::kResourceExhausted);
  s->StepOnce();
  s->StepOnce();
  EXPECT_EQ(s->stats().active, 1);
  (*ja)->Cancel();
  s->StepOnce();  // drops a, admits b in the same step boundary
  Drain(**ja, a);
  ASSERT_TRUE(a.final.has_value());
  EXPECT_EQ(a.final->finish_reason, FinishReason::kCancelled);
  RunAll(*s, {{*jb, &b}});
  EXPECT_EQ(b.tokens.size(), 3u);
}

TEST_F(SchedulerTest, DeadlineOnTheInjectedClockEndsTheJob) {
  auto s = Make();
  GenerationRequest r = Request(*s, "abc", 1000);
  r.deadline = clock_.Now() + absl::Seconds(2);
  auto job = s->Submit(std::move(r));
  Collected c;
  s->StepOnce();
  s->StepOnce();
  clock_.Advance(absl::Seconds(2));
  s->StepOnce();
  Drain(**job, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SchedulerTest, ContextLengthBoundsPromptAndGeneration) {
  auto s = Make();
  const int64_t ctx = lm_.config.language.context_length;
  auto too_long = s->Submit(Request(*s, std::string(ctx + 1, 'a'), 1));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find(std::to_string(ctx)), std::string::npos);
  Collected c;
  auto job = s->Submit(Request(*s, std::string(ctx - 3, 'a'), 100, 1, 0.f));
  ASSERT_TRUE(job.ok());
  RunAll(*s, {{*job, &c}});
  if (c.final->finish_reason == FinishReason::kContext) {
    EXPECT_EQ(c.tokens.size(), 4u);  // positions ctx-3 .. ctx: the last cannot be fed
    EXPECT_EQ(c.positions.back(), ctx);
  } else {
    EXPECT_EQ(c.final->finish_reason, FinishReason::kEos);
  }
}

TEST_F(SchedulerTest, LongPromptPrefillDoesNotStallDecoders) {
  auto s = Make({.prefill_chunk_tokens = 16});
  Collected decoder, prefiller;
  auto jd = s->Submit(Request(*s, "go", 40));
  s->StepOnce();  // jd is decoding
  auto jp = s->Submit(Request(*s, std::string(400, 'p'), 1));
  Drain(**jd, decoder);
  for (int step = 0; step < 10; ++step) {
    const size_t before = decoder.tokens.size();
    s->StepOnce();
    Drain(**jd, decoder);
    EXPECT_EQ(decoder.tokens.size(), before + 1) << "decoder stalled at step " << step;
  }
  EXPECT_GE(s->stats().prefill_chunks, 10);
  RunAll(*s, {{*jd, &decoder}, {*jp, &prefiller}});
  EXPECT_EQ(prefiller.tokens.size(), 1u);
}

TEST_F(SchedulerTest, StopStringsStopTokensAndSnapshots) {
  auto s = Make();
  // Greedy text of this model is deterministic: learn it, then stop on a piece of it.
  Collected free_run;
  auto j0 = s->Submit(Request(*s, "The ", 30, 1, 0.f));
  RunAll(*s, {{*j0, &free_run}});
  ASSERT_GE(free_run.tokens.size(), 10u);
  std::string bytes;
  for (int32_t t : free_run.tokens) bytes.push_back(static_cast<char>(t));

  GenerationRequest r = Request(*s, "The ", 30, 1, 0.f);
  r.state.stop_token_ids = {free_run.tokens[6]};
  r.snapshot_every = 2;
  Collected stopped;
  auto j1 = s->Submit(std::move(r));
  RunAll(*s, {{*j1, &stopped}});
  EXPECT_EQ(stopped.final->finish_reason, FinishReason::kStop);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[6]);
  EXPECT_EQ(stopped.tokens.size(), static_cast<size_t>(first - free_run.tokens.begin()) + 1);
  // A snapshot every 2 tokens, except on the token that finished the job.
  EXPECT_EQ(stopped.snapshots, static_cast<int>((stopped.tokens.size() - 1) / 2));
}

// The identity sessions rest on: stopping after N tokens, carrying the final state elsewhere (a new
// scheduler) and continuing gives exactly the uninterrupted tokens, alone and (batch-invariant
// mode) beside 12 other sequences (the integration test does 32 through the server).
TEST_F(SchedulerTest, ContinuingFromTheFinalStateEqualsTheUninterruptedRun) {
  for (bool invariant : {false, true}) {
    for (float temperature : {0.f, 0.9f}) {
      auto s = Make({.batch_invariant = invariant});
      Collected whole;
      auto j = s->Submit(Request(*s, "Once upon a time", 24, 7, temperature));
      RunAll(*s, {{*j, &whole}});

      auto first = Make({.batch_invariant = invariant});
      Collected part1;
      auto j1 = first->Submit(Request(*first, "Once upon a time", 15, 7, temperature));
      RunAll(*first, {{*j1, &part1}});
      GenerationState carried = part1.final->snapshot;

      auto second = Make({.batch_invariant = invariant});
      GenerationRequest cont;
      cont.state = carried;
      cont.max_new_tokens = 9;
      std::vector<Collected> others(invariant ? 12 : 0);
      std::vector<std::pair<std::shared_ptr<GenerationJob>, Collected*>> jobs;
      for (size_t i = 0; i < others.size(); ++i) {
        jobs.emplace_back(
            *second->Submit(Request(*second, "noise " + std::to_string(i), 9, 100 + i)),
            &others[i]);
      }
      Collected part2;
      auto j2 = second->Submit(std::move(cont));
      ASSERT_TRUE(j2.ok()) << j2.status();
      jobs.emplace_back(*j2, &part2);
      RunAll(*second, jobs);

      std::vector<int32_t> joined = part1.tokens;
      joined.insert(joined.end(), part2.tokens.begin(), part2.tokens.end());
      EXPECT_EQ(joined, whole.tokens)
          << "batch_invariant=" << invariant << " temperature=" << temperature;
      if (invariant) {
        EXPECT_EQ(second->stats().max_decode_batch, 13);
      }
    }
  }
}

TEST_F(SchedulerTest, ShutdownDrainsWithResumableState) {
  auto s = Make();
  Collected c;
  auto job = s->Submit(Request(*s, "abc", 1000));
  s->StepOnce();
  s->StepOnce();
  s->StopAdmitting();
  EXPECT_EQ(s->Submit(Request(*s, "late", 3)).status().code(), absl::StatusCode::kUnavailable);
  s->Shutdown();
  Drain(**job, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kDrained);
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
}

}  // namespace
}  // namespace tost::service
