// The continuous-batching scheduler on the deterministic fake LM, driven step by step on the test
// thread (no scheduler thread, no sleeps) except where the scheduler's own thread is the subject.
// Time is a FakeClock: deadlines and stall timeouts pass when a test advances it.
#include "service/engine/generation_scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/service/engine/engine_testing.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

using testing::Collected;
using testing::Drain;
using ::testing::Each;
using testing::FakeLanguageModel;
using testing::FakeLanguageOptions;
using ::testing::HasSubstr;
using ::testing::Le;
using testing::Record;

// Takes exactly `n` ready events, as a consumer that catches up a little.
void Take(GenerationJob& job, int n, Collected& out) {
  for (int i = 0; i < n; ++i) {
    auto e = job.TryNext();
    ASSERT_TRUE(e.has_value()) << "event " << i << " of " << n << " was not ready";
    Record(*std::move(e), out);
  }
}

class SchedulerTest : public ::testing::Test {
 protected:
  std::unique_ptr<GenerationScheduler> Make(GenerationSchedulerOptions o = {},
                                            const GenerativeModel* model = nullptr) {
    auto s = GenerationScheduler::Create(model != nullptr ? *model : lm_, o, &clock_);
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
  // Steps until every job is finished (bounded), taking every event after each step.
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
  // The tokens of `prompt` run alone on a fresh scheduler with a consumer that keeps up.
  std::vector<int32_t> Uninterrupted(const std::string& prompt, int32_t max_new, uint64_t seed,
                                     float temperature) {
    auto s = Make();
    Collected c;
    auto job = s->Submit(Request(*s, prompt, max_new, seed, temperature));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    RunAll(*s, {{*job, &c}});
    return c.tokens;
  }

  FakeLanguageModel lm_;
  FakeClock clock_;
};

// What a scheduler tells its observer about decode graphs.
class GraphsOffRecorder final : public GenerationObserver {
 public:
  void OnStep(const GenerationStepRecord&) override {}
  void OnDecodeGraphsOff(std::string_view model, std::string_view decode_mode) override {
    off.emplace_back(model, decode_mode);
  }
  std::vector<std::pair<std::string, std::string>> off;
};

// The pool is readied for decode (a GPU model captures its graphs) when the scheduler is created,
// in the scheduler's own batch-invariant mode, before any request; a model that cannot is no
// scheduler at all.
TEST_F(SchedulerTest, CreatePreparesTheDecodeOnceInTheSchedulersMode) {
  for (const bool invariant : {false, true}) {
    FakeLanguageModel lm;
    GenerationSchedulerOptions o;
    o.batch_invariant = invariant;
    auto s = Make(o, &lm);
    EXPECT_EQ(lm.prepare_decode_calls(), std::vector<bool>{invariant});
    Collected c;
    auto job = s->Submit(Request(*s, "Hello", 3));
    ASSERT_TRUE(job.ok()) << job.status();
    RunAll(*s, {{*job, &c}});
    EXPECT_EQ(lm.prepare_decode_calls().size(), 1u) << "steps never prepare again";
  }
  FakeLanguageModel failing;
  failing.FailPrepareDecodeWith(absl::UnavailableError("model fake-lm: the device is lost"));
  const auto s = GenerationScheduler::Create(failing, {}, &clock_);
  EXPECT_EQ(s.status(), absl::UnavailableError("model fake-lm: the device is lost"));
}

// Graphs turned off (a capture or its check failed) reach the observer once, naming the model and
// why, whether it happened while the pool was prepared or on a later step; a mode that never had
// graphs ("eager") is not news.
TEST_F(SchedulerTest, DecodeGraphsTurnedOffReachTheObserverOnce) {
  GraphsOffRecorder recorder;
  GenerationSchedulerOptions o;
  o.observer = &recorder;
  {
    auto s = Make(o);  // "eager": the CPU
    EXPECT_EQ(s->stats().decode_mode, "eager");
  }
  EXPECT_TRUE(recorder.off.empty());

  FakeLanguageModel lm;
  lm.SetDecodeMode("cuda graphs");
  auto s = Make(o, &lm);
  EXPECT_EQ(s->stats().decode_mode, "cuda graphs");
  Collected first;
  auto job = s->Submit(Request(*s, "Hello", 3));
  ASSERT_TRUE(job.ok()) << job.status();
  RunAll(*s, {{*job, &first}});
  EXPECT_TRUE(recorder.off.empty());
  const std::string off =
      "eager: the graph of batch 1 (batch-invariant 0) differs from the eager step";
  lm.SetDecodeMode(off);
  Collected second;
  job = s->Submit(Request(*s, "Hi", 4));
  ASSERT_TRUE(job.ok()) << job.status();
  RunAll(*s, {{*job, &second}});
  EXPECT_EQ(second.tokens.size(), 4u) << "decode goes on, eagerly";
  ASSERT_EQ(recorder.off.size(), 1u);
  EXPECT_EQ(recorder.off[0].first, lm.config().name);
  EXPECT_EQ(recorder.off[0].second, off);
  EXPECT_EQ(s->stats().decode_mode, off);

  // Off already when the pool was prepared (at start-up): reported by Create.
  FakeLanguageModel at_start;
  at_start.SetDecodeMode("eager: capturing batch 8 failed: out of memory");
  recorder.off.clear();
  auto t = Make(o, &at_start);
  ASSERT_EQ(recorder.off.size(), 1u);
  EXPECT_EQ(recorder.off[0].second, "eager: capturing batch 8 failed: out of memory");
}

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
  EXPECT_TRUE(c.final->status.ok()) << c.final->status;
  EXPECT_EQ(c.final->prompt_tokens, 5);
  EXPECT_EQ(c.final->generated_tokens, 12);
  EXPECT_EQ(c.final->snapshot.sequence.position, 16);  // 5 prompt + 12 new, the last one pending
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
  EXPECT_EQ(c.final->snapshot.generated_tokens, 12);
}

// A constraint over the fake model's byte tokens: `digits` ASCII digits, then only end-of-text
// (vocab_words: the mask's width; admit_nothing: a grammar stuck with no token it allows). It
// checks that every token it is told of is one it allowed.
class DigitsConstraint final : public TokenConstraint {
 public:
  DigitsConstraint(int32_t digits, int64_t vocab_words = (260 + 31) / 32,
                   bool admit_nothing = false)
      : digits_(digits), vocab_words_(vocab_words), admit_nothing_(admit_nothing) {}
  int64_t bitmask_words() const override { return vocab_words_; }
  void FillAllowed(absl::Span<uint32_t> words) override {
    std::fill(words.begin(), words.end(), 0u);
    if (admit_nothing_) return;
    for (int32_t id = 0; id < 32 * static_cast<int32_t>(words.size()); ++id) {
      if (Allows(id)) words[id / 32] |= 1u << (id % 32);
    }
  }
  absl::Status Accept(int32_t token) override {
    if (!Allows(token)) return absl::InvalidArgumentError(absl::StrCat("token ", token));
    ++accepted_;
    ended_ = token == kEos;
    return absl::OkStatus();
  }
  bool Ended() const override { return ended_; }
  absl::Status Replay(absl::Span<const int32_t> output) override {
    accepted_ = 0;
    ended_ = false;
    for (size_t i = 0; i < output.size(); ++i) {
      if (absl::Status s = Accept(output[i]); !s.ok()) {
        accepted_ = 0;
        ended_ = false;
        return absl::InvalidArgumentError(
            absl::StrCat("at output position ", i, ": ", s.message()));
      }
    }
    return absl::OkStatus();
  }
  const structured::Constraint& spec() const override { return spec_; }

  static constexpr int32_t kEos = 256;  // FakeLanguageOptions::eos_token_id

 private:
  bool Allows(int32_t id) const {
    if (ended_) return false;
    return accepted_ < digits_ ? (id >= '0' && id <= '9') : id == kEos;
  }
  const int32_t digits_;
  const int64_t vocab_words_;
  const bool admit_nothing_;
  const structured::Constraint spec_{.kind = structured::Constraint::Kind::kRegex,
                                     .text = absl::StrCat("[0-9]{", digits_, "}"),
                                     .choices = {}};
  int32_t accepted_ = 0;
  bool ended_ = false;
};

// A constrained job draws only what its constraint allows, ends with end-of-text where the
// constraint says, and reports only allowed alternatives, of the constrained distribution; an
// unconstrained job in the same decode steps draws exactly what it draws alone.
TEST_F(SchedulerTest, AConstrainedJobDrawsOnlyAllowedTokensBesideAnUnconstrainedOne) {
  const std::vector<int32_t> alone = Uninterrupted("Hello", 12, /*seed=*/3, /*temperature=*/1.f);
  auto s = Make();
  GenerationRequest constrained = Request(*s, "Hello", 50, /*seed=*/5, /*temperature=*/1.f);
  constrained.constraint = std::make_unique<DigitsConstraint>(6);
  constrained.top_logprobs = 20;
  auto a = s->Submit(std::move(constrained));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = s->Submit(Request(*s, "Hello", 12, /*seed=*/3, /*temperature=*/1.f));
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<TokenEvent> events;
  std::optional<GenerationEvent> final;
  Collected other;
  for (int step = 0; step < 1000 && !(final.has_value() && other.final.has_value()); ++step) {
    s->StepOnce();
    while (auto e = (*a)->TryNext()) {
      if (e->kind == GenerationEvent::Kind::kToken) events.push_back(e->token);
      if (e->kind == GenerationEvent::Kind::kFinished) final = std::move(e);
    }
    Drain(**b, other);
  }
  ASSERT_TRUE(final.has_value());
  EXPECT_TRUE(final->status.ok()) << final->status;
  EXPECT_EQ(final->finish_reason, FinishReason::kEos);
  ASSERT_EQ(events.size(), 7u);  // six digits and end-of-text
  for (size_t i = 0; i < events.size(); ++i) {
    const int32_t want_lo = i < 6 ? '0' : DigitsConstraint::kEos;
    const int32_t want_hi = i < 6 ? '9' : DigitsConstraint::kEos;
    EXPECT_GE(events[i].id, want_lo) << i;
    EXPECT_LE(events[i].id, want_hi) << i;
    // The alternatives: only allowed ids (ten digits, or end-of-text alone), whose probabilities
    // under the constrained distribution sum to one.
    EXPECT_EQ(events[i].top_logprobs.size(), i < 6 ? 10u : 1u) << i;
    double mass = 0;
    for (const auto& [id, lp] : events[i].top_logprobs) {
      EXPECT_TRUE(i < 6 ? (id >= '0' && id <= '9') : id == DigitsConstraint::kEos) << id;
      mass += std::exp(static_cast<double>(lp));
    }
    EXPECT_NEAR(mass, 1.0, 1e-4) << i;
  }
  ASSERT_TRUE(other.final.has_value());
  EXPECT_EQ(other.tokens, alone);
}

TEST_F(SchedulerTest, MaxNewTokensCutsAConstrainedOutputShortWithLength) {
  auto s = Make();
  GenerationRequest r = Request(*s, "Hello", 3);
  r.constraint = std::make_unique<DigitsConstraint>(10);
  auto job = s->Submit(std::move(r));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected c;
  RunAll(*s, {{*job, &c}});
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.text.size(), 3u);
  EXPECT_TRUE(std::all_of(c.text.begin(), c.text.end(), [](char ch) {
    return ch >= '0' && ch <= '9';
  })) << c.text;
}

// A call cut short leaves its state under the constraint with the output so far; the next call
// continues under it (replayed), and the output joined over the calls is one the constraint
// accepts; once complete the state is unconstrained again.
TEST_F(SchedulerTest, AConstrainedOutputCutShortContinuesUnderItsConstraintInTheNextCall) {
  auto s = Make();
  GenerationRequest first = Request(*s, "Hello", 4, /*seed=*/9, /*temperature=*/1.f);
  first.constraint = std::make_unique<DigitsConstraint>(7);
  auto job = s->Submit(std::move(first));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected a;
  RunAll(*s, {{*job, &a}});
  ASSERT_EQ(a.final->finish_reason, FinishReason::kLength);
  GenerationState state = a.final->snapshot;
  ASSERT_TRUE(state.constraint.has_value());
  EXPECT_EQ(state.constraint->spec.text, "[0-9]{7}");
  EXPECT_EQ(state.constraint->output, a.tokens);
  GenerationState unconstrained = state;
  unconstrained.constraint.reset();
  EXPECT_EQ(state.ByteSize(), unconstrained.ByteSize() + state.constraint->ByteSize())
      << "the session budget counts the constraint";

  // Continued with the state's own constraint, replayed, and one prompt token steering it.
  auto constraint = std::make_unique<DigitsConstraint>(7);
  ASSERT_TRUE(constraint->Replay(state.constraint->output).ok());
  ASSERT_TRUE(constraint->Accept('5').ok());
  GenerationRequest second;
  second.state = state;
  second.prompt = {'5'};
  second.max_new_tokens = 20;
  second.constraint = std::move(constraint);
  second.constraint_continues = true;
  job = s->Submit(std::move(second));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected b;
  RunAll(*s, {{*job, &b}});
  EXPECT_EQ(b.final->finish_reason, FinishReason::kEos);
  const std::string joined = a.text + "5" + b.text;
  ASSERT_EQ(joined.size(), 7u) << joined;
  EXPECT_TRUE(std::all_of(joined.begin(), joined.end(), [](char ch) {
    return ch >= '0' && ch <= '9';
  })) << joined;
  EXPECT_FALSE(b.final->snapshot.constraint.has_value()) << "a complete output is unconstrained";
}

// A state under a constraint is not continued unconstrained by omission: without a constraint it
// is refused unless the call clears it; a failed call leaves the state's progress as it was.
TEST_F(SchedulerTest, AStateUnderAConstraintIsRefusedWithoutItUnlessCleared) {
  auto s = Make();
  GenerationRequest first = Request(*s, "Hello", 2);
  first.constraint = std::make_unique<DigitsConstraint>(5);
  auto job = s->Submit(std::move(first));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected a;
  RunAll(*s, {{*job, &a}});
  const GenerationState state = a.final->snapshot;
  ASSERT_TRUE(state.constraint.has_value());

  GenerationRequest bare;
  bare.state = state;
  bare.prompt = {'x'};
  bare.max_new_tokens = 3;
  const absl::Status refused = s->Submit(std::move(bare)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("clear_constraint"));

  // Claiming to continue with another constraint than the state's is a caller's bug.
  GenerationRequest other;
  other.state = state;
  other.max_new_tokens = 3;
  other.constraint = std::make_unique<DigitsConstraint>(6);
  other.constraint_continues = true;
  EXPECT_EQ(s->Submit(std::move(other)).status().code(), absl::StatusCode::kInvalidArgument);

  // A call past its deadline fails and gives back the state it found, progress included.
  GenerationRequest late;
  late.state = state;
  late.max_new_tokens = 3;
  late.clear_constraint = true;
  late.deadline = clock_.Now() + absl::Seconds(1);
  job = s->Submit(std::move(late));
  ASSERT_TRUE(job.ok()) << job.status();
  clock_.Advance(absl::Seconds(2));
  Collected failed;
  RunAll(*s, {{*job, &failed}});
  EXPECT_EQ(failed.final->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(failed.final->snapshot.constraint, state.constraint);

  GenerationRequest cleared;
  cleared.state = state;
  cleared.prompt = {'x'};
  cleared.max_new_tokens = 3;
  cleared.clear_constraint = true;
  job = s->Submit(std::move(cleared));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected c;
  RunAll(*s, {{*job, &c}});
  EXPECT_TRUE(c.final->status.ok()) << c.final->status;
  EXPECT_FALSE(c.final->snapshot.constraint.has_value());

  // A new constraint replaces the state's, starting after the prompt.
  GenerationRequest replaced;
  replaced.state = state;
  replaced.prompt = {'x'};
  replaced.max_new_tokens = 2;
  replaced.constraint = std::make_unique<DigitsConstraint>(4);
  job = s->Submit(std::move(replaced));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected d;
  RunAll(*s, {{*job, &d}});
  ASSERT_TRUE(d.final->snapshot.constraint.has_value());
  EXPECT_EQ(d.final->snapshot.constraint->spec.text, "[0-9]{4}");
  EXPECT_EQ(d.final->snapshot.constraint->output, d.tokens);
}

// A constraint that admits no token ends the job at once, not with a garbage draw or a hang.
TEST_F(SchedulerTest, AConstraintThatAdmitsNoTokenFinishesWithConstraint) {
  auto s = Make();
  GenerationRequest r = Request(*s, "Hello", 10);
  r.constraint = std::make_unique<DigitsConstraint>(3, (260 + 31) / 32, /*admit_nothing=*/true);
  auto job = s->Submit(std::move(r));
  ASSERT_TRUE(job.ok()) << job.status();
  Collected c;
  RunAll(*s, {{*job, &c}});
  EXPECT_TRUE(c.final->status.ok()) << c.final->status;
  EXPECT_EQ(c.final->finish_reason, FinishReason::kConstraint);
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(c.final->generated_tokens, 0);
}

// The real compiler (XGrammar, over the fake model's byte tokenizer) through the scheduler: sampled
// outputs match the regex whole and end with end-of-text; bad constraints are refused before any
// job exists.
TEST_F(SchedulerTest, ARegexCompiledForTheModelShapesEverySampledOutput) {
  ConstraintCompiler compiler(lm_);
  structured::Constraint spec;
  spec.kind = structured::Constraint::Kind::kRegex;
  spec.text = "[a-c]{2}-[0-9]{2,3}";
  auto first = compiler.Compile(spec, "anonymous");
  if (!first.ok() && absl::StrContains(first.status().message(), "without XGrammar")) {
    GTEST_SKIP() << first.status();
  }
  ASSERT_TRUE(first.ok()) << first.status();
  auto s = Make();
  // [a-c]{2}-[0-9]{2,3}, checked by hand (std::regex trips GCC 12's maybe-uninitialized warning
  // in the sanitizer builds).
  const auto matches_whole = [](const std::string& t) {
    if (t.size() < 5 || t.size() > 6 || t[2] != '-') return false;
    for (size_t i = 0; i < t.size(); ++i) {
      if (i == 2) continue;
      const bool ok = i < 2 ? (t[i] >= 'a' && t[i] <= 'c') : (t[i] >= '0' && t[i] <= '9');
      if (!ok) return false;
    }
    return true;
  };
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    auto constraint = compiler.Compile(spec, "anonymous");  // a cache hit: a fresh matcher
    ASSERT_TRUE(constraint.ok()) << constraint.status();
    GenerationRequest r = Request(*s, "Hello", 20, seed, /*temperature=*/1.f);
    r.constraint = *std::move(constraint);
    auto job = s->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    Collected c;
    RunAll(*s, {{*job, &c}});
    EXPECT_EQ(c.final->finish_reason, FinishReason::kEos) << "seed " << seed << ": " << c.text;
    EXPECT_TRUE(matches_whole(c.text)) << "seed " << seed << ": " << c.text;
  }
  spec.text = "([a-";
  EXPECT_EQ(compiler.Compile(spec, "anonymous").status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.text = "";
  const absl::Status empty = compiler.Compile(spec, "anonymous").status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("constraint"));
}

// Compile slots are the caller's (a request's owner, which Engine::CompileConstraint passes on):
// two slow compiles of one caller take both of its slots, another caller's constraint compiles at
// once beside them, and the slow ones are stopped at kill_ms (not some 15 s later, when they would
// end) and refused from then on.
TEST_F(SchedulerTest, OneCallersSlowConstraintsLeaveTheOthersCompiling) {
#ifndef TOST_CONSTRAINT_COMPILER
  GTEST_SKIP() << "no compile worker in this build (XGrammar is not configured)";
#else
  // Waits and deadlines with room for a loaded machine: Bob's compile takes some 10 ms alone.
  ConstraintCompilerOptions options;
  options.max_compile_ms = 1000;
  options.kill_ms = 2000;
  options.max_compiles = 3;
  options.max_compiles_per_caller = 2;
  options.compiler_path = TOST_CONSTRAINT_COMPILER;
  ASSERT_TRUE(ValidateConstraintCompilerOptions(options).ok());
  ConstraintCompiler compiler(lm_, options);
  // Within every shape bound, and some 75 ms of compile per property.
  const auto slow = [](int salt) {
    std::string schema = R"({"type":"object","properties":{)";
    for (int i = 0; i < 200; ++i) {
      absl::StrAppend(&schema, i == 0 ? "" : ",", "\"p", i, "_", salt,
                      R"(":{"type":"string","pattern":"^[a-z]{1000}$"})");
    }
    return structured::Constraint{structured::Constraint::Kind::kJsonSchema, schema + "}}", {}};
  };
  const absl::Time start = absl::Now();
  std::vector<std::thread> alice;
  std::vector<absl::Status> alice_status(2);
  for (int i = 0; i < 2; ++i) {
    alice.emplace_back([&, i] { alice_status[i] = compiler.Compile(slow(i), "alice").status(); });
  }
  while (compiler.stats().compiles_running < 2) std::this_thread::yield();
  EXPECT_THAT(compiler.Compile(slow(2), "alice").status().message(),
              HasSubstr("--constraint_compile_slots_per_caller"));
  structured::Constraint regex{structured::Constraint::Kind::kRegex, "[a-c]{2}-[0-9]{2,3}", {}};
  const absl::Time bob_start = absl::Now();
  auto bob = compiler.Compile(regex, "bob");
  EXPECT_TRUE(bob.ok()) << bob.status();
  EXPECT_LT(absl::Now() - bob_start, absl::Milliseconds(1000));
  for (std::thread& thread : alice) thread.join();
  for (const absl::Status& status : alice_status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  }
  while (compiler.stats().stopped < 2 && absl::Now() - start < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(compiler.stats().stopped, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  const absl::Status again = compiler.Compile(slow(0), "bob").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(again.message(), HasSubstr("--constraint_compile_kill_ms"));
#endif
}

TEST_F(SchedulerTest, AConstraintMaskOfAnotherWidthIsRefused) {
  auto s = Make();
  GenerationRequest r = Request(*s, "Hello", 10);
  r.constraint = std::make_unique<DigitsConstraint>(3, /*vocab_words=*/4);
  const absl::Status refused = s->Submit(std::move(r)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("constraint"));
}

// Each token's own logprob comes when asked, with or without alternatives, and only then.
TEST_F(SchedulerTest, EachTokenCarriesItsOwnLogprobWhenAsked) {
  auto s = Make();
  std::vector<std::vector<TokenEvent>> events(3);
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = Request(*s, "Hello", 10, /*seed=*/7, /*temperature=*/2.f);
    r.logprobs = i == 0;
    r.top_logprobs = i == 1 ? 3 : 0;
    auto job = s->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.push_back(*std::move(job));
  }
  int finished = 0;
  for (int step = 0; step < 1000 && finished < 3; ++step) {
    s->StepOnce();
    for (int i = 0; i < 3; ++i) {
      while (auto e = jobs[i]->TryNext()) {
        if (e->kind == GenerationEvent::Kind::kToken) events[i].push_back(e->token);
        finished += e->kind == GenerationEvent::Kind::kFinished;
      }
    }
  }
  ASSERT_EQ(events[0].size(), 10u);
  ASSERT_EQ(events[1].size(), 10u);
  ASSERT_EQ(events[2].size(), 10u);
  for (size_t t = 0; t < 10; ++t) {
    // The three jobs share a seed and a prompt, so they draw the same tokens.
    ASSERT_EQ(events[0][t].id, events[1][t].id);
    ASSERT_TRUE(events[0][t].logprob.has_value());
    EXPECT_TRUE(events[0][t].top_logprobs.empty());
    EXPECT_LE(*events[0][t].logprob, 0.f);
    ASSERT_TRUE(events[1][t].logprob.has_value());
    EXPECT_EQ(*events[1][t].logprob, *events[0][t].logprob);
    EXPECT_EQ(events[1][t].top_logprobs.size(), 3u);
    EXPECT_FALSE(events[2][t].logprob.has_value());
    EXPECT_TRUE(events[2][t].top_logprobs.empty());
  }
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
  // All 64 prompts are prefilled in the first step and decode together from then on; the fake
  // model never says end of text, so every step carries all 64.
  EXPECT_EQ(st.max_decode_batch, 64);
  EXPECT_EQ(st.decode_batch_histogram[64], 8);
  EXPECT_EQ(st.decoded_tokens, static_cast<int64_t>(received));
  EXPECT_EQ(received, 64u * 8u);
  EXPECT_EQ(st.decode_steps, static_cast<int64_t>(longest))
      << "each decode step should carry every running sequence";
  EXPECT_EQ(lm_.step_batch_sizes(), std::vector<int32_t>(8, 64));
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
  EXPECT_EQ(s->stats().queued, 1);
  (*ja)->Cancel();
  EXPECT_TRUE((*ja)->cancel_requested());
  s->StepOnce();  // drops a: its slot is free for b at the next step
  EXPECT_EQ(s->stats().active, 0);
  EXPECT_EQ(s->in_flight(), 1);
  Drain(**ja, a);
  ASSERT_TRUE(a.final.has_value());
  EXPECT_EQ(a.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(a.tokens.size(), 2u);
  RunAll(*s, {{*jb, &b}});
  EXPECT_EQ(b.tokens.size(), 3u);
  EXPECT_EQ(s->in_flight(), 0);
}

TEST_F(SchedulerTest, DeadlineOnTheInjectedClockEndsTheJob) {
  auto s = Make();
  GenerationRequest r = Request(*s, "abc", 1000);
  r.deadline = clock_.Now() + absl::Seconds(2);
  auto job = s->Submit(std::move(r));
  ASSERT_TRUE(job.ok());
  Collected c;
  s->StepOnce();
  s->StepOnce();
  clock_.Advance(absl::Milliseconds(1999));
  s->StepOnce();
  Drain(**job, c);
  EXPECT_FALSE(c.final.has_value()) << "ended before its deadline";
  clock_.Advance(absl::Milliseconds(1));
  s->StepOnce();
  Drain(**job, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.tokens.size(), 3u);
  // The call failed, so its state is the one it started from: a session named by it stays put.
  EXPECT_EQ(c.final->snapshot.sequence.position, 0);
  EXPECT_EQ(c.final->snapshot.pending_token, -1);
  EXPECT_EQ(c.final->prompt_tokens, 0);
}

TEST_F(SchedulerTest, ACallWhoseDeadlineHasPassedIsRefusedBeforeAnyWork) {
  auto s = Make();
  for (const absl::Duration ago : {absl::ZeroDuration(), absl::Nanoseconds(1), absl::Hours(1)}) {
    GenerationRequest r = Request(*s, "abc", 10);
    r.deadline = clock_.Now() - ago;
    auto job = s->Submit(std::move(r));
    EXPECT_EQ(job.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(job.status().message(), HasSubstr("nothing was generated"));
  }
  EXPECT_EQ(s->in_flight(), 0);
  EXPECT_FALSE(s->StepOnce());
  EXPECT_EQ(s->stats().prefill_tokens, 0);
}

TEST_F(SchedulerTest, ACancelAtTheDeadlineFailsTheCallAndACancelBeforeItKeepsTheState) {
  auto s = Make();
  // gRPC ends a call at its deadline by cancelling it: the step that sees the cancel sees the
  // deadline passed (on the clock read when it looks), and the call leaves its state as it was.
  GenerationRequest at = Request(*s, "abc", 1000);
  at.deadline = clock_.Now() + absl::Seconds(2);
  auto expired = s->Submit(std::move(at));
  GenerationRequest before = Request(*s, "abc", 1000, 2);
  before.deadline = clock_.Now() + absl::Hours(1);
  auto cancelled = s->Submit(std::move(before));
  ASSERT_TRUE(expired.ok() && cancelled.ok());
  s->StepOnce();
  s->StepOnce();
  s->StepOnce();
  clock_.Advance(absl::Seconds(2));
  (*expired)->Cancel();
  (*cancelled)->Cancel();
  s->StepOnce();
  Collected e, c;
  Drain(**expired, e);
  Drain(**cancelled, c);
  ASSERT_TRUE(e.final.has_value() && c.final.has_value());
  EXPECT_EQ(e.final->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e.final->snapshot.sequence.position, 0);
  // The client's own cancel keeps what it was given: the tokens it read are in its session.
  EXPECT_TRUE(c.final->status.ok()) << c.final->status;
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
  EXPECT_GT(c.final->snapshot.sequence.position, 0);
}

TEST_F(SchedulerTest, ContextLengthBoundsPromptAndGeneration) {
  auto s = Make();
  const int64_t ctx = lm_.config().language.context_length;
  auto too_long = s->Submit(Request(*s, std::string(ctx + 1, 'a'), 1));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find(std::to_string(ctx)), std::string::npos);
  EXPECT_EQ(lm_.step_calls(), 0) << "refused before any model work";
  Collected c;
  auto job = s->Submit(Request(*s, std::string(ctx - 3, 'a'), 100, 1, 0.f));
  ASSERT_TRUE(job.ok());
  RunAll(*s, {{*job, &c}});
  EXPECT_EQ(c.final->finish_reason, FinishReason::kContext);
  EXPECT_EQ(c.tokens.size(), 4u);  // positions ctx-3 .. ctx: the last cannot be fed
  EXPECT_EQ(c.positions.back(), ctx);
  EXPECT_EQ(c.final->snapshot.sequence.position, ctx);
}

TEST_F(SchedulerTest, EndOfTextFinishesWithReasonEos) {
  FakeLanguageModel lm({.eos_at_position = 9});
  auto s = Make({}, &lm);
  Collected c;
  auto job = s->Submit(Request(*s, "abcd", 100, 1, 0.f));
  ASSERT_TRUE(job.ok());
  RunAll(*s, {{*job, &c}});
  EXPECT_EQ(c.final->finish_reason, FinishReason::kEos);
  ASSERT_EQ(c.tokens.size(), 6u);  // positions 4..9; the model says end of text at 9
  EXPECT_EQ(c.tokens.back(), 256);
  EXPECT_EQ(c.positions.back(), 9);
}

TEST_F(SchedulerTest, LongPromptPrefillDoesNotStallDecoders) {
  auto s = Make({.prefill_chunk_tokens = 16});
  Collected decoder, prefiller;
  auto jd = s->Submit(Request(*s, "go", 40));
  s->StepOnce();  // jd is decoding
  auto jp = s->Submit(Request(*s, std::string(400, 'p'), 1));
  ASSERT_TRUE(jd.ok() && jp.ok());
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
  EXPECT_EQ(prefiller.positions.front(), 400);
  EXPECT_THAT(lm_.prefill_sizes(), Each(Le(16)));
}

TEST_F(SchedulerTest, StopStringsStopTokensAndSnapshots) {
  auto s = Make();
  // Greedy text of the model is deterministic: learn it, then stop on a piece of it.
  Collected free_run;
  auto j0 = s->Submit(Request(*s, "The ", 30, 1, 0.f));
  ASSERT_TRUE(j0.ok());
  RunAll(*s, {{*j0, &free_run}});
  ASSERT_GE(free_run.tokens.size(), 20u);
  std::string bytes;
  for (int32_t t : free_run.tokens) bytes.push_back(static_cast<char>(t));
  ASSERT_EQ(free_run.text, bytes);

  GenerationRequest r = Request(*s, "The ", 30, 1, 0.f);
  r.state.stop_token_ids = {free_run.tokens[6]};
  r.snapshot_every = 2;
  Collected stopped;
  auto j1 = s->Submit(std::move(r));
  ASSERT_TRUE(j1.ok());
  RunAll(*s, {{*j1, &stopped}});
  EXPECT_EQ(stopped.final->finish_reason, FinishReason::kStop);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[6]);
  EXPECT_EQ(stopped.tokens.size(), static_cast<size_t>(first - free_run.tokens.begin()) + 1);
  // A snapshot every 2 tokens, except on the token that finished the job.
  EXPECT_EQ(stopped.snapshots, static_cast<int>((stopped.tokens.size() - 1) / 2));

  // A stop string: the text ends just before its first occurrence and never shows any of it.
  const std::string stop = bytes.substr(12, 3);
  GenerationRequest rs = Request(*s, "The ", 30, 1, 0.f);
  rs.state.stop_strings = {stop};
  Collected by_string;
  auto j2 = s->Submit(std::move(rs));
  ASSERT_TRUE(j2.ok());
  RunAll(*s, {{*j2, &by_string}});
  EXPECT_EQ(by_string.final->finish_reason, FinishReason::kStop);
  const size_t at = bytes.find(stop);
  EXPECT_EQ(by_string.tokens.size(), at + stop.size());
  EXPECT_EQ(by_string.text + by_string.final->final_text, bytes.substr(0, at));
}

// The identity sessions rest on: stopping after N tokens, carrying the final state elsewhere (a new
// scheduler) and continuing gives exactly the uninterrupted tokens, alone and (batch-invariant
// mode) beside 12 other sequences.
TEST_F(SchedulerTest, ContinuingFromTheFinalStateEqualsTheUninterruptedRun) {
  for (bool invariant : {false, true}) {
    for (float temperature : {0.f, 0.9f}) {
      auto s = Make({.batch_invariant = invariant});
      Collected whole;
      auto j = s->Submit(Request(*s, "Once upon a time", 24, 7, temperature));
      ASSERT_TRUE(j.ok());
      RunAll(*s, {{*j, &whole}});

      auto first = Make({.batch_invariant = invariant});
      Collected part1;
      auto j1 = first->Submit(Request(*first, "Once upon a time", 15, 7, temperature));
      ASSERT_TRUE(j1.ok());
      RunAll(*first, {{*j1, &part1}});
      GenerationState carried = part1.final->snapshot;

      auto second = Make({.batch_invariant = invariant});
      GenerationRequest cont;
      cont.state = carried;
      cont.max_new_tokens = 9;
      std::vector<Collected> others(invariant ? 12 : 0);
      std::vector<std::pair<std::shared_ptr<GenerationJob>, Collected*>> jobs;
      for (size_t i = 0; i < others.size(); ++i) {
        auto other = second->Submit(Request(*second, "noise " + std::to_string(i), 9, 100 + i));
        ASSERT_TRUE(other.ok());
        jobs.emplace_back(*other, &others[i]);
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
      EXPECT_EQ(part2.positions.front(), 16 + 15);
      if (invariant) {
        EXPECT_EQ(second->stats().max_decode_batch, 13);
      }
    }
  }
}

TEST_F(SchedulerTest, ShutdownDrainsWithResumableState) {
  auto s = Make();
  Collected c;
  auto job = s->Submit(Request(*s, "abc", 1000, 4, 0.9f));
  ASSERT_TRUE(job.ok());
  s->StepOnce();
  s->StepOnce();
  s->StopAdmitting();
  EXPECT_EQ(s->Submit(Request(*s, "late", 3)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s->in_flight(), 1);
  s->Shutdown();
  Drain(**job, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kDrained);
  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
  EXPECT_EQ(s->in_flight(), 0);

  // Resumable: another scheduler continues the drained state as if nothing had happened.
  auto elsewhere = Make();
  GenerationRequest cont;
  cont.state = c.final->snapshot;
  cont.max_new_tokens = 6;
  Collected rest;
  auto j2 = elsewhere->Submit(std::move(cont));
  ASSERT_TRUE(j2.ok()) << j2.status();
  RunAll(*elsewhere, {{*j2, &rest}});
  std::vector<int32_t> joined = c.tokens;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, Uninterrupted("abc", 8, 4, 0.9f));
}

// Active sequences live in the model's state pool (device memory on a GPU): their statistics are
// copied in once when a call starts and out only for a snapshot or at the end, never per step.
TEST_F(SchedulerTest, StatisticsCrossToTheHostOnlyForSnapshotsAndTheEnd) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 2;
  auto s = Make(o);
  std::vector<Collected> out(5);
  std::vector<std::pair<std::shared_ptr<GenerationJob>, Collected*>> jobs;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r = Request(*s, absl::StrCat("job ", i), 32, /*seed=*/i + 1, 1.0f);
    r.snapshot_every = 8;
    auto job = s->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.emplace_back(*job, &out[i]);
  }
  RunAll(*s, jobs);
  EXPECT_EQ(lm_.pool_stores(), 5) << "one copy in per call";
  // 32 tokens, a snapshot after tokens 8, 16 and 24 (none on the finishing token), and the end.
  EXPECT_EQ(lm_.pool_loads(), 5 * 4) << "copies out: snapshots and ends only";
  EXPECT_GE(s->stats().decode_steps, 5 * 32 / 2);
  // Two rows served five calls in turn, and each call's tokens are those of a run alone.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(out[i].snapshots, 3);
    EXPECT_EQ(out[i].tokens, Uninterrupted(absl::StrCat("job ", i), 32, i + 1, 1.0f)) << i;
  }
}

// A row that cannot be read back (a device error) must not leave a session holding statistics
// that match no sequence: the call ends with the error and the state it started from.
TEST_F(SchedulerTest, ARowThatCannotBeReadBackUndoesTheCall) {
  auto s = Make();
  Collected c;
  GenerationRequest r = Request(*s, "Hello", 6);
  const int64_t start = r.state.sequence.position;
  auto job = s->Submit(std::move(r));
  ASSERT_TRUE(job.ok());
  lm_.FailPoolLoadsWith(absl::InternalError("device lost"));
  RunAll(*s, {{*job, &c}});
  lm_.FailPoolLoadsWith(absl::OkStatus());
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->status.code(), absl::StatusCode::kInternal) << c.final->status;
  EXPECT_EQ(c.final->snapshot.sequence.position, start);
  EXPECT_EQ(c.final->snapshot.pending_token, -1);
  EXPECT_EQ(s->in_flight(), 0);
  // The row went back to the pool: the next call runs.
  Collected next;
  auto again = s->Submit(Request(*s, "Hello", 6));
  ASSERT_TRUE(again.ok());
  RunAll(*s, {{*again, &next}});
  EXPECT_TRUE(next.final->status.ok()) << next.final->status;
  EXPECT_EQ(next.tokens.size(), 6u);
}

// A prefill's statistics depend on how its prompt is cut into chunks; with batch_invariant the
// cut is the prompt's own (pieces of prefill_chunk_tokens from its start), not the step budget left
// over by whatever else prefills.
TEST_F(SchedulerTest, BatchInvariantPrefillCutsEveryPromptTheSameWayUnderLoad) {
  for (const bool invariant : {false, true}) {
    FakeLanguageModel lm;
    GenerationSchedulerOptions o;
    o.prefill_chunk_tokens = 8;
    o.batch_invariant = invariant;
    auto s = Make(o, &lm);
    Collected first, second;
    auto a = s->Submit(Request(*s, "12345", 1));                 // 4 tokens to prefill
    auto b = s->Submit(Request(*s, "abcdefghijklmnopqrst", 1));  // 19 tokens to prefill
    ASSERT_TRUE(a.ok() && b.ok());
    RunAll(*s, {{*a, &first}, {*b, &second}});
    if (invariant) {
      EXPECT_EQ(lm.prefill_sizes(), (std::vector<int64_t>{4, 8, 8, 3}));  // b's pieces as alone
    } else {
      EXPECT_EQ(lm.prefill_sizes(), (std::vector<int64_t>{4, 4, 8, 7}));  // b fills the budget
    }
    EXPECT_TRUE(second.final->status.ok());
  }
}

TEST_F(SchedulerTest, AFailedDecodeStepEndsEveryJobInItWithTheModelsError) {
  auto s = Make();
  Collected a, b;
  auto ja = s->Submit(Request(*s, "ab", 10));
  auto jb = s->Submit(Request(*s, "cd", 10));
  ASSERT_TRUE(ja.ok() && jb.ok());
  s->StepOnce();
  lm_.FailStepsWith(absl::InternalError("device lost"));
  s->StepOnce();
  Drain(**ja, a);
  Drain(**jb, b);
  for (const Collected* c : {&a, &b}) {
    ASSERT_TRUE(c->final.has_value());
    EXPECT_EQ(c->final->finish_reason, FinishReason::kCancelled);
    EXPECT_EQ(c->final->status.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(c->final->status.message(), "device lost");
    EXPECT_EQ(c->tokens.size(), 1u);
  }
  EXPECT_EQ(s->in_flight(), 0);
}

TEST_F(SchedulerTest, AFailedPrefillEndsThatJobAndSparesTheDecoders) {
  auto s = Make();
  Collected decoder, failed;
  auto jd = s->Submit(Request(*s, "a", 5));  // one token: nothing to prefill
  auto jf = s->Submit(Request(*s, "a longer prompt", 5));
  ASSERT_TRUE(jd.ok() && jf.ok());
  lm_.FailPrefillWith(absl::InternalError("out of memory"));
  RunAll(*s, {{*jd, &decoder}, {*jf, &failed}});
  EXPECT_EQ(failed.final->status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(failed.tokens.empty());
  EXPECT_TRUE(decoder.final->status.ok()) << decoder.final->status;
  EXPECT_EQ(decoder.tokens.size(), 5u);
}

// Everything a continuation depends on.
void ExpectSameState(const GenerationState& a, const GenerationState& b) {
  EXPECT_EQ(a.sequence.position, b.sequence.position);
  EXPECT_EQ(a.sequence.stats, b.sequence.stats);
  EXPECT_EQ(a.pending_token, b.pending_token);
  EXPECT_EQ(a.recent_tokens, b.recent_tokens);
  EXPECT_EQ(a.generated_tokens, b.generated_tokens);
  EXPECT_EQ(a.utf8_pending, b.utf8_pending);
  EXPECT_EQ(a.held_text, b.held_text);
}

TEST_F(SchedulerTest, ACallInterruptedBeforeItsPromptIsFedLeavesTheStateAsItWas) {
  const std::string long_prompt(40, 'q');
  // A session after one call: the state every interrupted call below starts from.
  GenerationState session;
  {
    auto s = Make();
    Collected c;
    GenerationRequest r = Request(*s, "Hello", 3);
    r.persistent = true;
    auto job = s->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    RunAll(*s, {{*job, &c}});
    session = c.final->snapshot;
  }
  // The continuation of `session` by `long_prompt`, uninterrupted.
  const auto continue_from = [&](const GenerationState& st) {
    auto s = Make();
    Collected c;
    GenerationRequest r = Request(*s, long_prompt, 6);
    r.state = st;
    r.persistent = true;
    auto job = s->Submit(std::move(r));
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) RunAll(*s, {{*job, &c}});
    return c.tokens;
  };
  const std::vector<int32_t> expected = continue_from(session);
  ASSERT_EQ(expected.size(), 6u);

  enum class Cut { kCancel, kDeadline, kPrefillError, kDrainActive, kDrainQueued };
  for (Cut cut :
       {Cut::kCancel, Cut::kDeadline, Cut::kPrefillError, Cut::kDrainActive, Cut::kDrainQueued}) {
    SCOPED_TRACE(static_cast<int>(cut));
    GenerationSchedulerOptions o;
    o.prefill_chunk_tokens = 4;  // 40 prompt tokens take ten steps
    o.max_active_jobs = 1;
    auto s = Make(o);
    // With kDrainQueued another job holds the only slot, so the cut one never leaves the queue.
    std::shared_ptr<GenerationJob> blocker;
    if (cut == Cut::kDrainQueued) blocker = *s->Submit(Request(*s, "zz", 50));
    GenerationRequest r = Request(*s, long_prompt, 6);
    r.state = session;
    r.persistent = true;
    r.deadline = clock_.Now() + absl::Seconds(1);
    auto job = s->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    s->StepOnce();
    s->StepOnce();  // part of the prompt is in the live state now (or, queued, none of it)
    switch (cut) {
      case Cut::kCancel:
        (*job)->Cancel();
        s->StepOnce();
        break;
      case Cut::kDeadline:
        clock_.Advance(absl::Seconds(2));
        s->StepOnce();
        break;
      case Cut::kPrefillError:
        lm_.FailPrefillWith(absl::ResourceExhaustedError("out of memory"));
        s->StepOnce();
        lm_.FailPrefillWith(absl::OkStatus());
        break;
      case Cut::kDrainActive:
      case Cut::kDrainQueued:
        s->Shutdown();
        break;
    }
    Collected c;
    Drain(**job, c);
    ASSERT_TRUE(c.final.has_value());
    EXPECT_TRUE(c.tokens.empty());
    EXPECT_EQ(c.final->prompt_tokens, 0) << "the prompt was not consumed";
    EXPECT_EQ(c.final->generated_tokens, 0);
    ExpectSameState(c.final->snapshot, session);
    // Sending the same call again from what came back gives what the uninterrupted call gives.
    EXPECT_EQ(continue_from(c.final->snapshot), expected);
  }
}

TEST_F(SchedulerTest, ACancelledOrExpiredQueuedJobGivesItsPlaceBack) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 1;
  o.max_queued_jobs = 1;
  auto s = Make(o);
  auto running = s->Submit(Request(*s, "a", 100));
  ASSERT_TRUE(running.ok());
  s->StepOnce();
  auto queued = s->Submit(Request(*s, "b", 5));
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(s->Submit(Request(*s, "c", 5)).status().code(), absl::StatusCode::kResourceExhausted);
  (*queued)->Cancel();
  s->StepOnce();
  Collected c;
  Drain(**queued, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(s->stats().queued, 0);
  GenerationRequest late = Request(*s, "d", 5);
  late.deadline = clock_.Now() + absl::Milliseconds(10);
  auto expiring = s->Submit(std::move(late));
  ASSERT_TRUE(expiring.ok()) << "the cancelled job's place is free again";
  clock_.Advance(absl::Milliseconds(20));
  s->StepOnce();
  Collected d;
  Drain(**expiring, d);
  ASSERT_TRUE(d.final.has_value());
  EXPECT_EQ(d.final->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(s->Submit(Request(*s, "e", 5)).ok());
  (*running)->Cancel();
}

// A reset stream whose job is still queued gives its place back inside Cancel, with no scheduler
// step: the scheduler's thread may be busy with a long step, and until it looks again new
// requests would be refused for a stream that no longer exists.
TEST_F(SchedulerTest, CancellingAQueuedJobFreesItsPlaceWithoutAStep) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 1;
  o.max_queued_jobs = 1;
  auto s = Make(o);
  auto running = s->Submit(Request(*s, "a", 100));
  ASSERT_TRUE(running.ok());
  s->StepOnce();
  ASSERT_EQ(s->stats().active, 1);
  // The front end's order: a place first, then the request.
  auto place = s->Reserve();
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(s->Reserve().status().code(), absl::StatusCode::kResourceExhausted);
  auto queued = s->Submit(*std::move(place), Request(*s, "bcd", 5));
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_EQ(s->stats().queued, 1);
  EXPECT_EQ(s->Reserve().status().code(), absl::StatusCode::kResourceExhausted);
  std::atomic<int> listener_calls{0};
  (*queued)->SetListener([&listener_calls] { ++listener_calls; });

  const int64_t steps = s->stats().steps;
  const int64_t model_calls = lm_.step_calls();
  (*queued)->Cancel();
  EXPECT_EQ(s->stats().steps, steps);
  EXPECT_EQ(lm_.step_calls(), model_calls);
  EXPECT_EQ(s->stats().queued, 0);
  EXPECT_EQ(s->in_flight(), 1);
  // Its end is published by Cancel itself, state as the call found it (nothing was fed).
  EXPECT_EQ(listener_calls.load(), 1);
  Collected c;
  Drain(**queued, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(c.final->status.ok()) << c.final->status;
  EXPECT_EQ(c.final->prompt_tokens, 0);
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(c.final->snapshot.sequence.position, 0);
  EXPECT_EQ(c.final->snapshot.pending_token, -1);
  // The freed place admits a new request at once.
  auto next = s->Reserve();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(s->Reserve().status().code(), absl::StatusCode::kResourceExhausted);

  // Cancelling again, or a later step, never ends the job twice.
  (*queued)->Cancel();
  s->StepOnce();
  EXPECT_FALSE((*queued)->TryNext().has_value());
  EXPECT_EQ(listener_calls.load(), 1);
  (*queued)->SetListener(nullptr);

  // An active job still ends at the next step (the step in progress may be using its state).
  (*running)->Cancel();
  EXPECT_EQ(s->stats().active, 1);
  s->StepOnce();
  EXPECT_EQ(s->stats().active, 0);

  // A handle may outlive its scheduler (a drained stream still delivering): Cancel is harmless.
  auto late = s->Submit(*std::move(next), Request(*s, "e", 5));
  ASSERT_TRUE(late.ok()) << late.status();
  s.reset();
  (*late)->Cancel();
  Collected d;
  Drain(**late, d);
  ASSERT_TRUE(d.final.has_value());
  EXPECT_EQ(d.final->finish_reason, FinishReason::kDrained);
}

// Cancels from another thread race the scheduler's own thread moving jobs from the queue to the
// slots: every job still ends exactly once, and every place comes back.
TEST_F(SchedulerTest, CancelsRacingTheSchedulerThreadEndEveryJobOnce) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 2;
  o.max_queued_jobs = 62;
  auto s = Make(o);
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  for (int i = 0; i < 64; ++i) {
    auto job = s->Submit(Request(*s, "ab", 20, i));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.push_back(*std::move(job));
  }
  s->Start();
  std::thread canceller([&jobs] {
    for (auto& job : jobs) job->Cancel();
  });
  for (auto& job : jobs) {
    Collected c;
    while (!c.final.has_value()) {
      auto e = job->Next(absl::Seconds(60));
      ASSERT_TRUE(e.has_value()) << "no final event";
      Record(*std::move(e), c);
    }
    EXPECT_FALSE(job->TryNext().has_value()) << "an event after the final one";
  }
  canceller.join();
  EXPECT_EQ(s->in_flight(), 0);
  const GenerationSchedulerStats st = s->stats();
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.active, 0);
  EXPECT_TRUE(s->Reserve().ok());
  s->Shutdown();
}

// A started scheduler wakes its streams' listeners for tokens after the first on a delivery thread:
// a listener that takes its time (a gRPC write) does not hold up the step loop, which goes on
// publishing the job's tokens meanwhile; the listener then takes them all, in order, and the final
// event.
TEST_F(SchedulerTest, AStartedSchedulersStepLoopDoesNotWaitForTokenListeners) {
  auto s = Make(GenerationSchedulerOptions{});
  constexpr int kTokens = 8;
  auto job = s->Submit(Request(*s, "ab", kTokens));
  ASSERT_TRUE(job.ok()) << job.status();
  GenerationJob* raw = job->get();
  absl::Notification release;
  std::atomic<int> calls{0};
  absl::Mutex mu;
  Collected c;
  raw->SetListener([&] {
    // The first call is the first token's, on the step loop's thread; the second, the delivery
    // thread's, waits.
    if (calls.fetch_add(1) == 1) release.WaitForNotification();
    absl::MutexLock lock(&mu);
    Drain(*raw, c);
  });
  s->Start();
  // The second listener call waits; the step loop publishes every token regardless (it then waits
  // to publish the final event inline, which takes the listener's lock). The delivery thread may
  // start that call after the last token is published (seen under ASan on a loaded machine), so
  // the wait is for both.
  for (int i = 0; i < 10000 && (raw->buffered_tokens() < kTokens - 1 || calls.load() < 2); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(raw->buffered_tokens(), kTokens - 1);  // the first call took the first token
  EXPECT_EQ(calls.load(), 2);
  release.Notify();
  for (int i = 0; i < 10000; ++i) {
    {
      absl::MutexLock lock(&mu);
      if (c.final.has_value()) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  raw->SetListener(nullptr);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), static_cast<size_t>(kTokens));
  for (int i = 1; i < static_cast<int>(c.positions.size()); ++i) {
    EXPECT_EQ(c.positions[i], c.positions[i - 1] + 1) << "token " << i;
  }
  s->Shutdown();
}

// A call's first token reaches its listener from the step loop's own thread, not through the
// delivery thread: on a core the two threads share, the delivery thread would run only once the
// next step lets go of it, a step added to the time to first token. Later tokens go through it.
TEST_F(SchedulerTest, AStartedSchedulerPublishesACallsFirstTokenOnItsStepThread) {
  auto s = Make(GenerationSchedulerOptions{});
  auto job = s->Submit(Request(*s, "ab", 6));
  ASSERT_TRUE(job.ok()) << job.status();
  GenerationJob* raw = job->get();
  absl::Mutex mu;
  std::vector<std::string> threads;  // the name of the thread of each listener call with a token
  Collected c;
  raw->SetListener([&] {
    char name[32] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    absl::MutexLock lock(&mu);
    const size_t before = c.tokens.size();
    Drain(*raw, c);
    if (c.tokens.size() > before) threads.emplace_back(name);
  });
  s->Start();
  for (int i = 0; i < 10000; ++i) {
    {
      absl::MutexLock lock(&mu);
      if (c.final.has_value()) break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  raw->SetListener(nullptr);
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(c.final.has_value());
  ASSERT_FALSE(threads.empty());
  EXPECT_EQ(threads.front(), absl::StrCat("step:", lm_.config().name).substr(0, 15));
  s->Shutdown();
}

// Each job's final event carries when it passed each point on the way to its first token, by the
// scheduler's clock: what a front end shows a caller asking where a slow first token's time went.
TEST_F(SchedulerTest, TheFinalEventCarriesTheFirstTokensTimeline) {
  auto s = Make({.prefill_chunk_tokens = 4});
  const absl::Time t0 = clock_.Now();
  auto job = s->Submit(Request(*s, std::string(10, 'p'), 2));  // 9 prefilled: 4, 4, 1
  ASSERT_TRUE(job.ok()) << job.status();
  Collected c;
  std::vector<absl::Time> step_starts;
  while (!c.final.has_value() && step_starts.size() < 10) {
    clock_.Advance(absl::Milliseconds(1));
    step_starts.push_back(clock_.Now());
    s->StepOnce();
    Drain(**job, c);
  }
  ASSERT_TRUE(c.final.has_value());
  const GenerationTimeline& t = c.final->timeline;
  EXPECT_EQ(t.submitted, t0);
  EXPECT_EQ(t.placed, step_starts[0]);
  EXPECT_EQ(t.prefill_start, step_starts[0]);
  EXPECT_EQ(t.prefill_end, step_starts[2]);
  EXPECT_EQ(t.first_step_start, step_starts[2]);
  EXPECT_EQ(t.first_token, step_starts[2]);
  EXPECT_EQ(t.first_step_prefill_tokens, 1);
  EXPECT_EQ(t.first_step_batch, 1);

  // A job that ends before its first token reached none of the points after its own.
  auto queued = s->Submit(Request(*s, "ab", 2));
  ASSERT_TRUE(queued.ok()) << queued.status();
  (*queued)->Cancel();
  Collected cancelled;
  Drain(**queued, cancelled);
  ASSERT_TRUE(cancelled.final.has_value());
  EXPECT_EQ(cancelled.final->timeline.submitted, clock_.Now());
  EXPECT_EQ(cancelled.final->timeline.placed, absl::InfinitePast());
  EXPECT_EQ(cancelled.final->timeline.first_token, absl::InfinitePast());
}

// A client that gets its final message and at once sends its next request must find its place
// free: the place goes back before the final event is published, not at the end of the step.
TEST_F(SchedulerTest, AFinishedJobsPlaceIsFreeWhenItsFinalEventIsPublished) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 1;
  o.max_queued_jobs = 0;
  auto s = Make(o);
  for (int32_t max_new : {0, 3}) {  // ended by the prompt alone, and by max_new_tokens
    auto job = s->Submit(Request(*s, "ab", max_new));
    ASSERT_TRUE(job.ok()) << job.status();
    GenerationJob* raw = job->get();
    std::optional<absl::Status> reserved_at_final;
    Collected c;
    raw->SetListener([&] {
      Drain(*raw, c);
      if (c.final.has_value() && !reserved_at_final.has_value())
        reserved_at_final = s->Reserve().status();
    });
    for (int step = 0; step < 10 && !c.final.has_value(); ++step) s->StepOnce();
    raw->SetListener(nullptr);
    ASSERT_TRUE(c.final.has_value());
    EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
    ASSERT_TRUE(reserved_at_final.has_value());
    EXPECT_TRUE(reserved_at_final->ok())
        << "max_new_tokens " << max_new << ": " << *reserved_at_final;
    EXPECT_EQ(s->in_flight(), 0);
  }
  // So is a cancelled active job's, and a model error's.
  auto job = s->Submit(Request(*s, "ab", 100));
  ASSERT_TRUE(job.ok());
  s->StepOnce();
  std::optional<absl::Status> reserved_at_final;
  GenerationJob* raw = job->get();
  Collected c;
  raw->SetListener([&] {
    Drain(*raw, c);
    if (c.final.has_value() && !reserved_at_final.has_value())
      reserved_at_final = s->Reserve().status();
  });
  raw->Cancel();
  s->StepOnce();
  raw->SetListener(nullptr);
  ASSERT_TRUE(reserved_at_final.has_value());
  EXPECT_TRUE(reserved_at_final->ok()) << *reserved_at_final;
}

TEST_F(SchedulerTest, AReservedPlaceCountsAgainstCapacityUntilSubmittedOrDropped) {
  GenerationSchedulerOptions o;
  o.max_active_jobs = 1;
  o.max_queued_jobs = 1;
  auto s = Make(o);
  auto first = s->Reserve();
  auto second = s->Reserve();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(s->stats().reserved, 2);
  // Full before any request was looked at: the caller has done no work yet.
  EXPECT_EQ(s->Reserve().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->Submit(Request(*s, "x", 1)).status().code(), absl::StatusCode::kResourceExhausted);
  { auto dropped = *std::move(second); }  // an unused place goes back
  EXPECT_EQ(s->stats().reserved, 1);
  auto job = s->Submit(*std::move(first), Request(*s, "hi", 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(s->stats().reserved, 0);
  EXPECT_EQ(s->stats().queued, 1);
  // A place whose request turns out invalid goes back too.
  auto bad = s->Reserve();
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(s->Submit(*std::move(bad), Request(*s, "", 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->stats().reserved, 0);
  // Draining that begins after a place was reserved still refuses the job.
  auto late = s->Reserve();
  ASSERT_TRUE(late.ok());
  s->StopAdmitting();
  EXPECT_EQ(s->Submit(*std::move(late), Request(*s, "hi", 2)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(s->Reserve().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s->stats().reserved, 0);
  // A place belongs to the scheduler that gave it.
  auto other = Make();
  auto foreign = other->Reserve();
  ASSERT_TRUE(foreign.ok());
  auto fresh = Make();
  EXPECT_EQ(fresh->Submit(*std::move(foreign), Request(*fresh, "hi", 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, EveryStateIsCheckedOnceByTheSchedulerWhateverItsSource) {
  auto s = Make();
  GenerationState ok = s->NewState({});
  ok.stop_token_ids = {0, 259};
  EXPECT_TRUE(s->CheckState(ok).ok());

  GenerationState bad_stop = ok;
  bad_stop.stop_token_ids = {260};
  GenerationState bad_sampling = ok;
  bad_sampling.sampling.temperature = -1.0f;
  GenerationState foreign = ok;
  foreign.model = "another-lm";
  for (const GenerationState& st : {bad_stop, bad_sampling, foreign}) {
    const absl::Status checked = s->CheckState(st);
    EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument) << checked;
    GenerationRequest r = Request(*s, "Hi", 1);
    r.state = st;
    const absl::Status submitted = s->Submit(std::move(r)).status();
    EXPECT_EQ(submitted, checked) << "Submit refuses with CheckState's own answer";
  }
  EXPECT_THAT(s->CheckState(bad_stop).message(), HasSubstr("stop_token_ids: id 260"));
  EXPECT_EQ(s->stats().queued, 0);
}

TEST_F(SchedulerTest, CreateRefusesInvalidOptions) {
  const auto code = [this](GenerationSchedulerOptions o) {
    return GenerationScheduler::Create(lm_, o, &clock_).status().code();
  };
  EXPECT_EQ(code({.max_active_jobs = 0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.max_queued_jobs = -1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prefill_chunk_tokens = 0}), absl::StatusCode::kInvalidArgument);
  GenerationSchedulerOptions no_buffer;
  no_buffer.max_buffered_tokens = 0;
  EXPECT_EQ(code(no_buffer), absl::StatusCode::kInvalidArgument);
  GenerationSchedulerOptions negative_stall;
  negative_stall.stream_stall_timeout = absl::Seconds(-1);
  EXPECT_EQ(code(negative_stall), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerationScheduler::Create(lm_, {}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}), absl::StatusCode::kOk);
}

// Flow control: a consumer that does not take its tokens holds back its own job and nobody else's.

TEST_F(SchedulerTest, AJobWhoseConsumerTakesNothingPausesAfterMaxBufferedTokens) {
  GenerationSchedulerOptions o;
  ASSERT_EQ(o.max_buffered_tokens, 8);
  auto s = Make(o);
  auto lagging = s->Submit(Request(*s, "ab", 100));
  auto reader = s->Submit(Request(*s, "cd", 100, 2));
  ASSERT_TRUE(lagging.ok() && reader.ok());
  Collected r;
  for (int step = 0; step < 20; ++step) {
    s->StepOnce();
    Drain(**reader, r);
  }
  EXPECT_EQ((*lagging)->buffered_tokens(), 8);
  EXPECT_EQ(r.tokens.size(), 20u) << "the reader decoded in every step";
  // Both jobs shared each step until the lagging one had 8 untaken tokens; then the reader went on
  // alone in the same steps.
  std::vector<int32_t> expected(8, 2);
  expected.resize(20, 1);
  EXPECT_EQ(lm_.step_batch_sizes(), expected);
  EXPECT_EQ(s->stats().paused, 1);
  EXPECT_EQ(s->stats().active, 2);
  EXPECT_EQ(s->stats().stalled_jobs, 0);

  s->Shutdown();
  Collected l;
  Drain(**lagging, l);
  ASSERT_EQ(l.tokens.size(), 8u);
  EXPECT_EQ(l.positions.front(), 2);
  EXPECT_EQ(l.positions.back(), 9);
  ASSERT_TRUE(l.final.has_value());
  // Its sequence stopped with its 8th token pending: 2 prompt + 8 new - 1 fed.
  EXPECT_EQ(l.final->snapshot.sequence.position, 9);
  EXPECT_EQ(l.final->generated_tokens, 8);
}

TEST_F(SchedulerTest, APausedJobResumesWhenItsConsumerTakesTokens) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 4;
  auto s = Make(o);
  auto job = s->Submit(Request(*s, "ab", 12, 5, 0.9f));
  ASSERT_TRUE(job.ok());
  for (int step = 0; step < 6; ++step) s->StepOnce();
  EXPECT_EQ((*job)->buffered_tokens(), 4);
  EXPECT_FALSE(s->StepOnce()) << "a paused job leaves the scheduler nothing to do";
  EXPECT_EQ(s->stats().paused, 1);
  EXPECT_EQ(lm_.step_calls(), 4);

  Collected c;
  Take(**job, 3, c);
  EXPECT_EQ((*job)->buffered_tokens(), 1);
  for (int step = 0; step < 10; ++step) s->StepOnce();
  EXPECT_EQ((*job)->buffered_tokens(), 4) << "exactly the 3 taken tokens were made up";
  EXPECT_EQ(lm_.step_calls(), 7);
  EXPECT_EQ(s->stats().paused, 1);

  RunAll(*s, {{*job, &c}});
  ASSERT_EQ(c.tokens.size(), 12u);
  for (size_t i = 0; i < c.positions.size(); ++i)
    EXPECT_EQ(c.positions[i], 2 + static_cast<int64_t>(i));
  EXPECT_EQ(c.tokens, Uninterrupted("ab", 12, 5, 0.9f)) << "pausing changed the tokens";
  EXPECT_EQ(s->stats().paused, 0);
}

TEST_F(SchedulerTest, AJobPausedForTheStallTimeoutIsCancelledWithItsState) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 4;
  o.stream_stall_timeout = absl::Seconds(5);
  auto s = Make(o);
  auto job = s->Submit(Request(*s, "ab", 12, 3, 0.9f));
  ASSERT_TRUE(job.ok());
  for (int step = 0; step < 5; ++step) s->StepOnce();  // 4 tokens, then paused
  EXPECT_EQ(s->stats().paused, 1);
  clock_.Advance(absl::Seconds(4));
  s->StepOnce();
  EXPECT_EQ(s->in_flight(), 1) << "cancelled before the stall timeout";
  EXPECT_EQ(s->stats().stalled_jobs, 0);
  clock_.Advance(absl::Seconds(1));
  s->StepOnce();
  EXPECT_EQ(s->in_flight(), 0);
  EXPECT_EQ(s->stats().stalled_jobs, 1);
  EXPECT_EQ(s->stats().paused, 0);

  Collected c;
  Drain(**job, c);
  ASSERT_EQ(c.tokens.size(), 4u);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.final->generated_tokens, 4);
  EXPECT_EQ(c.final->snapshot.sequence.position, 5);  // 2 prompt + 4 new - 1 pending
  EXPECT_EQ(c.final->snapshot.pending_token, c.tokens.back());
  EXPECT_EQ(c.final->snapshot.generated_tokens, 4);

  // The state it was cancelled with continues exactly where the stream stopped.
  auto elsewhere = Make();
  GenerationRequest cont;
  cont.state = c.final->snapshot;
  cont.max_new_tokens = 8;
  Collected rest;
  auto j2 = elsewhere->Submit(std::move(cont));
  ASSERT_TRUE(j2.ok()) << j2.status();
  RunAll(*elsewhere, {{*j2, &rest}});
  std::vector<int32_t> joined = c.tokens;
  joined.insert(joined.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(joined, Uninterrupted("ab", 12, 3, 0.9f));
}

TEST_F(SchedulerTest, AZeroStallTimeoutNeverCancelsAPausedJob) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 2;
  o.stream_stall_timeout = absl::ZeroDuration();
  auto s = Make(o);
  auto job = s->Submit(Request(*s, "ab", 10));
  ASSERT_TRUE(job.ok());
  for (int step = 0; step < 3; ++step) s->StepOnce();
  clock_.Advance(absl::Hours(24));
  s->StepOnce();
  EXPECT_EQ(s->in_flight(), 1);
  EXPECT_EQ(s->stats().paused, 1);
  EXPECT_EQ(s->stats().stalled_jobs, 0);
  Collected c;
  RunAll(*s, {{*job, &c}});
  EXPECT_EQ(c.tokens.size(), 10u);
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
}

TEST_F(SchedulerTest, CancellingAPausedJobEndsItAtTheNextStep) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 2;
  auto s = Make(o);
  auto job = s->Submit(Request(*s, "ab", 50));
  ASSERT_TRUE(job.ok());
  for (int step = 0; step < 4; ++step) s->StepOnce();
  ASSERT_EQ(s->stats().paused, 1);
  (*job)->Cancel();
  s->StepOnce();
  EXPECT_EQ(s->in_flight(), 0);
  Collected c;
  Drain(**job, c);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final->generated_tokens, 2);
  EXPECT_EQ(s->stats().stalled_jobs, 0);
}

TEST_F(SchedulerTest, TheListenerIsCalledForEveryEvent) {
  auto s = Make();
  GenerationRequest r = Request(*s, "ab", 5);
  r.snapshot_every = 2;
  auto job = s->Submit(std::move(r));
  ASSERT_TRUE(job.ok());
  std::atomic<int> calls{0};
  (*job)->SetListener([&calls] { ++calls; });
  s->StepOnce();
  s->StepOnce();
  EXPECT_EQ(calls.load(), 3);  // two tokens and the snapshot after the second
  Collected c;
  RunAll(*s, {{*job, &c}});
  // 5 tokens, snapshots after tokens 2 and 4, the end.
  EXPECT_EQ(c.tokens.size(), 5u);
  EXPECT_EQ(c.snapshots, 2);
  EXPECT_EQ(calls.load(), 8);

  // A cleared listener is not called again.
  auto quiet = s->Submit(Request(*s, "cd", 3));
  ASSERT_TRUE(quiet.ok());
  std::atomic<int> quiet_calls{0};
  (*quiet)->SetListener([&quiet_calls] { ++quiet_calls; });
  s->StepOnce();
  (*quiet)->SetListener(nullptr);
  s->StepOnce();
  s->StepOnce();
  EXPECT_EQ(quiet_calls.load(), 1);
  EXPECT_EQ((*quiet)->buffered_tokens(), 3);
}

TEST_F(SchedulerTest, AListenerThatTakesEachEventKeepsItsJobFromPausing) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 1;
  auto s = Make(o);
  auto job = s->Submit(Request(*s, "ab", 10));
  ASSERT_TRUE(job.ok());
  GenerationJob* raw = job->get();
  Collected c;
  raw->SetListener([raw, &c] { Drain(*raw, c); });
  for (int step = 0; step < 10; ++step) s->StepOnce();
  EXPECT_EQ(c.tokens.size(), 10u);
  ASSERT_TRUE(c.final.has_value());
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(lm_.step_calls(), 10);
  raw->SetListener(nullptr);
}

// The scheduler's own thread sleeps while its only job is paused; a consumer taking a token must
// wake it, or this consumer would wait out its timeout.
TEST_F(SchedulerTest, TheSchedulerThreadResumesAPausedJobWhenItsConsumerCatchesUp) {
  GenerationSchedulerOptions o;
  o.max_buffered_tokens = 2;
  auto s = Make(o);
  s->Start();
  auto job = s->Submit(Request(*s, "ab", 30, 9, 0.9f));
  ASSERT_TRUE(job.ok());
  Collected c;
  while (!c.final.has_value()) {
    auto e = (*job)->Next(absl::Seconds(60));
    ASSERT_TRUE(e.has_value()) << "no event after " << c.tokens.size() << " tokens";
    EXPECT_LE((*job)->buffered_tokens(), 2);
    Record(*std::move(e), c);
  }
  s->Shutdown();
  EXPECT_EQ(c.final->finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens, Uninterrupted("ab", 30, 9, 0.9f));
}

}  // namespace
}  // namespace tost::service
