// tost.v1 Generate on gRPC's callback API. The request is resolved and admitted on one of the
// server's admission threads (where its state comes from: fresh, a server-held session, or a state
// blob); from then on the stream is driven by two kinds of events and holds no thread:
//   - the scheduler publishes an event to the job, and the job's listener pumps it to the stream;
//   - gRPC reports a write done (OnWriteDone), and the next waiting event is written.
// At most one write is in flight. Events the client has not taken wait in the job, and the
// scheduler pauses a job that has max_buffered_tokens of them, so a client that stops reading
// stops its own generation instead of growing a buffer here; after the stall timeout the scheduler
// ends it, and its state goes back to its session like any other ending.
//
// The method is raw (RawService): the reactor parses the request's bytes itself, so a request
// protobuf refuses ends with INVALID_ARGUMENT naming the field, and serialises each message it
// writes.
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "service/api/before_handler.h"
#include "service/api/generation_request.h"
#include "service/api/generation_source.h"
#include "service/api/grpc_status.h"
#include "service/api/handler_pool.h"
#include "service/api/raw_request.h"
#include "service/api/request_deadline.h"
#include "service/api/tost_service.h"

namespace tost::service {
namespace {

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(Engine& engine, const Authenticator& auth, const ServiceLimits& limits,
                  grpc::CallbackServerContext* context)
      : engine_(engine), auth_(auth), limits_(limits), context_(context) {}

  // Hands the request to `admission` (the server's admission threads), which parses and admits it
  // or finishes the call with the reason it was refused. Not on the gRPC thread that delivered
  // it: admission may wait (a session checked out of a shared store, a prompt of up to a MiB
  // tokenised, a constraint compiled for up to max_compile_ms), and gRPC's callback threads are
  // few, so one waiting admission would hold up every other call and stream. False when the
  // pool's queue is full (the caller finishes the call). `raw` lives until Finish.
  [[nodiscard]] bool Start(const grpc::ByteBuffer& raw, HandlerPool& admission) {
    // A stream reset before it got here (HTTP/2 "rapid reset") is not admitted: it would take a
    // place in the queue until its cancellation is seen.
    if (FinishIfCancelled()) return true;
    return admission.Schedule([this, &raw] { Admit(raw); });
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) client_gone_ = true;
    }
    // The stream is broken: stop generating, but keep taking events until the job's final one,
    // which carries the state its session gets back.
    if (!ok) job_->Cancel();
    Pump();
  }

  // A reset stream, a client cancel or a passed deadline. A job still queued leaves the queue
  // inside Cancel and its final event is pumped from here (the session gets its state back, the
  // call finishes), so its place is free before this returns.
  void OnCancel() override {
    std::shared_ptr<GenerationJob> job;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      job = job_;  // null while the call is being admitted: Admit sees cancelled_
    }
    if (job != nullptr) job->Cancel();
  }

  void OnDone() override {
    // No listener call is running once this returns, so the reactor can go.
    if (job_ != nullptr) job_->SetListener(nullptr);
    delete this;
  }

 private:
  bool FinishIfCancelled() {
    if (!context_->IsCancelled()) return false;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                        std::string("Generate").append(kCancelledBeforeHandlerMessageEnd)));
    return true;
  }
  // On a handler thread: parses and admits the request, then streams the job's events (or
  // finishes the call with the reason it was refused).
  void Admit(const grpc::ByteBuffer& raw);
  absl::Status AdmitJob();
  // Writes the next waiting event if no write is in flight; finishes the call on the final one.
  void Pump();
  // Builds the message of a token or snapshot event.
  void FillEvent(const GenerationEvent& event, tost::v1::GenerateResponse& msg) const;
  // Handles the job's final event: returns the status the call ends with, and fills `msg` with
  // the final message when there is one to send.
  absl::Status FinishEvent(GenerationEvent& event, tost::v1::GenerateResponse& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call after the final event, once the session's state is stored (`stored`: the
  // store's outcome; OK when no session was checked out).
  void Complete(GenerationEvent event, absl::Status stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Complete() with the check-in's outcome, once it is there (and only once).
  void CompleteIfCheckedIn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSession() {
    if (!checked_out_.empty()) engine_.sessions().Release(checked_out_);
    checked_out_.clear();
  }

  Engine& engine_;
  const Authenticator& auth_;
  const ServiceLimits& limits_;
  grpc::CallbackServerContext* const context_;
  tost::v1::GenerateRequest request_;  // parsed by Admit(), then read-only

  // Set by Admit() before any reaction that reads them can run, then read-only.
  std::string owner_;  // the caller: the blobs this call returns are bound to it
  std::string model_name_;
  ModelIdentity identity_;
  bool stateless_ = false;
  // Published under mu_ (OnCancel may run while the call is admitted), then never changed.
  std::shared_ptr<GenerationJob> job_;
  // The session this call holds busy, until its state is checked in (cleared by the Pump that takes
  // the final event, under mu_).
  std::string checked_out_;

  absl::Mutex mu_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // TryCancel() called on a stalled stream
  tost::v1::GenerateResponse message_ ABSL_GUARDED_BY(mu_);  // the next one, before serialising
  grpc::ByteBuffer written_ ABSL_GUARDED_BY(mu_);            // the one in flight
  absl::Status broken_ ABSL_GUARDED_BY(mu_);                 // a message could not be serialised
  // The final event and the session store's outcome, once its check-in ended, until a Pump
  // completes the call with them.
  std::optional<std::pair<GenerationEvent, absl::Status>> checked_in_ ABSL_GUARDED_BY(mu_);
  bool checkin_in_progress_ ABSL_GUARDED_BY(mu_) = false;  // inside the Checkin call
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
};

void GenerateReactor::Admit(const grpc::ByteBuffer& raw) {
  // Cancelled while it waited for a thread: not admitted either.
  if (FinishIfCancelled()) return;
  absl::Status admitted = ParseRequest(*context_, raw, limits_.max_request_bytes, request_);
  if (admitted.ok()) admitted = AdmitJob();
  if (!admitted.ok()) {
    ReleaseSession();
    Finish(ToGrpcStatus(admitted));
    return;
  }
  job_->SetListener([this] { Pump(); });
  Pump();  // events published before the listener was set
}

absl::Status GenerateReactor::AdmitJob() {
  TOST_ASSIGN_OR_RETURN(owner_, auth_.Identify(*context_));
  const std::string& owner = owner_;
  const tost::v1::GenerateRequest& request = request_;
  // Before a session is checked out: a refused constraint leaves it untouched.
  TOST_RETURN_IF_ERROR(CheckConstraintUse(request));
  std::optional<ConstraintSpec> constraint;
  if (request.has_constraint()) {
    TOST_ASSIGN_OR_RETURN(constraint, ConstraintFromProto(request.constraint()));
  }
  TOST_ASSIGN_OR_RETURN(GenerationSource source,
                        ResolveGenerationSource(engine_, owner, request.model(),
                                                request.session_id(), request.state()));
  checked_out_ = source.checked_out;
  model_name_ = source.model;
  GenerationScheduler* scheduler = source.scheduler;
  identity_ = std::move(source.identity);
  GenerationState state = source.state.has_value() ? *std::move(source.state) : GenerationState();
  // A place first: a full or draining scheduler refuses before the prompt (up to a MiB) is
  // tokenised.
  TOST_ASSIGN_OR_RETURN(GenerationScheduler::Reservation reservation, scheduler->Reserve());
  const bool fresh = request.session_id().empty() && request.state().empty();
  TOST_ASSIGN_OR_RETURN(const GenerationInput input, GenerationInputFromProto(request));
  TOST_ASSIGN_OR_RETURN(
      GenerationRequest job_request,
      BuildGenerationRequest(input, *scheduler,
                             fresh ? std::nullopt : std::make_optional(std::move(state)), limits_));
  // On this (the request's) thread, with a place held: a compile waits at most the engine's
  // max_compile_ms, and never on the scheduler's thread.
  if (constraint.has_value()) {
    TOST_ASSIGN_OR_RETURN(job_request.constraint,
                          engine_.CompileConstraint(model_name_, *constraint));
  } else {
    TOST_RETURN_IF_ERROR(ContinueStateConstraint(engine_, model_name_, request.clear_constraint(),
                                                 StateName(request.session_id()), job_request));
  }
  stateless_ = !request.state().empty();
  job_request.persistent = !checked_out_.empty() || stateless_ || request.return_state();
  job_request.deadline = RequestDeadline(*context_);
  // A fresh state may start from the caller's longest cached prefix; a session or a blob brings
  // its own state, and only stores what it reaches.
  job_request.owner = owner;
  job_request.prefix_cache = fresh ? PrefixCacheUse::kLookupAndInsert : PrefixCacheUse::kInsert;
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<GenerationJob> job,
                        scheduler->Submit(std::move(reservation), std::move(job_request)));
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    job_ = job;
    cancelled = cancelled_;
  }
  // Cancelled while it was admitted: the job ends at once, and its final event (the session's
  // state back, CANCELLED) finishes the call as any cancel does.
  if (cancelled) job->Cancel();
  return absl::OkStatus();
}

void GenerateReactor::FillEvent(const GenerationEvent& event,
                                tost::v1::GenerateResponse& msg) const {
  msg.Clear();
  if (event.kind == GenerationEvent::Kind::kToken) {
    auto* t = msg.mutable_token();
    t->set_id(event.token.id);
    t->set_bytes(event.token.bytes);
    t->set_text(event.token.text);
    t->set_position(event.token.position);
    for (const auto& [id, lp] : event.token.top_logprobs) {
      auto* alt = t->add_top_logprobs();
      alt->set_id(id);
      alt->set_logprob(lp);
    }
    if (event.token.logprob.has_value()) t->set_logprob(*event.token.logprob);
  } else {
    msg.mutable_snapshot()->set_state(engine_.codec().Encode(event.snapshot, identity_, owner_));
    msg.mutable_snapshot()->set_position(event.snapshot.sequence.position);
  }
}

absl::Status GenerateReactor::FinishEvent(GenerationEvent& event, tost::v1::GenerateResponse& msg) {
  if (!event.status.ok()) return event.status;
  if (event.finish_reason == FinishReason::kCancelled) {
    return absl::CancelledError(absl::StrCat("Generate on model ", model_name_,
                                             " was cancelled after ", event.generated_tokens,
                                             " token(s)"));
  }
  msg.Clear();
  auto* f = msg.mutable_final();
  f->set_finish_reason(ToProto(event.finish_reason));
  f->set_prompt_tokens(event.prompt_tokens);
  f->set_cached_tokens(event.cached_tokens);
  f->set_generated_tokens(event.generated_tokens);
  f->set_text(event.final_text);
  f->set_session_id(request_.session_id());
  f->set_position(event.snapshot.sequence.position + (event.snapshot.pending_token >= 0 ? 1 : 0));
  if (stateless_ || request_.return_state() || event.finish_reason == FinishReason::kDrained) {
    f->set_state(engine_.codec().Encode(event.snapshot, identity_, owner_));
  }
  return absl::OkStatus();
}

void GenerateReactor::Pump() {
  std::optional<GenerationEvent> final_event;
  std::string session;
  {
    absl::MutexLock lock(&mu_);
    if (write_in_flight_ && job_->stalled() && !abandoned_) {
      // The client has read nothing for the stall timeout and the write waits on its flow-control
      // window: cancel the call, so the write fails, the final event is taken (the session gets its
      // state back) and the server holds nothing for this client. It cannot hear why: it is not
      // reading.
      abandoned_ = true;
      context_->TryCancel();
    }
    while (!finished_ && !write_in_flight_) {
      std::optional<GenerationEvent> event = job_->TryNext();
      if (!event.has_value()) return;
      if (event->kind != GenerationEvent::Kind::kFinished) {
        if (client_gone_) continue;  // nobody to tell; wait for the final state
        FillEvent(*event, message_);
        if (grpc::Status serialized = SerializeResponse(message_, &written_); !serialized.ok()) {
          // Only a message past protobuf's 2 GiB could fail, never a token or a state blob: end
          // the stream as a broken one, still taking events until the final one (the session's
          // state).
          broken_ = absl::InternalError(absl::StrCat(
              "Generate on model ", model_name_,
              ": could not serialise a response message: ", serialized.error_message()));
          client_gone_ = true;
          context_->TryCancel();
          continue;
        }
        write_in_flight_ = true;
        StartWrite(&written_);
        return;
      }
      finished_ = true;
      final_event = std::move(event);
      break;
    }
    if (!final_event.has_value() || checked_out_.empty()) {
      if (final_event.has_value()) {
        Complete(*std::move(final_event), absl::OkStatus());
      } else {
        CompleteIfCheckedIn();
      }
      return;
    }
    // The session is free (with its new state) before the client hears the end, and the call is
    // acknowledged only once that state is stored: a shared store writes it on a thread of its own
    // and calls back there. That thread must not finish the call itself (the reactor may be
    // destroyed once it has), so it hands the outcome over and wakes the job's listener, whose
    // calls OnDone waits for; a store that calls back before Checkin returns (in memory) leaves
    // the finishing to this Pump.
    session = std::exchange(checked_out_, "");
    checkin_in_progress_ = true;
  }
  GenerationState state = final_event->snapshot;
  engine_.sessions().Checkin(
      session, std::move(state),
      [this, job = job_, event = *std::move(final_event)](absl::Status stored) mutable {
        bool wake = false;
        {
          absl::MutexLock relock(&mu_);
          checked_in_.emplace(std::move(event), std::move(stored));
          wake = !checkin_in_progress_;
        }
        if (wake) job->WakeListener();
      });
  absl::MutexLock lock(&mu_);
  checkin_in_progress_ = false;
  CompleteIfCheckedIn();
}

void GenerateReactor::CompleteIfCheckedIn() {
  if (!checked_in_.has_value() || completed_) return;
  completed_ = true;
  auto [event, stored] = *std::move(checked_in_);
  checked_in_.reset();
  Complete(std::move(event), std::move(stored));
}

void GenerateReactor::Complete(GenerationEvent event, absl::Status stored) {
  const absl::Status status = stored.ok() ? FinishEvent(event, message_) : stored;
  if (!status.ok()) {
    Finish(ToGrpcStatus(status));
  } else if (!broken_.ok()) {
    Finish(ToGrpcStatus(broken_));
  } else if (client_gone_) {
    Finish(ToGrpcStatus(absl::CancelledError(
        absl::StrCat("Generate on model ", model_name_, ": the client went away"))));
  } else if (grpc::Status serialized = SerializeResponse(message_, &written_); !serialized.ok()) {
    Finish(serialized);
  } else {
    StartWriteAndFinish(&written_, grpc::WriteOptions(), grpc::Status::OK);
  }
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* TostService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& request) {
  auto* reactor = new GenerateReactor(engine_, auth_, limits_, context);
  if (!reactor->Start(request, admission_)) {
    reactor->Finish(ToGrpcStatus(admission_.Refusal("/tost.v1.Tost/Generate")));
  }
  return reactor;
}

}  // namespace tost::service
