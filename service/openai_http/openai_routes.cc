#include "service/openai_http/openai_routes.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "service/api/generation_input.h"
#include "service/api/generation_source.h"
#include "service/engine/client_text.h"
#include "service/engine/session_codec.h"
#include "service/http/http_errors.h"
#include "service/openai/error.h"
#include "service/openai/request.h"
#include "service/openai/response.h"

namespace tost::service {
namespace {

using http::HttpExchange;
using openai::Endpoint;

uint64_t RandomSeed() {
  thread_local absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen);
}

void RespondError(HttpExchange& exchange, const absl::Status& status) {
  exchange.Respond(http::ErrorResponse(status, openai::ErrorParam(status)));
}

// One request of /v1/completions or /v1/chat/completions, from admission to its last byte. Kept
// alive by its jobs' listeners until every job's final event is taken (then it drops the jobs,
// and with them the listeners); the exchange's callbacks hold it weakly.
class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  OpenAiCall(Engine& engine, const ServiceLimits& limits, std::shared_ptr<HttpExchange> exchange,
             Endpoint endpoint)
      : engine_(engine), limits_(limits), exchange_(std::move(exchange)), endpoint_(endpoint) {}

  // On an admission thread (AddOpenAiRoutes' pool), never the connection's strand: admission may
  // wait (see the header).
  void Start() {
    if (exchange_->cancelled()) return;  // gone while it waited for a thread: nothing to admit
    if (absl::Status admitted = Admit(); !admitted.ok()) {
      if (!source_.checked_out.empty()) engine_.sessions().Release(source_.checked_out);
      jobs_.clear();  // none was submitted unless every one was (Admit submits last)
      RespondError(*exchange_, admitted);
      return;
    }
    if (request_.stream) exchange_->StartStream();
    std::weak_ptr<OpenAiCall> weak = weak_from_this();
    exchange_->OnCancel([weak] {
      if (auto self = weak.lock()) self->ClientGone();
    });
    for (auto& job : jobs_) job->SetListener([self = shared_from_this()] { self->Pump(); });
    Pump();  // events published before the listeners were set
  }

 private:
  absl::Status Admit();
  absl::Status ModelRefusal(absl::Status status) const;
  // The request's constraint compiled for its model; errors name the field it came from.
  absl::StatusOr<std::unique_ptr<TokenConstraint>> CompileConstraint() const;
  // Takes every event that is ready, while the stream has room; ends the call after the last
  // job's final event. Any thread (listeners, the connection's strand); serialised by mu_.
  void Pump();
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleEvent(size_t i, GenerationEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A choice's final event, once its session's state (if any) is stored.
  void FinishChoice(size_t i, GenerationEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClientGone() {
    {
      absl::MutexLock lock(&mu_);
      client_gone_ = true;
    }
    for (auto& job : JobsSnapshot()) job->Cancel();
    Pump();
  }
  std::vector<std::shared_ptr<GenerationJob>> JobsSnapshot() {
    absl::MutexLock lock(&mu_);
    return jobs_;
  }
  void SetError(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = std::move(status);
  }

  Engine& engine_;
  const ServiceLimits& limits_;
  const std::shared_ptr<HttpExchange> exchange_;
  const Endpoint endpoint_;
  // Set by Admit(), then read-only.
  openai::OpenAiRequest request_;
  std::string owner_;  // the caller: owns the blobs this call returns
  GenerationSource source_;
  std::unique_ptr<openai::ResponseBuilder> builder_;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<GenerationJob>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> finished_ ABSL_GUARDED_BY(mu_);
  size_t remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_room_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_all_ ABSL_GUARDED_BY(mu_) = false;  // set under the lock, done outside it
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // A final event whose session state waits to be checked in (a session call has one choice).
  struct PendingCheckin {
    std::string session;
    size_t choice = 0;
    GenerationEvent event;
  };
  std::optional<PendingCheckin> checkin_ ABSL_GUARDED_BY(mu_);
};

absl::Status OpenAiCall::ModelRefusal(absl::Status status) const {
  // The engine's words for a classifier name gRPC's RPCs; these routes say what they serve.
  auto entry = engine_.Find(request_.model);
  if (status.code() != absl::StatusCode::kInvalidArgument || !entry.ok() ||
      (*entry)->classifier == nullptr) {
    return status;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model ", QuoteClientText(request_.model),
      " is a classifier (tost_vision): completions and chat completions need a language model "
      "(tost_lm); GET /v1/models lists them"));
}

absl::StatusOr<std::unique_ptr<TokenConstraint>> OpenAiCall::CompileConstraint() const {
  absl::StatusOr<std::unique_ptr<TokenConstraint>> compiled =
      engine_.CompileConstraint(source_.model, *request_.constraint);
  if (compiled.ok()) return compiled;
  const absl::Status& status = compiled.status();
  const std::string& field = request_.constraint_field;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:     // the compiler refused the schema, regex, grammar
    case absl::StatusCode::kFailedPrecondition:  // the model cannot serve constraints: 400 too
      return openai::WithParam(
          absl::Status(status.code(), absl::StrCat(field, ": ", status.message())), field);
    case absl::StatusCode::kResourceExhausted:
      // The compile ran past its bound (or too many such compiles still run): 429, with a
      // Retry-After of 1 s (http::ErrorResponse reads the hint in the message), rather than 503.
      // OpenAI's clients (openai-python, openai-node) retry both with backoff and honour
      // Retry-After, but a 503 says the server is unwell: load balancers and gateways count 5xx
      // against the replica (outlier ejection, error-rate alerts), while this replica is healthy
      // and is the one most likely to answer the retry, the compile going on here and its result
      // landing in this model's cache. 429 is also what RESOURCE_EXHAUSTED already answers
      // here (a full queue), and what gRPC callers get.
      return openai::WithParam(absl::ResourceExhaustedError(absl::StrCat(
                                   field, ": ", status.message(), "; retry after about 1000 ms")),
                               field);
    default:
      return status;
  }
}

absl::Status OpenAiCall::Admit() {
  const http::HttpRequest& http_request = exchange_->request();
  TOST_ASSIGN_OR_RETURN(request_, openai::ParseOpenAiRequest(endpoint_, http_request.body));
  // The router's authenticator set the caller; without one (tests) everyone is the anonymous
  // caller, as on gRPC without keys.
  owner_ = http_request.caller.empty() ? std::string(kAnonymousCaller) : http_request.caller;
  const std::string& owner = owner_;
  const bool fresh = request_.session_id.empty() && !request_.state.has_value();
  {
    auto source = ResolveGenerationSource(engine_, owner, request_.model, request_.session_id,
                                          request_.state.value_or(std::string()));
    if (!source.ok()) return openai::WithParam(ModelRefusal(source.status()), "model");
    source_ = *std::move(source);
  }
  // A place per choice first: a full or draining scheduler refuses before the prompt is rendered
  // and tokenised. Places taken before a refusal go back as the reservations are dropped.
  std::vector<GenerationScheduler::Reservation> reservations;
  for (int32_t i = 0; i < request_.n; ++i) {
    TOST_ASSIGN_OR_RETURN(GenerationScheduler::Reservation r, source_.scheduler->Reserve());
    reservations.push_back(std::move(r));
  }
  // OpenAI's servers sample an unseeded request differently each time; the seed is drawn here,
  // where a sampling setting applies (a continued generation that sets none keeps its state's).
  const bool sets_sampling = request_.temperature.has_value() || request_.top_p.has_value();
  if (!request_.seed.has_value() && (fresh || sets_sampling)) request_.seed = RandomSeed();

  const GenerativeModel& model = source_.scheduler->model();
  std::string prompt_storage;
  TOST_ASSIGN_OR_RETURN(GenerationInput input,
                        openai::ToGenerationInput(request_, model.config(), &prompt_storage));
  const GenerationFieldNames names = openai::FieldNames(request_);
  std::vector<GenerationRequest> job_requests;
  for (int32_t i = 0; i < request_.n; ++i) {
    GenerationInput choice = input;
    if (choice.sampling.has_value()) {
      choice.sampling->seed = openai::ChoiceSeed(choice.sampling->seed, i);
    }
    TOST_ASSIGN_OR_RETURN(
        GenerationRequest job_request,
        BuildGenerationRequest(choice, *source_.scheduler, source_.state, limits_, names));
    if (request_.constraint.has_value()) {
      // On this (an admission) thread, with the places held, as tost.v1 Generate does: a compile
      // waits at most the engine's max_compile_ms, and never on the scheduler's thread. One
      // TokenConstraint per choice (each steps its own); the choices after the first find the
      // compiled form in the model's cache.
      TOST_ASSIGN_OR_RETURN(job_request.constraint, CompileConstraint());
    } else if (absl::Status continued =
                   ContinueStateConstraint(engine_, source_.model, /*clear=*/false,
                                           StateName(request_.session_id), job_request);
               !continued.ok()) {
      // A session or blob left mid-structure (here or by tost.v1 Generate) goes on under its
      // constraint; this API has no way to clear it, which tost.v1 Generate's clear_constraint
      // offers.
      return openai::WithParam(
          continued, endpoint_ == openai::Endpoint::kChatCompletions ? "messages" : "prompt");
    }
    job_request.persistent =
        !source_.checked_out.empty() || request_.state.has_value() || request_.return_state;
    // A fresh state may start from the caller's longest cached prefix; a session or a blob brings
    // its own state, and only stores what it reaches.
    job_request.owner = owner;
    job_request.prefix_cache = fresh ? PrefixCacheUse::kLookupAndInsert : PrefixCacheUse::kInsert;
    job_requests.push_back(std::move(job_request));
  }
  openai::ResponseMeta meta;
  meta.id = openai::ResponseId(endpoint_, http_request.request_id);
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = source_.model;
  builder_ =
      std::make_unique<openai::ResponseBuilder>(request_, std::move(meta), model.tokenizer());
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  for (int32_t i = 0; i < request_.n; ++i) {
    auto job = source_.scheduler->Submit(std::move(reservations[i]), std::move(job_requests[i]));
    if (!job.ok()) {
      // The choices submitted already are cancelled: their places come back at once.
      for (auto& submitted : jobs) submitted->Cancel();
      return job.status();
    }
    jobs.push_back(*std::move(job));
  }
  absl::MutexLock lock(&mu_);
  jobs_ = std::move(jobs);
  finished_.assign(jobs_.size(), false);
  remaining_ = jobs_.size();
  return absl::OkStatus();
}

void OpenAiCall::Pump() {
  std::vector<std::shared_ptr<GenerationJob>> dropped;  // destroyed outside the lock
  std::vector<std::shared_ptr<GenerationJob>> cancel;
  std::optional<PendingCheckin> checkin;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    PumpLocked();
    checkin = std::exchange(checkin_, std::nullopt);
    // Cancel() runs outside the lock: a queued job publishes its final event (and calls its
    // listener, which pumps) on the cancelling thread.
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
  for (auto& job : cancel) job->Cancel();
  if (checkin.has_value()) {
    // Outside the lock: a shared store calls back on its own thread once the state is written,
    // the in-memory store before Checkin returns.
    // Copied before the callback takes the rest: arguments are evaluated in no fixed order.
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
}

void OpenAiCall::PumpLocked() {
  bool took = true;
  while (took && remaining_ > 0) {
    took = false;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      if (finished_[i]) continue;
      if (request_.stream && !client_gone_ && !exchange_->HasRoom()) {
        bool stalled = false;
        for (const auto& job : jobs_) stalled = stalled || job->stalled();
        if (!stalled) {
          if (!awaiting_room_) {
            awaiting_room_ = true;
            exchange_->OnWritable([weak = weak_from_this()] {
              if (auto self = weak.lock()) {
                {
                  absl::MutexLock lock(&self->mu_);
                  self->awaiting_room_ = false;
                }
                self->Pump();
              }
            });
          }
          return;
        }
        // The scheduler ended a job whose tokens nobody took for the stall timeout: the client
        // is not reading. Reset its connection (the buffered chunks with it) and take the
        // remaining events only to reach the final states.
        client_gone_ = true;
        cancel_all_ = true;
        exchange_->Abort();
      }
      std::optional<GenerationEvent> event = jobs_[i]->TryNext();
      if (!event.has_value()) continue;
      took = true;
      HandleEvent(i, *event);
    }
  }
}

void OpenAiCall::HandleEvent(size_t i, GenerationEvent& event) {
  const int32_t index = static_cast<int32_t>(i);
  if (event.kind == GenerationEvent::Kind::kSnapshot) return;
  if (event.kind == GenerationEvent::Kind::kToken) {
    if (client_gone_ || !error_.ok()) return;
    if (request_.stream) {
      std::string chunk = builder_->Token(index, event.token);
      if (!chunk.empty()) exchange_->Write(std::move(chunk));
    } else {
      builder_->AddToken(index, event.token);
    }
    return;
  }
  finished_[i] = true;
  // The session is free (with its new state) before the client hears the end, and the choice ends
  // once that state is stored (Pump checks it in outside the lock).
  if (!source_.checked_out.empty()) {
    checkin_ = PendingCheckin{std::exchange(source_.checked_out, ""), i, std::move(event)};
    return;
  }
  FinishChoice(i, event);
}

void OpenAiCall::FinishChoice(size_t i, GenerationEvent& event) {
  const int32_t index = static_cast<int32_t>(i);
  --remaining_;
  if (i == 0) builder_->set_cached_tokens(event.cached_tokens);
  absl::Status status = event.status;
  if (status.ok() && event.finish_reason == FinishReason::kCancelled) {
    status = absl::CancelledError(absl::StrCat("the generation on model ", source_.model,
                                               " was cancelled after ", event.generated_tokens,
                                               " token(s)"));
  }
  if (!status.ok()) {
    SetError(std::move(status));
    // One choice failed: the response fails, so the other choices stop.
    cancel_all_ = true;
    return;
  }
  if (client_gone_ || !error_.ok()) return;
  std::string blob;
  if (request_.return_state || request_.state.has_value() ||
      event.finish_reason == FinishReason::kDrained) {
    blob = engine_.codec().Encode(event.snapshot, source_.identity, owner_);
  }
  if (request_.stream) {
    absl::StatusOr<std::string> chunk = builder_->FinishChunk(index, event, blob);
    if (!chunk.ok()) return SetError(chunk.status());
    exchange_->Write(*std::move(chunk));
  } else if (absl::Status s = builder_->Finish(index, event, blob); !s.ok()) {
    SetError(std::move(s));
  }
}

void OpenAiCall::End() {
  ended_ = true;
  if (!request_.stream) {
    if (client_gone_) return;  // nobody to answer; the exchange reports 499
    if (!error_.ok()) return RespondError(*exchange_, error_);
    exchange_->Respond(http::MakeResponse(200, builder_->Body()));
    return;
  }
  if (!client_gone_) {
    if (!error_.ok()) {
      exchange_->Write(openai::ErrorEvent(error_, openai::ErrorParam(error_)));
    } else {
      exchange_->Write(builder_->End());
    }
  }
  exchange_->Finish();
}

void Route(Engine& engine, const ServiceLimits& limits, HandlerPool& admission, Endpoint endpoint,
           std::shared_ptr<HttpExchange> exchange) {
  auto call = std::make_shared<OpenAiCall>(engine, limits, exchange, endpoint);
  if (!admission.Schedule([call] { call->Start(); })) {
    RespondError(*exchange, admission.Refusal(exchange->request().path));
  }
}

// The engine, or a 503 answered and null while the models load.
Engine* EngineOrLoading(const ServingEngine& engine, HttpExchange& exchange) {
  Engine* e = engine();
  if (e == nullptr) {
    exchange.Respond(http::ErrorResponse(absl::UnavailableError(
        "the server is still loading its models; retry in a few seconds (GET /v1/health/ready "
        "answers 200 once it serves)")));
  }
  return e;
}

}  // namespace

void AddOpenAiRoutes(ServingEngine engine, const ServiceLimits& limits, HandlerPool& admission,
                     http::HttpRouter& router) {
  router.Handle("GET", "/v1/models", [engine](std::shared_ptr<HttpExchange> exchange) {
    if (Engine* e = EngineOrLoading(engine, *exchange))
      exchange->Respond(http::MakeResponse(200, openai::ModelsListBody(e->models())));
  });
  router.Handle("POST", "/v1/completions",
                [engine, &limits, &admission](std::shared_ptr<HttpExchange> exchange) {
                  if (Engine* e = EngineOrLoading(engine, *exchange))
                    Route(*e, limits, admission, Endpoint::kCompletions, std::move(exchange));
                });
  router.Handle("POST", "/v1/chat/completions",
                [engine, &limits, &admission](std::shared_ptr<HttpExchange> exchange) {
                  if (Engine* e = EngineOrLoading(engine, *exchange))
                    Route(*e, limits, admission, Endpoint::kChatCompletions, std::move(exchange));
                });
}

}  // namespace tost::service
