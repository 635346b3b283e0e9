// tost.v1 Generate and the session RPCs: resolve where the generation state comes from (fresh,
// a server-held session, or a state blob), submit to the model's scheduler, relay its events to
// the stream, and put the final state back (session store or blob).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"
#include "model/tokenizer.h"
#include "service/grpc_status.h"
#include "service/request_deadline.h"
#include "service/tost_service.h"

namespace tost::service {
namespace {

// How often a waiting handler looks at its call's cancellation while no token arrives.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(10);

tost::v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return tost::v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return tost::v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return tost::v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
      return tost::v1::FINISH_REASON_CANCELLED;
    case FinishReason::kContext:
      return tost::v1::FINISH_REASON_CONTEXT;
    case FinishReason::kDrained:
      return tost::v1::FINISH_REASON_DRAINED;
  }
  return tost::v1::FINISH_REASON_UNSPECIFIED;
}

absl::StatusOr<model::SamplingParams> SamplingFromProto(const tost::v1::SamplingParams& p) {
  model::SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0.f ? 1.f : p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() == 0.f ? 1.f : p.repetition_penalty();
  s.repetition_window = p.repetition_window() == 0 ? 64 : p.repetition_window();
  s.seed = p.seed();
  TOST_RETURN_IF_ERROR(model::ValidateSamplingParams(s));
  return s;
}

absl::Status ApplyStop(const tost::v1::StopConditions& stop, const model::LanguageConfig& c,
                       GenerationState& st) {
  if (stop.stop_size() > 16)
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most 16 strings, got ", stop.stop_size()));
  for (const auto& s : stop.stop()) {
    if (s.empty() || s.size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop strings must hold 1 to 256 bytes, got ", s.size()));
    }
  }
  for (int32_t id : stop.stop_token_ids()) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids: id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  st.stop_strings.assign(stop.stop().begin(), stop.stop().end());
  st.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const tost::v1::GenerateRequest& req,
                                                  const model::Tokenizer& tokenizer,
                                                  const ServiceLimits& limits) {
  if (req.has_prompt_tokens()) {
    if (req.prompt_tokens().ids_size() > limits.max_prompt_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_tokens holds ", req.prompt_tokens().ids_size(),
                       " ids, more than the limit of ", limits.max_prompt_bytes));
    }
    return std::vector<int32_t>(req.prompt_tokens().ids().begin(), req.prompt_tokens().ids().end());
  }
  if (static_cast<int64_t>(req.prompt_bytes().size()) > limits.max_prompt_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_bytes holds ", req.prompt_bytes().size(),
                                                   " bytes, more than the limit of ",
                                                   limits.max_prompt_bytes));
  }
  return tokenizer.Encode(req.prompt_bytes());
}

void FillSessionInfo(const std::string& id, const GenerationState& st,
                     tost::v1::SessionInfo* info) {
  info->set_session_id(id);
  info->set_model(st.model);
  info->set_position(st.sequence.position + (st.pending_token >= 0 ? 1 : 0));
  info->set_state_bytes(static_cast<int64_t>(st.ByteSize()));
}

}  // namespace

grpc::Status TostService::Generate(grpc::ServerContext* context,
                                   const tost::v1::GenerateRequest* request,
                                   grpc::ServerWriter<tost::v1::GenerateResponse>* writer) {
  std::string checked_out;  // session id held busy by this call
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    if (!request->session_id().empty() && !request->state().empty()) {
      return absl::InvalidArgumentError("set session_id or state, not both");
    }
    // Where the state comes from decides the model when the request leaves it empty.
    GenerationState state;
    std::string model_name = request->model();
    if (!request->session_id().empty()) {
      TOST_ASSIGN_OR_RETURN(state, core_.sessions.Checkout(request->session_id(), owner));
      checked_out = request->session_id();
      if (!model_name.empty() && model_name != state.model) {
        return absl::InvalidArgumentError(
            absl::StrCat("session \"", checked_out, "\" belongs to model \"", state.model,
                         "\", the request names \"", model_name, "\""));
      }
      model_name = state.model;
    } else if (!request->state().empty()) {
      if (model_name.empty()) {
        TOST_ASSIGN_OR_RETURN(model_name, core_.codec.PeekModel(request->state()));
      }
      TOST_ASSIGN_OR_RETURN(ModelIdentity identity, core_.Identity(model_name));
      TOST_ASSIGN_OR_RETURN(state, core_.codec.Decode(request->state(), identity));
    }
    TOST_ASSIGN_OR_RETURN(GenerationScheduler * scheduler, core_.Scheduler(model_name));
    const model::LanguageConfig& c = scheduler->model().config().language;
    if (request->session_id().empty() && request->state().empty()) {
      TOST_ASSIGN_OR_RETURN(model::SamplingParams sampling, SamplingFromProto(request->sampling()));
      state = scheduler->NewState(sampling);
    } else if (request->has_sampling()) {
      TOST_ASSIGN_OR_RETURN(state.sampling, SamplingFromProto(request->sampling()));
    }
    if (request->has_stop() || (request->session_id().empty() && request->state().empty())) {
      TOST_RETURN_IF_ERROR(ApplyStop(request->stop(), c, state));
    }
    // 0 asks for the default, which never exceeds the server's ceiling.
    const int32_t max_new = request->max_new_tokens() == 0
                                ? std::min(limits_.default_max_new_tokens, limits_.max_new_tokens)
                                : request->max_new_tokens();
    if (max_new < 0 || max_new > limits_.max_new_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be in [0, ",
                                                     limits_.max_new_tokens, "], got ", max_new));
    }
    GenerationRequest job_request;
    TOST_ASSIGN_OR_RETURN(job_request.prompt,
                          PromptTokens(*request, scheduler->model().tokenizer(), limits_));
    job_request.state = std::move(state);
    job_request.max_new_tokens = max_new;
    job_request.top_logprobs = request->top_logprobs();
    job_request.snapshot_every = request->state_every_tokens();
    const bool stateless = !request->state().empty();
    job_request.persistent = !checked_out.empty() || stateless || request->return_state();
    job_request.deadline = RequestDeadline(*context);
    TOST_ASSIGN_OR_RETURN(std::shared_ptr<GenerationJob> job,
                          scheduler->Submit(std::move(job_request)));
    TOST_ASSIGN_OR_RETURN(const ModelIdentity identity, core_.Identity(model_name));

    bool client_gone = false;
    while (true) {
      std::optional<GenerationEvent> event = job->Next(kCancelPollInterval);
      if (!event.has_value()) {
        if (context->IsCancelled()) job->Cancel();
        continue;
      }
      tost::v1::GenerateResponse msg;
      if (event->kind == GenerationEvent::Kind::kToken) {
        auto* t = msg.mutable_token();
        t->set_id(event->token.id);
        t->set_bytes(event->token.bytes);
        t->set_text(event->token.text);
        t->set_position(event->token.position);
        for (const auto& [id, lp] : event->token.top_logprobs) {
          auto* alt = t->add_top_logprobs();
          alt->set_id(id);
          alt->set_logprob(lp);
        }
      } else if (event->kind == GenerationEvent::Kind::kSnapshot) {
        msg.mutable_snapshot()->set_state(core_.codec.Encode(event->snapshot, identity));
        msg.mutable_snapshot()->set_position(event->snapshot.sequence.position);
      } else {
        // Finished: put the state back first, so the session is free before the client hears.
        if (!checked_out.empty()) {
          core_.sessions.Checkin(checked_out, event->snapshot);
          checked_out.clear();
        }
        if (!event->status.ok()) return event->status;
        if (event->finish_reason == FinishReason::kCancelled) {
          return absl::CancelledError(absl::StrCat("Generate on model ", model_name,
                                                   " was cancelled after ", event->generated_tokens,
                                                   " token(s)"));
        }
        auto* f = msg.mutable_final();
        f->set_finish_reason(ToProto(event->finish_reason));
        f->set_prompt_tokens(event->prompt_tokens);
        f->set_generated_tokens(event->generated_tokens);
        f->set_text(event->final_text);
        f->set_session_id(request->session_id());
        f->set_position(event->snapshot.sequence.position +
                        (event->snapshot.pending_token >= 0 ? 1 : 0));
        if (stateless || request->return_state() ||
            event->finish_reason == FinishReason::kDrained) {
          f->set_state(core_.codec.Encode(event->snapshot, identity));
        }
        if (!client_gone) writer->Write(msg);
        return absl::OkStatus();
      }
      if (!client_gone && !writer->Write(msg)) {
        client_gone = true;  // keep draining events until the scheduler drops the job
        job->Cancel();
      }
    }
  };
  absl::Status status = run();
  if (!checked_out.empty()) core_.sessions.Release(checked_out);  // failed before the job ran
  return ToGrpcStatus(status);
}

grpc::Status TostService::CreateSession(grpc::ServerContext* context,
                                        const tost::v1::CreateSessionRequest* request,
                                        tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationScheduler * scheduler, core_.Scheduler(request->model()));
    TOST_ASSIGN_OR_RETURN(model::SamplingParams sampling, SamplingFromProto(request->sampling()));
    GenerationState state = scheduler->NewState(sampling);
    TOST_RETURN_IF_ERROR(ApplyStop(request->stop(), scheduler->model().config().language, state));
    TOST_ASSIGN_OR_RETURN(std::string id, core_.sessions.Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ForkSession(grpc::ServerContext* context,
                                      const tost::v1::SessionRef* request,
                                      tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationState state, core_.sessions.Get(request->session_id(), owner));
    TOST_ASSIGN_OR_RETURN(std::string id, core_.sessions.Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ExportSession(grpc::ServerContext* context,
                                        const tost::v1::SessionRef* request,
                                        tost::v1::ExportSessionResponse* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationState state, core_.sessions.Get(request->session_id(), owner));
    TOST_ASSIGN_OR_RETURN(ModelIdentity identity, core_.Identity(state.model));
    response->set_state(core_.codec.Encode(state, identity));
    FillSessionInfo(request->session_id(), state, response->mutable_session());
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ImportSession(grpc::ServerContext* context,
                                        const tost::v1::ImportSessionRequest* request,
                                        tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    TOST_ASSIGN_OR_RETURN(std::string model_name, core_.codec.PeekModel(request->state()));
    TOST_ASSIGN_OR_RETURN(ModelIdentity identity, core_.Identity(model_name));
    TOST_ASSIGN_OR_RETURN(GenerationState state, core_.codec.Decode(request->state(), identity));
    TOST_ASSIGN_OR_RETURN(std::string id, core_.sessions.Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::CloseSession(grpc::ServerContext* context,
                                       const tost::v1::SessionRef* request,
                                       tost::v1::CloseSessionResponse*) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, core_.auth.Identify(*context));
    return core_.sessions.Close(request->session_id(), owner);
  };
  return ToGrpcStatus(run());
}

}  // namespace tost::service
