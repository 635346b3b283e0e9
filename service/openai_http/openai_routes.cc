#include "service/openai_http/openai_routes.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"
#include "service/generation/generation_call.h"
#include "service/http/http_errors.h"
#include "service/openai/error.h"
#include "service/openai/request.h"
#include "service/openai/response.h"
#include "service/openai_http/route_support.h"

namespace tost::service {
namespace {

using http::HttpExchange;
using openai::Endpoint;

// The SSE/JSON sink of one /v1/completions or /v1/chat/completions request: service/openai's bodies
// written to an HttpExchange. Owned by its GenerationCall; the exchange's callbacks hold the call
// weakly.
class OpenAiSink final : public CallSink {
 public:
  OpenAiSink(Engine& engine, std::shared_ptr<HttpExchange> exchange, Endpoint endpoint,
             HandlerPool& store_admission)
      : engine_(engine),
        exchange_(std::move(exchange)),
        endpoint_(endpoint),
        store_admission_(store_admission) {}

  // On a stateless admission thread, never the connection's strand: admission may wait (see the
  // header). A session's call moves to the store pool before its checkout may wait there.
  void Start(GenerationCall& call) {
    StartCall(*exchange_, call, [&]() -> absl::Status {
      TOST_RETURN_IF_ERROR(Parse());
      if (request_.session_id.empty()) return Admit(call);
      return AdmitOnStorePool(store_admission_, exchange_, call,
                              [this, &call] { return Admit(call); });
    });
  }

  absl::Status Refine(AdmissionStep step, absl::Status status) override {
    switch (step) {
      case AdmissionStep::kResolve:
        return ModelRefusal(engine_, request_.model, std::move(status));
      case AdmissionStep::kCompileConstraint:
        return ConstraintRefusal(request_.constraint_field, std::move(status));
      case AdmissionStep::kContinueConstraint:
        // A session or blob left mid-structure (here or by tost.v1 Generate) goes on under its
        // constraint; this API has no way to clear it, which tost.v1 Generate's clear_constraint
        // offers.
        return openai::WithParam(std::move(status),
                                 endpoint_ == Endpoint::kChatCompletions ? "messages" : "prompt");
      default:
        return status;
    }
  }
  absl::StatusOr<GenerationInput> Input(const AdmittedCall& call) override {
    return openai::ToGenerationInput(request_, call.generator->config(), &prompt_storage_);
  }
  void Started(const AdmittedCall& call) override {
    openai::ResponseMeta meta;
    meta.id = openai::ResponseId(endpoint_, exchange_->request().request_id);
    meta.created = absl::ToUnixSeconds(absl::Now());
    meta.model = call.model;
    builder_ = std::make_unique<openai::ResponseBuilder>(request_, std::move(meta),
                                                         call.generator->tokenizer());
    if (request_.stream) exchange_->StartStream();
  }
  bool HasRoom() override { return !request_.stream || exchange_->HasRoom(); }
  bool NotifyWhenRoom(absl::AnyInvocable<void()> wake) override {
    // OnWritable takes a copyable callback, and runs it posted even when there is room now.
    exchange_->OnWritable(
        [wake = std::make_shared<absl::AnyInvocable<void()>>(std::move(wake))] { (*wake)(); });
    return true;
  }
  absl::Status Token(size_t choice, const TokenEvent& token) override {
    const auto index = static_cast<int32_t>(choice);
    if (!request_.stream) {
      builder_->AddToken(index, token);
    } else if (std::string chunk = builder_->Token(index, token); !chunk.empty()) {
      exchange_->Write(std::move(chunk));
    }
    return absl::OkStatus();
  }
  // Never asked for: these routes take no snapshot interval.
  absl::Status Snapshot(size_t, std::string, int64_t) override { return absl::OkStatus(); }
  absl::Status Final(size_t choice, const GenerationEvent& event, std::string blob) override {
    const auto index = static_cast<int32_t>(choice);
    if (choice == 0) builder_->set_cached_tokens(event.cached_tokens);
    if (!request_.stream) return builder_->Finish(index, event, blob);
    TOST_ASSIGN_OR_RETURN(std::string chunk, builder_->FinishChunk(index, event, blob));
    exchange_->Write(std::move(chunk));
    return absl::OkStatus();
  }
  void End(const absl::Status& status, bool client_gone) override {
    if (!request_.stream) {
      if (client_gone) return;  // nobody to answer; the exchange reports 499
      if (!status.ok()) return RespondError(*exchange_, status);
      exchange_->Respond(http::MakeResponse(200, builder_->Body()));
      return;
    }
    if (!client_gone && status.ok()) {
      exchange_->Write(builder_->End());
    } else if (!client_gone) {
      const absl::Status client = ClientStatus(*exchange_, status);
      exchange_->Write(openai::ErrorEvent(client, openai::ErrorParam(client)));
    }
    exchange_->Finish();
  }
  void Abort() override { exchange_->Abort(); }

 private:
  absl::Status Parse() {
    TOST_ASSIGN_OR_RETURN(request_,
                          openai::ParseOpenAiRequest(endpoint_, exchange_->request().body));
    return absl::OkStatus();
  }
  absl::Status Admit(GenerationCall& call) {
    const http::HttpRequest& http_request = exchange_->request();
    const bool fresh = request_.session_id.empty() && !request_.state.has_value();
    // OpenAI's servers sample an unseeded request differently each time; the seed is drawn here,
    // where a sampling setting applies (a continued generation that sets none keeps its state's).
    if (!request_.seed.has_value() && (fresh || openai::SetsSampling(request_))) {
      request_.seed = RandomSeed();
    }
    GenerationCallRequest r;
    r.owner = CallerOf(http_request);
    r.model = request_.model;
    r.session_id = request_.session_id;
    r.state_blob = request_.state;
    r.choices = request_.n;
    r.constraint = request_.constraint;
    r.return_state = request_.return_state;
    r.priority = request_.priority;
    r.names = openai::FieldNames(request_);
    return call.Admit(std::move(r));
  }
  Engine& engine_;
  const std::shared_ptr<HttpExchange> exchange_;
  const Endpoint endpoint_;
  HandlerPool& store_admission_;
  // Set by Parse(), Admit() and Started(), then read-only.
  openai::OpenAiRequest request_;
  std::string prompt_storage_;  // a chat's rendered prompt, which the call's input views
  std::unique_ptr<openai::ResponseBuilder> builder_;
};

void Route(Engine& engine, const ServiceLimits& limits, AdmissionPools admission, Endpoint endpoint,
           std::shared_ptr<HttpExchange> exchange) {
  auto sink = std::make_shared<OpenAiSink>(engine, exchange, endpoint, admission.store);
  std::shared_ptr<GenerationCall> call = GenerationCall::Create(engine, limits, sink);
  if (!admission.stateless.Schedule([sink, call] { sink->Start(*call); })) {
    RespondError(*exchange, admission.stateless.Refusal(exchange->request().path));
  }
}

}  // namespace

void AddOpenAiRoutes(ServingEngine engine, const ServiceLimits& limits, AdmissionPools admission,
                     http::HttpRouter& router) {
  router.Handle("GET", "/v1/models", [engine](std::shared_ptr<HttpExchange> exchange) {
    if (Engine* e = EngineOrLoading(engine, *exchange))
      exchange->Respond(http::MakeResponse(200, openai::ModelsListBody(e->models())));
  });
  router.Handle("POST", "/v1/completions",
                [engine, &limits, admission](std::shared_ptr<HttpExchange> exchange) {
                  if (Engine* e = EngineOrLoading(engine, *exchange))
                    Route(*e, limits, admission, Endpoint::kCompletions, std::move(exchange));
                });
  router.Handle("POST", "/v1/chat/completions",
                [engine, &limits, admission](std::shared_ptr<HttpExchange> exchange) {
                  if (Engine* e = EngineOrLoading(engine, *exchange))
                    Route(*e, limits, admission, Endpoint::kChatCompletions, std::move(exchange));
                });
}

}  // namespace tost::service
