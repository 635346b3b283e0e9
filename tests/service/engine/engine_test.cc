// The Engine on fake models: model lookup and its errors, Create's refusals, classification through
// the dynamic batcher, admission and draining, statistics, and a generation carried through a
// session and an exported blob. Most tests run without the engine's threads (start_threads=false)
// and step the scheduler themselves; those that need the batcher's worker say why.
#include "service/engine/engine.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/functional/function_ref.h"
#include "absl/time/clock.h"
#include "tests/service/engine/engine_testing.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

using ::testing::ElementsAre;
using testing::FakeClassifierModel;
using testing::FakeLanguageModel;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Waits for a state another thread reaches (a request queued in the batcher): yields instead of
// sleeping a guessed time, and gives up after a minute of real time so a bug fails rather than
// hangs.
bool Eventually(absl::FunctionRef<bool()> reached) {
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (!reached()) {
    if (absl::Now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

// Runs a classification on its own thread: ServedClassifier::Classify blocks until the batch has
// run.
class Classification {
 public:
  Classification(const Engine& engine, std::vector<float> pixels, int64_t images)
      : thread_([this, &engine, pixels = std::move(pixels), images]() mutable {
          absl::StatusOr<ServedClassifier> vit = engine.Classifier("vit");
          if (!vit.ok()) {
            result_ = vit.status();
            return;
          }
          auto reservation = vit->Reserve(images);
          if (!reservation.ok()) {
            result_ = reservation.status();
            return;
          }
          result_ = vit->Classify(*std::move(reservation), std::move(pixels), images,
                                  absl::InfiniteFuture());
        }) {}
  ~Classification() {
    if (thread_.joinable()) thread_.join();
  }
  const absl::StatusOr<std::vector<float>>& Result() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  absl::StatusOr<std::vector<float>> result_ = absl::UnknownError("not run");
  std::thread thread_;
};

class EngineTest : public ::testing::Test {
 protected:
  std::vector<ModelEntry> Models() {
    ModelEntry vit;
    vit.name = "vit";
    vit.config = vit_.config();
    vit.classifier = &vit_;
    ModelEntry lm;
    lm.name = "lm";
    lm.config = lm_.config();
    lm.generator = &lm_;
    lm.weights_sha256 = kWeights;
    ModelEntry broken;
    broken.name = "broken";
    broken.load_status = absl::DataLossError("model.safetensors is truncated at byte 12");
    return {vit, lm, broken};
  }
  static SessionCodec Codec() { return *SessionCodec::Create({"0123456789abcdef-secret"}); }
  static EngineOptions Unthreaded() {
    EngineOptions o;
    o.start_threads = false;
    return o;
  }
  // A fresh generation of `max_new` tokens after `prompt` (bytes), admitted by `s`.
  static absl::StatusOr<std::shared_ptr<GenerationJob>> Submit(GenerationScheduler& s,
                                                               const std::string& prompt,
                                                               int32_t max_new) {
    GenerationRequest r;
    r.state = s.NewState({});
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = max_new;
    return s.Submit(std::move(r));
  }
  std::unique_ptr<Engine> Make(EngineOptions options, Clock* clock = nullptr) {
    auto engine = Engine::Create(Models(), options, Codec(), clock != nullptr ? clock : &clock_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  // `images` images whose pixels are all different (so rows cannot be mixed up unnoticed).
  std::vector<float> Pixels(int64_t images, float offset) const {
    std::vector<float> p(images * vit_.image_floats());
    for (size_t i = 0; i < p.size(); ++i) p[i] = offset + 0.01f * static_cast<float>(i);
    return p;
  }
  std::vector<float> Expected(const std::vector<float>& pixels) const {
    std::vector<float> out;
    for (size_t i = 0; i < pixels.size(); i += vit_.image_floats()) {
      const auto row = vit_.ExpectedLogits(
          absl::MakeConstSpan(pixels).subspan(i, static_cast<size_t>(vit_.image_floats())));
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }
  int64_t QueuedClassifications(const Engine& engine) const {
    return engine.Stats().classifiers.at(0).batcher.queued_requests;
  }
  // Steps `scheduler` until `job` ends (bounded); returns its tokens and its end.
  std::pair<std::vector<int32_t>, std::optional<GenerationEvent>> Run(GenerationScheduler& s,
                                                                      GenerationJob& job) {
    testing::Collected run = testing::RunToEnd(s, job, /*max_steps=*/1000);
    if (!run.final.has_value()) ADD_FAILURE() << "the job did not finish";
    return {std::move(run.tokens), std::move(run.final)};
  }

  static inline const std::string kWeights = std::string(32, 'w');
  FakeClassifierModel vit_{{.name = "vit"}};
  FakeLanguageModel lm_{{.name = "lm"}};
  FakeClock clock_;
};

TEST_F(EngineTest, AnUnknownModelIsNotFoundAndTheErrorListsTheRepository) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  for (const absl::Status& s :
       {engine->Find("nope").status(), engine->Classifier("nope").status(),
        engine->Scheduler("nope").status(), engine->Identity("nope").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_THAT(s.message(), HasSubstr("\"nope\"")) << s;
    EXPECT_THAT(s.message(), HasSubstr("[vit, lm, broken]")) << s;
  }
  ASSERT_TRUE(engine->Find("broken").ok()) << "a model that failed to load is still listed";
  EXPECT_EQ(engine->models().size(), 3u);
  EXPECT_EQ(engine->models()[1].name, "lm");
}

TEST_F(EngineTest, AModelThatFailedToLoadIsRefusedWithItsLoadError) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  for (const absl::Status& s :
       {engine->Classifier("broken").status(), engine->Scheduler("broken").status(),
        engine->Identity("broken").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("model.safetensors is truncated at byte 12")) << s;
  }
}

TEST_F(EngineTest, AModelOfTheOtherKindIsRefusedNamingTheRpcItNeeds) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  for (const absl::Status& s : {engine->Classifier("lm").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("Classify")) << s;
  }
  for (const absl::Status& s :
       {engine->Scheduler("vit").status(), engine->Identity("vit").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("Generate")) << s;
  }
  EXPECT_EQ(&engine->Classifier("vit")->model(), &vit_);
  EXPECT_EQ(&(*engine->Scheduler("lm"))->model(), &lm_);
}

TEST_F(EngineTest, CreateRefusesInconsistentModelsAndInvalidOptions) {
  const auto code = [](std::vector<ModelEntry> models, EngineOptions options, Clock* clock) {
    return Engine::Create(std::move(models), options, Codec(), clock).status().code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(Models(), Unthreaded(), nullptr), kInvalid) << "no clock";

  EngineOptions bad_generation = Unthreaded();
  bad_generation.generation.max_active_jobs = 0;
  EXPECT_EQ(code(Models(), bad_generation, &clock_), kInvalid);
  EngineOptions bad_sessions = Unthreaded();
  bad_sessions.sessions.max_sessions = 0;
  EXPECT_EQ(code(Models(), bad_sessions, &clock_), kInvalid);
  EngineOptions bad_batching = Unthreaded();
  bad_batching.batching.max_batch_images = 0;
  EXPECT_EQ(code(Models(), bad_batching, &clock_), kInvalid);
  // One caller may not hold more compile slots than there are.
  EngineOptions bad_constraints = Unthreaded();
  bad_constraints.constraints.max_compiles = 2;
  bad_constraints.constraints.max_compiles_per_caller = 3;
  EXPECT_EQ(code(Models(), bad_constraints, &clock_), kInvalid);
  const absl::Status refused = ValidateConstraintCompilerOptions(bad_constraints.constraints);
  EXPECT_THAT(refused.message(), HasSubstr("max_compiles_per_caller"));

  std::vector<ModelEntry> twins = Models();
  twins[2].name = "vit";
  EXPECT_EQ(code(twins, Unthreaded(), &clock_), kInvalid) << "two models named vit";
  std::vector<ModelEntry> neither = Models();
  neither[0].classifier = nullptr;
  EXPECT_EQ(code(neither, Unthreaded(), &clock_), kInvalid) << "a served model with no interface";
  std::vector<ModelEntry> both = Models();
  both[1].classifier = &vit_;
  EXPECT_EQ(code(both, Unthreaded(), &clock_), kInvalid) << "a served model with two interfaces";
  std::vector<ModelEntry> no_hash = Models();
  no_hash[1].weights_sha256 = std::string(31, 'w');
  EXPECT_EQ(code(no_hash, Unthreaded(), &clock_), kInvalid) << "a generator without its hash";

  EXPECT_EQ(code(Models(), Unthreaded(), &clock_), absl::StatusCode::kOk);
  EXPECT_EQ(code({}, Unthreaded(), &clock_), absl::StatusCode::kOk) << "an empty repository";
}

// With the batcher's worker running, a batch that closes only when full (the delay is far longer
// than any test) shows that concurrent requests meet in one call of the model, whatever the
// threads' timing.
TEST_F(EngineTest, ConcurrentClassificationsShareOneCallOfTheModel) {
  EngineOptions o;
  o.batching.max_batch_images = 4;
  o.batching.max_queue_delay_us = 600'000'000;
  o.batching.timeout_us = 60'000'000;  // a bug fails after a minute instead of hanging
  auto engine = Make(o, RealClock::Get());
  ASSERT_NE(engine, nullptr);
  const std::vector<float> a = Pixels(1, 0.f), b = Pixels(2, 1.f), c = Pixels(1, -2.f);
  {
    Classification ra(*engine, a, 1), rb(*engine, b, 2), rc(*engine, c, 1);
    ASSERT_TRUE(ra.Result().ok()) << ra.Result().status();
    ASSERT_TRUE(rb.Result().ok()) << rb.Result().status();
    ASSERT_TRUE(rc.Result().ok()) << rc.Result().status();
    EXPECT_EQ(*ra.Result(), Expected(a));
    EXPECT_EQ(*rb.Result(), Expected(b));
    EXPECT_EQ(*rc.Result(), Expected(c));
  }
  EXPECT_THAT(vit_.batch_sizes(), ElementsAre(4));
  const DynamicBatcherStats st = engine->Stats().classifiers.at(0).batcher;
  EXPECT_EQ(st.batches_run, 1);
  EXPECT_EQ(st.images_run, 4);
}

TEST_F(EngineTest, AClassifierErrorIsTheClassificationsAnswer) {
  EngineOptions o;
  o.batching.max_queue_delay_us = 0;  // run each request as it comes
  auto engine = Make(o, RealClock::Get());
  ASSERT_NE(engine, nullptr);
  vit_.FailWith(absl::InternalError("CUDA error: an illegal memory access"));
  Classification r(*engine, Pixels(1, 0.f), 1);
  EXPECT_EQ(r.Result().status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.Result().status().message(), HasSubstr("illegal memory access"));
}

TEST_F(EngineTest, AFullQueueIsRefusedBeforeAnyWork) {
  EngineOptions o = Unthreaded();
  o.batching.max_queue_size = 2;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  std::optional<DynamicBatcher::Reservation> first, second;
  {
    auto s1 = engine->Classifier("vit")->Reserve(1);
    auto s2 = engine->Classifier("vit")->Reserve(1);
    ASSERT_TRUE(s1.ok() && s2.ok());
    first.emplace(*std::move(s1));
    second.emplace(*std::move(s2));
  }
  auto refused = engine->Classifier("vit")->Reserve(1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("retry"));
  EXPECT_THAT(vit_.batch_sizes(), IsEmpty());
  EXPECT_EQ(engine->Stats().classifiers.at(0).batcher.rejected_queue_full, 1);
  EXPECT_EQ(engine->Stats().classifiers.at(0).batcher.reserved_requests, 2);

  first.reset();  // an unused reservation gives its place back
  EXPECT_TRUE(engine->Classifier("vit")->Reserve(1).ok());
  second.reset();
}

TEST_F(EngineTest, StopAdmittingRunsQueuedWorkAndRefusesNewWork) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  auto job = Submit(*s, "hi", 5);
  ASSERT_TRUE(job.ok()) << job.status();
  s->StepOnce();

  const std::vector<float> pixels = Pixels(1, 0.5f);
  Classification queued(*engine, pixels, 1);
  ASSERT_TRUE(Eventually([&] { return QueuedClassifications(*engine) == 1; }));
  EXPECT_FALSE(engine->draining());

  engine->StopAdmitting();
  EXPECT_TRUE(engine->draining());
  EXPECT_TRUE(engine->Stats().draining);
  ASSERT_TRUE(queued.Result().ok()) << queued.Result().status();
  EXPECT_EQ(*queued.Result(), Expected(pixels));
  EXPECT_THAT(vit_.batch_sizes(), ElementsAre(1));
  EXPECT_EQ(engine->Classifier("vit")->Reserve(1).status().code(), absl::StatusCode::kUnavailable);
  GenerationRequest late;
  late.state = s->NewState({});
  late.prompt = {'x'};
  EXPECT_EQ(s->Submit(std::move(late)).status().code(), absl::StatusCode::kUnavailable);

  // The admitted generation runs to its end.
  EXPECT_EQ(engine->generations_in_flight(), 1);
  auto [tokens, end] = Run(*s, **job);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->finish_reason, FinishReason::kLength);
  EXPECT_EQ(tokens.size(), 5u);
  EXPECT_EQ(engine->generations_in_flight(), 0);
}

TEST_F(EngineTest, ShutdownDrainsGenerationsWithTheirStateAndFailsQueuedClassifications) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  auto job = Submit(*s, "hi", 100);
  ASSERT_TRUE(job.ok()) << job.status();
  s->StepOnce();
  s->StepOnce();
  Classification queued(*engine, Pixels(1, 0.f), 1);
  ASSERT_TRUE(Eventually([&] { return QueuedClassifications(*engine) == 1; }));

  engine->Shutdown();
  EXPECT_EQ(queued.Result().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(vit_.batch_sizes(), IsEmpty());
  EXPECT_EQ(engine->generations_in_flight(), 0);
  std::optional<GenerationEvent> end;
  int tokens = 0;
  while (auto e = (*job)->TryNext()) {
    if (e->kind == GenerationEvent::Kind::kToken) ++tokens;
    if (e->kind == GenerationEvent::Kind::kFinished) end = *std::move(e);
  }
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->finish_reason, FinishReason::kDrained);
  EXPECT_EQ(tokens, 2);
  EXPECT_EQ(end->snapshot.sequence.position, 3);  // 2 prompt + 2 new, the last one pending
  engine->Shutdown();                             // idempotent
}

TEST_F(EngineTest, StatsDescribeEveryServedModelAndTheSessions) {
  EngineOptions o = Unthreaded();
  o.generation.max_active_jobs = 7;
  o.generation.max_queued_jobs = 9;
  o.batching.max_queue_size = 5;
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  ASSERT_TRUE(Submit(*s, "abc", 2).ok());
  s->StepOnce();
  ASSERT_TRUE(engine->sessions().Add("alice", s->NewState({})).ok());

  const EngineStats st = engine->Stats();
  EXPECT_FALSE(st.draining);
  ASSERT_EQ(st.generators.size(), 1u);
  EXPECT_EQ(st.generators[0].model, "lm");
  EXPECT_EQ(st.generators[0].max_active, 7);
  EXPECT_EQ(st.generators[0].max_queued, 9);
  EXPECT_EQ(st.generators[0].state_bytes_per_session,
            static_cast<int64_t>(s->NewState({}).ByteSize()));
  EXPECT_GE(st.generators[0].state_bytes_per_session,
            static_cast<int64_t>(lm_.NewSequence().stats.size() * sizeof(float)));
  EXPECT_EQ(st.generators[0].scheduler.decode_steps, 1);
  EXPECT_EQ(st.generators[0].scheduler.active, 1);
  EXPECT_EQ(st.generators[0].scheduler.prefill_tokens, 2);
  ASSERT_EQ(st.classifiers.size(), 1u);
  EXPECT_EQ(st.classifiers[0].model, "vit");
  EXPECT_EQ(st.classifiers[0].max_queue_size, 5);
  EXPECT_EQ(st.sessions.sessions, 1);
  EXPECT_EQ(st.sessions.state_bytes, static_cast<int64_t>(s->NewState({}).ByteSize()));
}

TEST_F(EngineTest, IdentityIsTheGeneratorsConfigAndWeightsHash) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  auto id = engine->Identity("lm");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->config, &lm_.config());
  EXPECT_EQ(id->weights_sha256, kWeights);
}

// A session's whole life on one engine, then on another: generate on a checked-out session, check
// it in, export it as a blob, import the blob elsewhere and continue. The tokens must be those of
// one uninterrupted generation.
TEST_F(EngineTest, AGenerationContinuesThroughASessionAndAnExportedBlob) {
  auto engine = Make(Unthreaded());
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  const model::SamplingParams sampling{.temperature = 0.8f, .seed = 11};

  auto id = engine->sessions().Add("alice", s->NewState(sampling));
  ASSERT_TRUE(id.ok()) << id.status();
  auto checked_out = engine->sessions().Checkout(*id, "alice");
  ASSERT_TRUE(checked_out.ok()) << checked_out.status();
  EXPECT_EQ(engine->sessions().stats().busy, 1);
  EXPECT_EQ(engine->sessions().Checkout(*id, "bob").status().code(), absl::StatusCode::kNotFound);
  GenerationRequest first;
  first.state = *std::move(checked_out);
  first.prompt = {'H', 'e', 'l', 'l', 'o'};
  first.max_new_tokens = 6;
  first.persistent = true;
  auto j1 = s->Submit(std::move(first));
  ASSERT_TRUE(j1.ok()) << j1.status();
  auto [part1, end1] = Run(*s, **j1);
  ASSERT_TRUE(end1.has_value());
  ASSERT_TRUE(engine->sessions().CheckinAndWait(*id, end1->snapshot).ok());
  EXPECT_EQ(engine->sessions().stats().busy, 0);

  auto stored = engine->sessions().Get(*id, "alice");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->sequence.position, 10);  // 5 prompt + 6 new, the last one pending
  EXPECT_EQ(stored->generated_tokens, 6);
  auto identity = engine->Identity("lm");
  ASSERT_TRUE(identity.ok());
  const std::string blob = engine->codec().Encode(*stored, *identity, "alice");
  EXPECT_EQ(*engine->codec().PeekModel(blob), "lm");
  // One lookup gives an admission its scheduler and the identity blobs must match.
  auto served = engine->Generator("lm");
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->scheduler, *engine->Scheduler("lm"));
  EXPECT_EQ(served->identity.config, identity->config);
  EXPECT_EQ(served->identity.weights_sha256, identity->weights_sha256);
  EXPECT_EQ(engine->Generator("nope").status().code(), absl::StatusCode::kNotFound);

  // Another replica with the same model and key.
  FakeClock other_clock;
  auto other = Engine::Create(Models(), Unthreaded(), Codec(), &other_clock);
  ASSERT_TRUE(other.ok()) << other.status();
  auto decoded = (*other)->codec().Decode(blob, *(*other)->Identity("lm"), "alice");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->sequence.stats, stored->sequence.stats);
  EXPECT_EQ(decoded->pending_token, stored->pending_token);
  GenerationScheduler* s2 = *(*other)->Scheduler("lm");
  GenerationRequest second;
  second.state = *std::move(decoded);
  second.max_new_tokens = 4;
  auto j2 = s2->Submit(std::move(second));
  ASSERT_TRUE(j2.ok()) << j2.status();
  auto [part2, end2] = Run(*s2, **j2);
  ASSERT_TRUE(end2.has_value());
  EXPECT_EQ(end2->snapshot.generated_tokens, 10);

  GenerationRequest whole;
  whole.state = s->NewState(sampling);
  whole.prompt = {'H', 'e', 'l', 'l', 'o'};
  whole.max_new_tokens = 10;
  auto j = s->Submit(std::move(whole));
  ASSERT_TRUE(j.ok()) << j.status();
  auto [uninterrupted, end] = Run(*s, **j);
  ASSERT_TRUE(end.has_value());
  std::vector<int32_t> joined = part1;
  joined.insert(joined.end(), part2.begin(), part2.end());
  EXPECT_EQ(joined, uninterrupted);
}

TEST_F(EngineTest, IdleSessionsAreReapedOnTheInjectedClock) {
  EngineOptions o = Unthreaded();
  o.sessions.idle_timeout = absl::Minutes(1);
  auto engine = Make(o);
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  auto id = engine->sessions().Add("alice", s->NewState({}));
  ASSERT_TRUE(id.ok());
  clock_.Advance(absl::Seconds(59));
  engine->ReapIdleSessions();
  EXPECT_EQ(engine->Stats().sessions.sessions, 1);
  clock_.Advance(absl::Seconds(1));
  engine->ReapIdleSessions();
  EXPECT_EQ(engine->Stats().sessions.sessions, 0);
  EXPECT_EQ(engine->Stats().sessions.evicted_idle, 1);
}

// With its threads, the engine runs generations without anyone stepping them.
TEST_F(EngineTest, WithItsThreadsTheEngineRunsGenerationsOnItsOwn) {
  auto engine = Make(EngineOptions{});
  ASSERT_NE(engine, nullptr);
  GenerationScheduler* s = *engine->Scheduler("lm");
  auto job = Submit(*s, "ok", 20);
  ASSERT_TRUE(job.ok()) << job.status();
  int tokens = 0;
  std::optional<GenerationEvent> end;
  while (!end.has_value()) {
    auto e = (*job)->Next(absl::Minutes(1));
    ASSERT_TRUE(e.has_value()) << "no event after " << tokens << " tokens";
    if (e->kind == GenerationEvent::Kind::kToken) ++tokens;
    if (e->kind == GenerationEvent::Kind::kFinished) end = *std::move(e);
  }
  EXPECT_EQ(tokens, 20);
  EXPECT_EQ(end->finish_reason, FinishReason::kLength);
  // The job leaves the count at the end of the step that published its last event.
  EXPECT_TRUE(Eventually([&] { return engine->generations_in_flight() == 0; }));
}

}  // namespace
}  // namespace tost::service
