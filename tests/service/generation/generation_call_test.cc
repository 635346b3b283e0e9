// GenerationCall's rules, on the engine's fake models, a fake clock, the in-memory session store
// (behind a wrapper that can hold its check-ins, as a slow shared store does) and a fake sink that
// records what a protocol would write. The scheduler is stepped by the test (no engine threads), so
// every listener call runs inline and each test is deterministic and takes milliseconds.
#include "service/generation/generation_call.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "service/engine/clock.h"
#include "service/engine/memory_session_store.h"
#include "tests/service/engine/engine_testing.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

using testing::FakeLanguageModel;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kOwner[] = "alice";

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status _status = (expr);  \
    ASSERT_TRUE(_status.ok()) << _status; \
  } while (false)

// The in-memory store, whose check-ins can be held and completed later on the test's word: what a
// shared store does while its write is in flight (or fails).
class HoldingStore final : public SessionStore {
 public:
  explicit HoldingStore(std::unique_ptr<SessionStore> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<std::string> Add(const std::string& owner, GenerationState state) override {
    return inner_->Add(owner, std::move(state));
  }
  void StopAdding() override { inner_->StopAdding(); }
  absl::StatusOr<GenerationState> Checkout(const std::string& id,
                                           const std::string& owner) override {
    return inner_->Checkout(id, owner);
  }
  void Checkin(const std::string& id, GenerationState state, CheckinDone done) override {
    ++checkins_started_;
    if (!hold_) return Complete(id, std::move(state), std::move(done));
    held_.push_back({id, std::move(state), std::move(done)});
  }
  void Release(const std::string& id) override {
    ++releases_;
    inner_->Release(id);
  }
  absl::StatusOr<GenerationState> Get(const std::string& id, const std::string& owner) override {
    return inner_->Get(id, owner);
  }
  absl::Status Close(const std::string& id, const std::string& owner) override {
    return inner_->Close(id, owner);
  }
  void ReapIdle() override { inner_->ReapIdle(); }
  SessionStoreStats stats() const override { return inner_->stats(); }
  const SessionStoreOptions& options() const override { return inner_->options(); }

  void Hold() { hold_ = true; }
  // Completes the held check-ins: stored, or failed with `failure` (the state is then released
  // unchanged, as a shared store that could not write leaves it).
  void Complete(absl::Status failure = absl::OkStatus()) {
    std::vector<Held> held = std::move(held_);
    held_.clear();
    for (Held& h : held) {
      if (failure.ok()) {
        Complete(h.id, std::move(h.state), std::move(h.done));
      } else {
        inner_->Release(h.id);
        std::move(h.done)(failure);
      }
    }
  }
  size_t held() const { return held_.size(); }
  int checkins_started() const { return checkins_started_; }
  int checkins_done() const { return checkins_done_; }
  int releases() const { return releases_; }

 private:
  struct Held {
    std::string id;
    GenerationState state;
    CheckinDone done;
  };
  void Complete(const std::string& id, GenerationState state, CheckinDone done) {
    inner_->Checkin(id, std::move(state), [this, done = std::move(done)](absl::Status s) mutable {
      ++checkins_done_;
      std::move(done)(std::move(s));
    });
  }

  std::unique_ptr<SessionStore> inner_;
  bool hold_ = false;
  std::vector<Held> held_;
  int checkins_started_ = 0;
  int checkins_done_ = 0;
  int releases_ = 0;
};

// What a protocol would have written, in order.
class RecordingSink final : public CallSink {
 public:
  explicit RecordingSink(const HoldingStore* store) : store_(store) {}

  // The input every choice gets.
  std::string prompt = "It was";
  int32_t max_new_tokens = 6;
  int32_t snapshot_every = 0;
  std::optional<model::SamplingParams> sampling;
  // A sink whose stream takes one event at a time (gRPC: one write in flight) has no room after
  // each token until Wake().
  bool one_at_a_time = false;
  // Token() of this choice fails (a message that cannot be encoded), from its second token on.
  int fail_tokens_of_choice = -1;

  absl::StatusOr<GenerationInput> Input(const AdmittedCall& call) override {
    admitted_model = call.model;
    GenerationInput in;
    in.prompt_text = prompt;
    in.max_new_tokens = max_new_tokens;
    in.snapshot_every = snapshot_every;
    in.sampling = sampling;
    return in;
  }
  void Started(const AdmittedCall& call) override { started_choices = call.choices; }
  bool HasRoom() override { return room; }
  bool NotifyWhenRoom(absl::AnyInvocable<void()> wake) override {
    if (room) return false;
    wake_ = std::move(wake);
    return true;
  }
  absl::Status Token(size_t choice, const TokenEvent& token) override {
    Grow(choice);
    tokens[choice].push_back(token.id);
    text[choice] += token.text;
    if (one_at_a_time) room = false;
    if (static_cast<int>(choice) == fail_tokens_of_choice && tokens[choice].size() > 1) {
      return absl::InternalError("choice's message could not be encoded");
    }
    return absl::OkStatus();
  }
  absl::Status Snapshot(size_t choice, std::string blob, int64_t position) override {
    snapshots.emplace_back(std::move(blob), position);
    if (one_at_a_time) room = false;
    return absl::OkStatus();
  }
  absl::Status Final(size_t choice, const GenerationEvent& event, std::string blob) override {
    Grow(choice);
    finals[choice] = event.finish_reason;
    blobs[choice] = std::move(blob);
    checkins_done_at_final = store_->checkins_done();
    return absl::OkStatus();
  }
  void End(const absl::Status& status, bool gone) override {
    ++ends;
    end_status = status;
    client_gone = gone;
    checkins_done_at_end = store_->checkins_done();
  }
  void Abort() override { ++aborts; }

  // The stream drained what it held: room again, and the call is told.
  void Wake() {
    room = true;
    if (auto wake = std::exchange(wake_, nullptr)) wake();
  }
  size_t TokenCount() const {
    size_t n = 0;
    for (const auto& t : tokens) n += t.size();
    return n;
  }

  bool room = true;
  std::string admitted_model;
  int32_t started_choices = 0;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> text;
  std::vector<std::pair<std::string, int64_t>> snapshots;
  std::vector<std::optional<FinishReason>> finals;
  std::vector<std::string> blobs;
  int ends = 0;
  int aborts = 0;
  absl::Status end_status = absl::UnknownError("not ended");
  bool client_gone = false;
  int checkins_done_at_final = -1;
  int checkins_done_at_end = -1;

 private:
  void Grow(size_t choice) {
    if (tokens.size() <= choice) {
      tokens.resize(choice + 1);
      text.resize(choice + 1);
      finals.resize(choice + 1);
      blobs.resize(choice + 1);
    }
  }
  const HoldingStore* store_;
  absl::AnyInvocable<void()> wake_;
};

class GenerationCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.start_threads = false;
    options.generation.max_buffered_tokens = 2;
    options.generation.stream_stall_timeout = absl::Seconds(30);
    options.session_store =
        [this](SessionStoreContext context) -> absl::StatusOr<std::unique_ptr<SessionStore>> {
      auto store = std::make_unique<HoldingStore>(
          std::make_unique<MemorySessionStore>(context.options, context.clock));
      store_ = store.get();
      return store;
    };
    ModelEntry lm;
    lm.name = lm_.config().name;
    lm.config = lm_.config();
    lm.generator = &lm_;
    lm.weights_sha256 = std::string(32, 'w');
    auto engine =
        Engine::Create({lm}, options, *SessionCodec::Create({"0123456789abcdef-secret"}), &clock_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    scheduler_ = *engine_->Scheduler(lm_.config().name);
    sink_ = std::make_unique<RecordingSink>(store_);
  }

  GenerationCallRequest Request(int32_t choices = 1) {
    GenerationCallRequest r;
    r.owner = kOwner;
    r.model = lm_.config().name;
    r.choices = choices;
    return r;
  }
  std::string NewSession() {
    auto id = engine_->sessions().Add(kOwner, scheduler_->NewState({}));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  // Admits `request` on a new call into sink_; the call is kept by the test (as a front end keeps
  // it) and by its jobs.
  absl::Status Admit(GenerationCallRequest request) {
    call_ = GenerationCall::Create(*engine_, limits_, *sink_);
    return call_->Admit(std::move(request));
  }
  bool StepUntilEnded(int max_steps = 2000) {
    return testing::StepUntil(
        *scheduler_, [&] { return sink_->ends > 0; }, max_steps);
  }
  int64_t Position(const std::string& session) {
    auto state = engine_->sessions().Get(session, kOwner);
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? state->sequence.position : -1;
  }
  GenerationState Open(const std::string& blob) {
    auto identity = engine_->Identity(lm_.config().name);
    auto state = engine_->codec().Decode(blob, *identity, kOwner);
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *std::move(state) : GenerationState();
  }

  FakeLanguageModel lm_;
  FakeClock clock_;
  ServiceLimits limits_;
  // Before the engine, so it outlives it: the engine's shutdown ends what still runs, and the
  // calls' final events reach their sinks then.
  std::unique_ptr<RecordingSink> sink_;
  HoldingStore* store_ = nullptr;  // owned by the engine
  std::unique_ptr<Engine> engine_;
  GenerationScheduler* scheduler_ = nullptr;
  std::shared_ptr<GenerationCall> call_;
};

TEST_F(GenerationCallTest, StreamsEveryTokenAndEndsAfterTheFinal) {
  ASSERT_OK(Admit(Request()));
  ASSERT_TRUE(StepUntilEnded());
  EXPECT_EQ(sink_->admitted_model, lm_.config().name);
  EXPECT_EQ(sink_->started_choices, 1);
  ASSERT_EQ(sink_->tokens.size(), 1u);
  EXPECT_EQ(sink_->tokens[0].size(), 6u);
  EXPECT_EQ(sink_->finals[0], FinishReason::kLength);
  EXPECT_THAT(sink_->blobs[0], IsEmpty());  // neither a blob call nor return_state
  EXPECT_TRUE(sink_->end_status.ok()) << sink_->end_status;
  EXPECT_FALSE(sink_->client_gone);
  EXPECT_EQ(sink_->ends, 1);
}

TEST_F(GenerationCallTest, AStalledReaderIsCutAfterTheStallTimeoutAndItsSessionCheckedIn) {
  const std::string session = NewSession();
  sink_->one_at_a_time = true;  // the first token fills the stream, and nobody reads it
  sink_->max_new_tokens = 50;
  GenerationCallRequest r = Request();
  r.session_id = session;
  ASSERT_OK(Admit(std::move(r)));
  // The job runs until max_buffered_tokens wait untaken, then is paused; nothing is cut yet.
  for (int i = 0; i < 20; ++i) scheduler_->StepOnce();
  EXPECT_EQ(sink_->TokenCount(), 1u);
  EXPECT_EQ(sink_->aborts, 0);
  EXPECT_EQ(sink_->ends, 0);
  EXPECT_EQ(scheduler_->stats().paused, 1);
  clock_.Advance(absl::Seconds(31));
  ASSERT_TRUE(StepUntilEnded());
  EXPECT_EQ(sink_->aborts, 1);
  EXPECT_TRUE(sink_->client_gone);
  EXPECT_EQ(sink_->TokenCount(), 1u);  // nothing more was written to the stuck stream
  EXPECT_EQ(scheduler_->stats().stalled_jobs, 1);
  // The session kept what was generated (the buffered tokens too), and is free again.
  EXPECT_EQ(store_->checkins_done(), 1);
  EXPECT_GT(Position(session), 2);
  EXPECT_TRUE(engine_->sessions().Checkout(session, kOwner).ok());
}

TEST_F(GenerationCallTest, AReaderThatCatchesUpIsNotCut) {
  sink_->one_at_a_time = true;
  ASSERT_OK(Admit(Request()));
  for (int i = 0; i < 200 && sink_->ends == 0; ++i) {
    scheduler_->StepOnce();
    sink_->Wake();
  }
  EXPECT_EQ(sink_->ends, 1);
  EXPECT_EQ(sink_->aborts, 0);
  EXPECT_EQ(sink_->TokenCount(), 6u);
  EXPECT_TRUE(sink_->end_status.ok()) << sink_->end_status;
}

TEST_F(GenerationCallTest, AClientGoneMidStreamCancelsEveryChoice) {
  sink_->max_new_tokens = 200;
  ASSERT_OK(Admit(Request(/*choices=*/3)));
  for (int i = 0; i < 4; ++i) scheduler_->StepOnce();
  const size_t written = sink_->TokenCount();
  EXPECT_GT(written, 0u);
  call_->ClientGone();
  ASSERT_TRUE(StepUntilEnded(/*max_steps=*/3));
  EXPECT_TRUE(sink_->client_gone);
  EXPECT_EQ(sink_->TokenCount(), written);  // nothing after the client left
  EXPECT_EQ(scheduler_->in_flight(), 0);    // every choice's place is back
  for (const auto& f : sink_->finals) EXPECT_FALSE(f.has_value());
}

TEST_F(GenerationCallTest, AClientGoneMidStreamStillChecksTheSessionIn) {
  const std::string session = NewSession();
  sink_->max_new_tokens = 200;
  GenerationCallRequest r = Request();
  r.session_id = session;
  ASSERT_OK(Admit(std::move(r)));
  for (int i = 0; i < 5; ++i) scheduler_->StepOnce();
  const size_t written = sink_->TokenCount();
  call_->ClientGone();
  ASSERT_TRUE(StepUntilEnded(/*max_steps=*/3));
  EXPECT_TRUE(sink_->client_gone);
  EXPECT_EQ(store_->checkins_done(), 1);
  // Nothing lost: the prompt and every token drawn before the cancel are in the session.
  EXPECT_GE(Position(session), static_cast<int64_t>(sink_->prompt.size() + written) - 1);
  EXPECT_TRUE(engine_->sessions().Checkout(session, kOwner).ok());
}

TEST_F(GenerationCallTest, OneFailingChoiceFailsTheCallAndStopsTheOthers) {
  sink_->max_new_tokens = 200;
  sink_->fail_tokens_of_choice = 1;
  ASSERT_OK(Admit(Request(/*choices=*/3)));
  ASSERT_TRUE(StepUntilEnded(/*max_steps=*/20));
  EXPECT_EQ(sink_->end_status.code(), absl::StatusCode::kInternal) << sink_->end_status;
  EXPECT_THAT(sink_->end_status.message(), HasSubstr("could not be encoded"));
  EXPECT_FALSE(sink_->client_gone);
  EXPECT_EQ(scheduler_->in_flight(), 0);
  for (const auto& f : sink_->finals) EXPECT_FALSE(f.has_value());
}

TEST_F(GenerationCallTest, AModelFailureEndsTheCallWithItsError) {
  lm_.FailStepsWith(absl::InternalError("the device is lost"));
  ASSERT_OK(Admit(Request(/*choices=*/2)));
  ASSERT_TRUE(StepUntilEnded(/*max_steps=*/20));
  EXPECT_THAT(sink_->end_status.message(), HasSubstr("the device is lost"));
  EXPECT_EQ(scheduler_->in_flight(), 0);
}

TEST_F(GenerationCallTest, TheSessionIsCheckedInBeforeTheClientHearsTheEnd) {
  const std::string session = NewSession();
  store_->Hold();  // a shared store whose write is still in flight
  GenerationCallRequest r = Request();
  r.session_id = session;
  ASSERT_OK(Admit(std::move(r)));
  ASSERT_TRUE(testing::StepUntil(*scheduler_, [&] { return store_->held() == 1; }));
  for (int i = 0; i < 5; ++i) scheduler_->StepOnce();
  EXPECT_EQ(sink_->TokenCount(), 6u);
  EXPECT_FALSE(sink_->finals[0].has_value());  // the final waits for the store
  EXPECT_EQ(sink_->ends, 0);
  store_->Complete();
  EXPECT_EQ(sink_->finals[0], FinishReason::kLength);
  EXPECT_EQ(sink_->checkins_done_at_final, 1);
  EXPECT_EQ(sink_->checkins_done_at_end, 1);
  EXPECT_TRUE(sink_->end_status.ok()) << sink_->end_status;
  EXPECT_EQ(Position(session), static_cast<int64_t>(sink_->prompt.size()) + 6 - 1);
}

TEST_F(GenerationCallTest, AFailedCheckinFailsTheCall) {
  const std::string session = NewSession();
  store_->Hold();
  GenerationCallRequest r = Request();
  r.session_id = session;
  ASSERT_OK(Admit(std::move(r)));
  ASSERT_TRUE(testing::StepUntil(*scheduler_, [&] { return store_->held() == 1; }));
  store_->Complete(absl::UnavailableError("the shared store did not answer"));
  EXPECT_EQ(sink_->ends, 1);
  EXPECT_EQ(sink_->end_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(sink_->finals[0].has_value());
}

TEST_F(GenerationCallTest, ReturnStateGivesEachChoiceItsFinalState) {
  model::SamplingParams sampling;
  sampling.seed = 7;
  sink_->sampling = sampling;
  GenerationCallRequest r = Request(/*choices=*/2);
  r.return_state = true;
  ASSERT_OK(Admit(std::move(r)));
  ASSERT_TRUE(StepUntilEnded());
  ASSERT_EQ(sink_->blobs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_FALSE(sink_->blobs[i].empty());
    const GenerationState state = Open(sink_->blobs[i]);
    EXPECT_EQ(state.sequence.position, static_cast<int64_t>(sink_->prompt.size()) + 6 - 1);
    EXPECT_EQ(state.pending_token, sink_->tokens[i].back());
  }
  // Two choices of one request draw differently (each its own seed).
  EXPECT_NE(sink_->tokens[0], sink_->tokens[1]);
}

TEST_F(GenerationCallTest, AStateBlobCallGetsItsStateBackUnasked) {
  GenerationCallRequest first = Request();
  first.return_state = true;
  ASSERT_OK(Admit(std::move(first)));
  ASSERT_TRUE(StepUntilEnded());
  const std::string blob = sink_->blobs[0];
  sink_ = std::make_unique<RecordingSink>(store_);
  GenerationCallRequest second = Request();
  second.model = "";  // the blob's
  second.state_blob = blob;
  ASSERT_OK(Admit(std::move(second)));
  ASSERT_TRUE(StepUntilEnded());
  ASSERT_FALSE(sink_->blobs[0].empty());
  EXPECT_EQ(Open(sink_->blobs[0]).sequence.position, Open(blob).sequence.position + 6 + 6);
}

TEST_F(GenerationCallTest, ADrainedChoiceGetsItsStateBackUnasked) {
  sink_->max_new_tokens = 500;
  ASSERT_OK(Admit(Request()));
  for (int i = 0; i < 3; ++i) scheduler_->StepOnce();
  scheduler_->Shutdown();
  ASSERT_EQ(sink_->ends, 1);
  EXPECT_EQ(sink_->finals[0], FinishReason::kDrained);
  ASSERT_FALSE(sink_->blobs[0].empty());
  EXPECT_GT(Open(sink_->blobs[0]).sequence.position, 0);
}

TEST_F(GenerationCallTest, SnapshotsCarryTheSealedState) {
  sink_->snapshot_every = 2;
  ASSERT_OK(Admit(Request()));
  ASSERT_TRUE(StepUntilEnded());
  ASSERT_FALSE(sink_->snapshots.empty());
  for (const auto& [blob, position] : sink_->snapshots) {
    EXPECT_EQ(Open(blob).sequence.position, position);
  }
}

TEST_F(GenerationCallTest, AConstraintContinuesAcrossAStateBlob) {
  // Twelve lowercase letters in all: three drawn by the first call, the rest by the second, whose
  // prompt is part of the constrained output.
  GenerationCallRequest first = Request();
  first.constraint = structured::Constraint{
      .kind = structured::Constraint::Kind::kRegex, .text = "[a-z]{12}", .choices = {}};
  first.return_state = true;
  sink_->max_new_tokens = 3;
  if (absl::Status s = Admit(std::move(first)); !s.ok()) {
    if (s.code() == absl::StatusCode::kFailedPrecondition) GTEST_SKIP() << s;  // no XGrammar
    FAIL() << s;
  }
  ASSERT_TRUE(StepUntilEnded());
  ASSERT_TRUE(sink_->end_status.ok()) << sink_->end_status;
  const std::string first_text = sink_->text[0];
  const std::string blob = sink_->blobs[0];
  ASSERT_TRUE(Open(blob).constraint.has_value());

  sink_ = std::make_unique<RecordingSink>(store_);
  sink_->prompt = "ab";
  sink_->max_new_tokens = 50;
  GenerationCallRequest second = Request();
  second.state_blob = blob;
  ASSERT_OK(Admit(std::move(second)));
  ASSERT_TRUE(StepUntilEnded());
  ASSERT_TRUE(sink_->end_status.ok()) << sink_->end_status;
  EXPECT_EQ(sink_->finals[0], FinishReason::kEos);
  const std::string all = first_text + "ab" + sink_->text[0];
  EXPECT_EQ(all.size(), 12u) << all;
  for (char c : all) EXPECT_TRUE(c >= 'a' && c <= 'z') << all;

  // Asked to, a blob call drops its state's constraint instead.
  sink_ = std::make_unique<RecordingSink>(store_);
  GenerationCallRequest cleared = Request();
  cleared.state_blob = blob;
  cleared.clear_constraint = true;
  ASSERT_OK(Admit(std::move(cleared)));
  ASSERT_TRUE(StepUntilEnded());
  EXPECT_FALSE(Open(sink_->blobs[0]).constraint.has_value());
}

TEST_F(GenerationCallTest, AFailedAdmissionHoldsNothing) {
  const std::string session = NewSession();
  sink_->prompt = std::string(static_cast<size_t>(limits_.max_prompt_bytes) + 1, 'x');
  GenerationCallRequest r = Request(/*choices=*/1);
  r.session_id = session;
  const absl::Status s = Admit(std::move(r));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(store_->releases(), 1);
  EXPECT_TRUE(engine_->sessions().Checkout(session, kOwner).ok());  // not left busy
  EXPECT_EQ(scheduler_->stats().reserved, 0);                       // places back
  EXPECT_EQ(sink_->started_choices, 0);
}

TEST_F(GenerationCallTest, ACancelDuringAdmissionEndsTheCallOnceAdmitted) {
  const std::string session = NewSession();
  call_ = GenerationCall::Create(*engine_, limits_, *sink_);
  call_->Cancel();  // the RPC was cancelled while its admission waited
  GenerationCallRequest r = Request();
  r.session_id = session;
  ASSERT_OK(call_->Admit(std::move(r)));
  ASSERT_TRUE(StepUntilEnded(/*max_steps=*/3));
  EXPECT_EQ(sink_->end_status.code(), absl::StatusCode::kCancelled) << sink_->end_status;
  EXPECT_EQ(sink_->TokenCount(), 0u);
  EXPECT_EQ(store_->checkins_done(), 1);  // the session is free again
}

TEST_F(GenerationCallTest, TooManyChoicesAreRefusedBeforeAnyWork) {
  const absl::Status s = Admit(Request(/*choices=*/17));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("1 to 16 choices, got 17"));
  EXPECT_EQ(scheduler_->stats().reserved, 0);
}

}  // namespace
}  // namespace tost::service
