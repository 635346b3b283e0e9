// tost.v1 Generate on gRPC's callback API: the gRPC sink of a GenerationCall, which holds every
// rule of the call (service/generation/generation_call.h). This file parses the request (the method
// is raw, RawService: a request protobuf refuses ends with INVALID_ARGUMENT naming the field),
// hands it to an admission thread (a session's call to the store pool's: handler_pool.h,
// AdmissionPools), and writes the call's events as GenerateResponse messages, one
// write in flight at a time: the sink has room while no write is in flight, and OnWriteDone gives
// it back.
//
// A request with the metadata key x-tost-timing gets a trailer of the same name: where its first
// token spent its time on the server, in microseconds from the call's arrival here (TimingTrailer),
// for a benchmark to set beside the time its client measured.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "service/api/before_handler.h"
#include "service/api/generation_request.h"
#include "service/api/grpc_status.h"
#include "service/api/handler_pool.h"
#include "service/api/raw_request.h"
#include "service/api/request_deadline.h"
#include "service/api/tost_service.h"
#include "service/generation/generation_call.h"

namespace tost::service {
namespace {

constexpr char kTimingKey[] = "x-tost-timing";

// "name=microseconds" from `arrival` to each point of the first token's way, -1 for a point the
// call did not reach; then the first step's prefill tokens and decode rows.
std::string TimingTrailer(absl::Time arrival, absl::Time admit, absl::Time first_write,
                          const GenerationTimeline& t) {
  const auto us = [arrival](absl::Time at) -> int64_t {
    return at == absl::InfinitePast() ? -1 : absl::ToInt64Microseconds(at - arrival);
  };
  std::vector<std::string> parts = {
      absl::StrCat("arrival_unix_us=", absl::ToUnixMicros(arrival)),
      absl::StrCat("admit=", us(admit)),
      absl::StrCat("submit=", us(t.submitted)),
      absl::StrCat("placed=", us(t.placed)),
      absl::StrCat("prefill_start=", us(t.prefill_start)),
      absl::StrCat("prefill_end=", us(t.prefill_end)),
      absl::StrCat("first_step_start=", us(t.first_step_start)),
      absl::StrCat("first_token=", us(t.first_token)),
      absl::StrCat("first_write=", us(first_write)),
      absl::StrCat("first_step_prefill_tokens=", t.first_step_prefill_tokens),
      absl::StrCat("first_step_batch=", t.first_step_batch)};
  return absl::StrJoin(parts, ";");
}

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public CallSink {
 public:
  GenerateReactor(Engine& engine, const Authenticator& auth, const ServiceLimits& limits,
                  AdmissionPools admission, grpc::CallbackServerContext* context)
      : auth_(auth),
        limits_(limits),
        admission_(admission),
        context_(context),
        clock_(*engine.clock()),
        arrival_(clock_.Now()),
        timing_(context->client_metadata().count(kTimingKey) > 0),
        call_(GenerationCall::Create(engine, limits, *this)) {}

  // Hands the request to the stateless admission pool, never admitting on the gRPC thread that
  // delivered it: admission may wait, and gRPC's callback threads are few. False when the pool's
  // queue is full (the caller finishes the call). `raw` lives until Finish.
  [[nodiscard]] bool Start(const grpc::ByteBuffer& raw) {
    // A stream reset before it got here (HTTP/2 "rapid reset") takes no place in the queue.
    if (FinishIfCancelled()) return true;
    return admission_.stateless.Schedule([this, &raw] { Admit(raw); });
  }

  void OnWriteDone(bool ok) override {
    absl::AnyInvocable<void()> wake;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      wake = std::exchange(wake_, nullptr);
      finish = std::exchange(pending_finish_, std::nullopt);
    }
    if (finish.has_value()) return Finish(*finish);
    // A broken stream: the call stops generating and takes its events only for the final state.
    if (!ok) return call_->ClientGone();
    if (wake) wake();
  }
  // A reset stream, a client cancel or a passed deadline.
  void OnCancel() override { call_->Cancel(); }
  void OnDone() override {
    call_->Detach();  // no sink method runs once this returns, so the reactor can go
    delete this;
  }

  // CallSink:
  absl::StatusOr<GenerationInput> Input(const AdmittedCall& call) override {
    model_ = call.model;
    return GenerationInputFromProto(request_);
  }
  bool HasRoom() override {
    absl::MutexLock lock(&mu_);
    return !write_in_flight_;
  }
  bool NotifyWhenRoom(absl::AnyInvocable<void()> wake) override {
    absl::MutexLock lock(&mu_);
    if (!write_in_flight_) return false;
    wake_ = std::move(wake);
    return true;
  }
  absl::Status Token(size_t, const TokenEvent& token) override {
    absl::MutexLock lock(&mu_);
    if (timing_ && first_write_ == absl::InfinitePast()) first_write_ = clock_.Now();
    message_.Clear();
    auto* t = message_.mutable_token();
    t->set_id(token.id);
    t->set_bytes(token.bytes);
    t->set_text(token.text);
    t->set_position(token.position);
    for (const auto& [id, lp] : token.top_logprobs) {
      auto* alt = t->add_top_logprobs();
      alt->set_id(id);
      alt->set_logprob(lp);
    }
    if (token.logprob.has_value()) t->set_logprob(*token.logprob);
    return WriteMessage();
  }
  absl::Status Snapshot(size_t, std::string blob, int64_t position) override {
    absl::MutexLock lock(&mu_);
    message_.Clear();
    message_.mutable_snapshot()->set_state(std::move(blob));
    message_.mutable_snapshot()->set_position(position);
    return WriteMessage();
  }
  absl::Status Final(size_t, const GenerationEvent& event, std::string blob) override {
    absl::MutexLock lock(&mu_);
    message_.Clear();
    auto* f = message_.mutable_final();
    f->set_finish_reason(ToProto(event.finish_reason));
    f->set_prompt_tokens(event.prompt_tokens);
    f->set_cached_tokens(event.cached_tokens);
    f->set_generated_tokens(event.generated_tokens);
    f->set_text(event.final_text);
    f->set_session_id(request_.session_id());
    f->set_position(event.snapshot.sequence.position + (event.snapshot.pending_token >= 0 ? 1 : 0));
    if (!blob.empty()) f->set_state(std::move(blob));
    if (timing_) {
      context_->AddTrailingMetadata(kTimingKey,
                                    TimingTrailer(arrival_, admit_, first_write_, event.timeline));
    }
    has_final_ = true;
    return absl::OkStatus();
  }
  void End(const absl::Status& status, bool client_gone) override {
    absl::MutexLock lock(&mu_);
    grpc::Status finish;
    if (!status.ok()) {
      finish = ToGrpcStatus(status);
    } else if (client_gone || !has_final_) {
      finish = ToGrpcStatus(absl::CancelledError(
          absl::StrCat("Generate on model ", model_, ": the client went away")));
    } else if (finish = SerializeResponse(message_, &written_); finish.ok()) {
      // Every event before the final one was taken with room: no write is in flight.
      return StartWriteAndFinish(&written_, grpc::WriteOptions(), grpc::Status::OK);
    }
    // Finish waits for a write the stream still has in flight (one a reset stream fails).
    if (write_in_flight_) {
      pending_finish_ = std::move(finish);
    } else {
      Finish(finish);
    }
  }
  void Abort() override { context_->TryCancel(); }

 private:
  bool FinishIfCancelled() {
    if (!context_->IsCancelled()) return false;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                        std::string("Generate").append(kCancelledBeforeHandlerMessageEnd)));
    return true;
  }
  // On a stateless admission thread: parses the request and admits it, or moves a session's call
  // to the store pool before its checkout may wait there; finishes the call with the reason it was
  // refused.
  void Admit(const grpc::ByteBuffer& raw) {
    admit_ = clock_.Now();            // written before any sink method can read it
    if (FinishIfCancelled()) return;  // cancelled while it waited for a thread
    absl::Status admitted = ParseRequest(*context_, raw, limits_.max_request_bytes, request_);
    if (admitted.ok() && !request_.session_id().empty()) {
      if (admission_.store.Schedule([this] { AdmitOnStore(); })) return;
      admitted = admission_.store.Refusal("/tost.v1.Tost/Generate");
    }
    if (admitted.ok()) admitted = AdmitCall();
    if (!admitted.ok()) Finish(ToGrpcStatus(admitted));
  }
  // On a store admission thread: a session's call, parsed.
  void AdmitOnStore() {
    if (FinishIfCancelled()) return;  // cancelled while it waited for a thread
    if (absl::Status admitted = AdmitCall(); !admitted.ok()) Finish(ToGrpcStatus(admitted));
  }
  absl::Status AdmitCall() {
    GenerationCallRequest r;
    TOST_ASSIGN_OR_RETURN(r.owner, auth_.Identify(*context_));
    // Before a session is checked out: a refused constraint leaves it untouched.
    TOST_RETURN_IF_ERROR(CheckConstraintUse(request_));
    if (request_.has_constraint()) {
      TOST_ASSIGN_OR_RETURN(r.constraint, ConstraintFromProto(request_.constraint()));
    }
    r.model = request_.model();
    r.session_id = request_.session_id();
    if (!request_.state().empty()) r.state_blob = request_.state();
    // Through a const view: the non-const overload is the proto's clearer of `constraint`.
    r.clear_constraint = std::as_const(request_).clear_constraint();
    r.return_state = request_.return_state();
    r.deadline = RequestDeadline(*context_);
    r.priority = request_.priority();
    r.prompt_cache_key = request_.prompt_cache_key();
    return call_->Admit(std::move(r));
  }
  // Serialises message_ and starts its write.
  absl::Status WriteMessage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (grpc::Status serialized = SerializeResponse(message_, &written_); !serialized.ok()) {
      // Only a message past protobuf's 2 GiB could fail, never a token or a state blob.
      return absl::InternalError(
          absl::StrCat("Generate on model ", model_,
                       ": could not serialise a response message: ", serialized.error_message()));
    }
    write_in_flight_ = true;
    StartWrite(&written_);
    return absl::OkStatus();
  }

  const Authenticator& auth_;
  const ServiceLimits& limits_;
  const AdmissionPools admission_;
  grpc::CallbackServerContext* const context_;
  const Clock& clock_;
  const absl::Time arrival_;                 // the reactor's creation: the call's arrival here
  const bool timing_;                        // the caller asked for the timing trailer
  absl::Time admit_ = absl::InfinitePast();  // an admission thread took the call
  const std::shared_ptr<GenerationCall> call_;
  // Parsed by Admit(), then read-only.
  tost::v1::GenerateRequest request_;
  std::string model_;  // the model serving the call, for messages

  absl::Mutex mu_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::AnyInvocable<void()> wake_ ABSL_GUARDED_BY(mu_);  // the call waits for room
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
  bool has_final_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time first_write_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the first token's
  tost::v1::GenerateResponse message_ ABSL_GUARDED_BY(mu_);  // the next one, before serialising
  grpc::ByteBuffer written_ ABSL_GUARDED_BY(mu_);            // the one in flight
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* TostService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& request) {
  auto* reactor = new GenerateReactor(engine_, auth_, limits_, admission_, context);
  if (!reactor->Start(request)) {
    reactor->Finish(ToGrpcStatus(admission_.stateless.Refusal("/tost.v1.Tost/Generate")));
  }
  return reactor;
}

}  // namespace tost::service
