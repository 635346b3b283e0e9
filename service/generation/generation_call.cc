#include "service/generation/generation_call.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/generation/generation_limits.h"

namespace tost::service {

std::shared_ptr<GenerationCall> GenerationCall::Create(Engine& engine, const ServiceLimits& limits,
                                                       CallSink& sink) {
  return std::shared_ptr<GenerationCall>(new GenerationCall(engine, limits, sink, nullptr));
}

std::shared_ptr<GenerationCall> GenerationCall::Create(Engine& engine, const ServiceLimits& limits,
                                                       std::shared_ptr<CallSink> sink) {
  CallSink& ref = *sink;
  return std::shared_ptr<GenerationCall>(new GenerationCall(engine, limits, ref, std::move(sink)));
}

absl::Status GenerationCall::Admit(GenerationCallRequest request) {
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  if (absl::Status admitted = AdmitJobs(request, jobs); !admitted.ok()) {
    if (!source_.checked_out.empty()) engine_.sessions().Release(source_.checked_out);
    return admitted;
  }
  // Before any event reaches the sink: the sink builds its replies from what was resolved.
  admitting_sink_->Started({.model = source_.model,
                            .generator = &source_.scheduler->model(),
                            .choices = static_cast<int32_t>(jobs.size())});
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    jobs_ = jobs;
    finished_.assign(jobs_.size(), false);
    remaining_ = jobs_.size();
    checked_out_ = source_.checked_out;
    started_ = true;
    // Cancelled while it was admitted: the jobs end at once, and their final events (the session's
    // state back, CANCELLED) end the call as any cancel does.
    cancel = cancelled_;
  }
  for (auto& job : jobs) job->SetListener([self = shared_from_this()] { self->Pump(); });
  if (cancel) {
    for (auto& job : jobs) job->Cancel();
  }
  Pump();  // events published before the listeners were set
  return absl::OkStatus();
}

absl::Status GenerationCall::AdmitJobs(GenerationCallRequest& request,
                                       std::vector<std::shared_ptr<GenerationJob>>& jobs) {
  CallSink& sink = *admitting_sink_;
  if (request.choices < 1 || request.choices > kMaxChoicesPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a generation asks for 1 to ", kMaxChoicesPerRequest, " choices, got ", request.choices));
  }
  if (request.choices > 1 && !request.session_id.empty()) {
    // One session holds one sequence: its state cannot take two continuations back.
    return absl::InvalidArgumentError(
        absl::StrCat("a generation continuing a session takes 1 choice, got ", request.choices));
  }
  if (request.prompt_cache_key.size() > kMaxPromptCacheKeyChars) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.names.prompt_cache_key, " must be at most ", kMaxPromptCacheKeyChars,
                     " characters, got ", request.prompt_cache_key.size()));
  }
  owner_ = request.owner;
  TOST_RETURN_IF_ERROR(engine_.tenants().CheckPriority(owner_, request.priority));
  const bool fresh = request.session_id.empty() && !request.state_blob.has_value();
  {
    auto source =
        ResolveGenerationSource(engine_, owner_, request.model, request.session_id,
                                request.state_blob.value_or(std::string()), request.names.model);
    if (!source.ok()) return sink.Refine(AdmissionStep::kResolve, source.status());
    source_ = *std::move(source);
  }
  GenerationScheduler& scheduler = *source_.scheduler;
  // A place per choice first: a full or draining scheduler refuses before the prompt (up to a MiB)
  // is rendered and tokenised. Places taken before a refusal go back as the reservations drop.
  std::vector<GenerationScheduler::Reservation> reservations;
  for (int32_t i = 0; i < request.choices; ++i) {
    auto reservation = scheduler.Reserve(owner_);
    if (!reservation.ok()) return sink.Refine(AdmissionStep::kReserve, reservation.status());
    reservations.push_back(*std::move(reservation));
  }
  const AdmittedCall admitted{
      .model = source_.model, .generator = &scheduler.model(), .choices = request.choices};
  absl::StatusOr<GenerationInput> input = sink.Input(admitted);
  if (!input.ok()) return sink.Refine(AdmissionStep::kInput, input.status());
  return_state_ = request.state_blob.has_value() || request.return_state;
  std::vector<GenerationRequest> job_requests;
  for (int32_t i = 0; i < request.choices; ++i) {
    GenerationInput choice = *input;
    if (choice.sampling.has_value()) choice.sampling->seed = ChoiceSeed(choice.sampling->seed, i);
    auto job_request =
        BuildGenerationRequest(choice, scheduler, source_.state, limits_, request.names);
    if (!job_request.ok()) return sink.Refine(AdmissionStep::kInput, job_request.status());
    // On this (an admission) thread, with the places held: a compile waits at most the engine's
    // max_compile_ms, and never on the scheduler's thread. One TokenConstraint per choice (each
    // steps its own); the choices after the first find the compiled form in the model's cache.
    if (request.constraint.has_value()) {
      auto compiled = engine_.CompileConstraint(source_.model, *request.constraint, owner_);
      if (!compiled.ok()) return sink.Refine(AdmissionStep::kCompileConstraint, compiled.status());
      job_request->constraint = *std::move(compiled);
    } else if (absl::Status continued =
                   ContinueStateConstraint(engine_, source_.model, owner_, request.clear_constraint,
                                           StateName(request.session_id), *job_request);
               !continued.ok()) {
      return sink.Refine(AdmissionStep::kContinueConstraint, continued);
    }
    // The state outlives the call when it goes back to a session or to the caller: the text a stop
    // string withholds stays in it.
    job_request->persistent = !source_.checked_out.empty() || return_state_;
    job_request->deadline = request.deadline;
    // A fresh state may start from the caller's longest cached prefix; a session or a blob brings
    // its own state, and only stores what it reaches.
    job_request->owner = owner_;
    job_request->priority = request.priority;
    job_request->prompt_cache_key = request.prompt_cache_key;
    job_request->prefix_cache = fresh ? PrefixCacheUse::kLookupAndInsert : PrefixCacheUse::kInsert;
    job_requests.push_back(*std::move(job_request));
  }
  for (int32_t i = 0; i < request.choices; ++i) {
    auto job = scheduler.Submit(std::move(reservations[i]), std::move(job_requests[i]));
    if (!job.ok()) {
      // The choices submitted already are cancelled: their places come back at once.
      for (auto& submitted : jobs) submitted->Cancel();
      jobs.clear();
      return sink.Refine(AdmissionStep::kSubmit, job.status());
    }
    jobs.push_back(*std::move(job));
  }
  return absl::OkStatus();
}

void GenerationCall::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  CancelAll();
}

void GenerationCall::ClientGone() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    client_gone_ = true;
  }
  CancelAll();
  Pump();
}

void GenerationCall::CancelAll() {
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = jobs_;
  }
  // Outside the lock: a queued job publishes its final event (and calls its listener, which pumps)
  // on the cancelling thread.
  for (auto& job : jobs) job->Cancel();
}

void GenerationCall::Detach() {
  absl::MutexLock lock(&mu_);
  sink_ = nullptr;
}

void GenerationCall::Pump() {
  std::vector<std::shared_ptr<GenerationJob>> dropped;  // destroyed outside the lock
  std::vector<std::shared_ptr<GenerationJob>> cancel;
  std::optional<PendingCheckin> checkin;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || ended_ || sink_ == nullptr) return;
    PumpLocked();
    checkin = std::exchange(checkin_, std::nullopt);
    if (cancel_all_) {
      cancel_all_ = false;
      cancel = jobs_;
    }
    if (remaining_ == 0) {
      End();
      dropped = std::move(jobs_);
      jobs_.clear();
      cancel.clear();
    }
  }
  // Cancel() runs outside the lock: a queued job publishes its final event (and calls its
  // listener, which pumps) on the cancelling thread.
  for (auto& job : cancel) job->Cancel();
  if (!checkin.has_value()) return;
  // The session is free (with its new state) before the client hears the end, and the choice ends
  // only once the store has that state. Outside the lock: a shared store calls back on its own
  // thread once the state is written, the in-memory store before Checkin returns. Copied before the
  // callback takes the rest: arguments are evaluated in no fixed order.
  const std::string session = checkin->session;
  GenerationState state = checkin->event.snapshot;
  engine_.sessions().Checkin(
      session, std::move(state),
      [self = shared_from_this(), pending = *std::move(checkin)](absl::Status stored) mutable {
        {
          absl::MutexLock lock(&self->mu_);
          if (!stored.ok()) self->SetError(std::move(stored));
          self->FinishChoice(pending.choice, pending.event);
        }
        self->Pump();
      });
}

void GenerationCall::PumpLocked() {
  bool took = true;
  while (took && remaining_ > 0) {
    took = false;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      if (finished_[i]) continue;
      if (!client_gone_ && !sink_->HasRoom()) {
        bool stalled = false;
        for (const auto& job : jobs_) stalled = stalled || job->stalled();
        if (!stalled) {
          if (awaiting_room_) return;
          const bool waiting = sink_->NotifyWhenRoom([weak = weak_from_this()] {
            if (auto self = weak.lock()) {
              {
                absl::MutexLock lock(&self->mu_);
                self->awaiting_room_ = false;
              }
              self->Pump();
            }
          });
          if (waiting) {
            awaiting_room_ = true;
            return;
          }
          // The stream drained meanwhile: go on.
        } else {
          // The scheduler ended a job whose tokens nobody took for the stall timeout: the client
          // is not reading. Reset its stream (what it buffered with it) and take the remaining
          // events only to reach the final states. It cannot hear why: it is not reading.
          client_gone_ = true;
          cancel_all_ = true;
          sink_->Abort();
        }
      }
      std::optional<GenerationEvent> event = jobs_[i]->TryNext();
      if (!event.has_value()) continue;
      took = true;
      HandleEvent(i, *event);
    }
  }
}

void GenerationCall::HandleEvent(size_t i, GenerationEvent& event) {
  if (event.kind != GenerationEvent::Kind::kFinished) {
    if (client_gone_ || !error_.ok()) return;  // nobody to tell; wait for the final states
    absl::Status written =
        event.kind == GenerationEvent::Kind::kToken
            ? sink_->Token(i, event.token)
            : sink_->Snapshot(i, Blob(event.snapshot), event.snapshot.sequence.position);
    if (!written.ok()) Fail(std::move(written));
    return;
  }
  finished_[i] = true;
  if (!checked_out_.empty()) {
    checkin_ = PendingCheckin{std::exchange(checked_out_, ""), i, std::move(event)};
    return;
  }
  FinishChoice(i, event);
}

void GenerationCall::FinishChoice(size_t i, const GenerationEvent& event) {
  --remaining_;
  absl::Status status = event.status;
  if (status.ok() && event.finish_reason == FinishReason::kCancelled) {
    status = absl::CancelledError(absl::StrCat("the generation on model ", source_.model,
                                               " was cancelled after ", event.generated_tokens,
                                               " token(s)"));
  }
  // One choice failed: the call fails, so the other choices stop.
  if (!status.ok()) return Fail(std::move(status));
  if (client_gone_ || !error_.ok()) return;
  const bool blob_back = return_state_ || event.finish_reason == FinishReason::kDrained;
  if (absl::Status written = sink_->Final(i, event, blob_back ? Blob(event.snapshot) : "");
      !written.ok()) {
    Fail(std::move(written));
  }
}

void GenerationCall::End() {
  ended_ = true;
  sink_->End(error_, client_gone_);
}

void GenerationCall::SetError(absl::Status status) {
  if (error_.ok()) error_ = std::move(status);
}

void GenerationCall::Fail(absl::Status status) {
  SetError(std::move(status));
  cancel_all_ = true;
}

std::string GenerationCall::Blob(const GenerationState& state) const {
  return engine_.codec().Encode(state, source_.identity, owner_);
}

}  // namespace tost::service
