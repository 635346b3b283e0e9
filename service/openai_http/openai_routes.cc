#include "service/openai_http/openai_routes.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/utf8.h"
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
  OpenAiSink(Engine& engine, const ServiceLimits& limits, std::shared_ptr<HttpExchange> exchange,
             Endpoint endpoint, HandlerPool& store_admission)
      : engine_(engine),
        limits_(limits),
        exchange_(std::move(exchange)),
        endpoint_(endpoint),
        store_admission_(store_admission) {}

  // On a stateless admission thread, never the connection's strand: admission may wait (see the
  // header). A session's call moves to the store pool before its checkout may wait there.
  void Start(GenerationCall& call) {
    StartCall(*exchange_, call, [&]() -> absl::Status {
      TOST_RETURN_IF_ERROR(Parse());
      if (request_.echo) {
        TOST_RETURN_IF_ERROR(ScoreEcho());
        if (request_.max_tokens == 0) return AnswerEchoOnly();
      }
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
        if (status.code() == absl::StatusCode::kInvalidArgument &&
            request_.constraint_field == "tools") {
          return ToolSchemaRefusal(std::move(status));
        }
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
    if (const auto& chat = call.generator->config().chat_template;
        chat.has_value() && chat->tools.has_value() &&
        request_.tool_choice != openai::ToolChoice::kNone) {
      builder_->set_call_begin(chat->tools->call_begin);
    }
    if (request_.stream) exchange_->StartStream();
    if (request_.echo) {
      if (std::string chunks = builder_->Echo(echo_); !chunks.empty()) {
        exchange_->Write(std::move(chunks));
      }
    }
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
    for (auto& [key, value] : openai::AccessLogFields(request_.identifiers)) {
      exchange_->AddLogField(std::move(key), std::move(value));
    }
    return absl::OkStatus();
  }
  // echo: the prompt's text and, with logprobs, each of its tokens scored in one forward over it
  // (GenerativeModel::ScorePrompt), before the call is admitted: a prompt the model cannot score
  // is refused before anything is generated. The forward runs on this admission thread, beside
  // the scheduler's steps; the prompt is at most the context length.
  absl::Status ScoreEcho() {
    auto scheduler = engine_.Scheduler(request_.model);
    if (!scheduler.ok()) return ModelRefusal(engine_, request_.model, scheduler.status());
    const GenerativeModel& model = (*scheduler)->model();
    GenerationInput in;
    if (request_.prompt_tokens.has_value()) {
      in.prompt_tokens = absl::MakeConstSpan(*request_.prompt_tokens);
    } else if (request_.prompt_text.has_value()) {
      in.prompt_text = *request_.prompt_text;
    }
    auto ids = PromptTokenIds(in, model.tokenizer(), limits_, openai::FieldNames(request_));
    if (!ids.ok()) return openai::WithParam(ids.status(), "prompt");
    const std::vector<int32_t> tokens = *std::move(ids);
    const int64_t vocab = model.config().language.vocab_size;
    const int64_t context = model.config().language.context_length;
    if (tokens.empty()) {
      return openai::FieldError("prompt",
                                "expected a prompt of at least one token to echo, got none");
    }
    if (static_cast<int64_t>(tokens.size()) > context) {
      return openai::FieldError(
          "prompt", absl::StrCat("echo scores a prompt in one pass over the model's context: "
                                 "expected at most ",
                                 context, " tokens for model ", QuoteClientText(request_.model),
                                 ", got ", tokens.size()));
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab) {
        return openai::FieldError(
            absl::StrCat("prompt[", i, "]"),
            absl::StrCat("expected a token id of model ", QuoteClientText(request_.model),
                         "'s vocabulary (0 to ", vocab - 1, "), got ", tokens[i]));
      }
    }
    const model::Tokenizer& tokenizer = model.tokenizer();
    if (request_.prompt_text.has_value()) {
      echo_.text = *request_.prompt_text;
    } else {
      std::string bytes;
      for (int32_t t : tokens) bytes += tokenizer.TokenBytes(t);
      echo_.text = model::EscapeInvalidUtf8(bytes);
    }
    echo_prompt_tokens_ = static_cast<int32_t>(tokens.size());
    if (!request_.logprobs.has_value()) return absl::OkStatus();
    std::vector<model::DrawnToken> scored;
    if (tokens.size() > 1) {
      auto s = model.ScorePrompt(tokens, *request_.logprobs);
      if (!s.ok()) return openai::WithParam(s.status(), "prompt");
      scored = *std::move(s);
    }
    echo_.tokens.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      TokenEvent& t = echo_.tokens[i];
      t.id = tokens[i];
      t.bytes = tokenizer.TokenBytes(tokens[i]);
      t.position = static_cast<int64_t>(i);
      if (i == 0) continue;
      const model::DrawnToken& d = scored[i - 1];
      if (d.nonfinite_id >= 0) {
        return absl::InternalError(absl::StrCat("model ", request_.model,
                                                ": a non-finite logit scoring the prompt (id ",
                                                d.nonfinite_id, ")"));
      }
      t.logprob = d.logprob;
      t.top_logprobs = d.top_logprobs;
    }
    return absl::OkStatus();
  }
  // echo with max_tokens 0: the prompt scored is the whole answer; nothing is admitted.
  absl::Status AnswerEchoOnly() {
    openai::ResponseMeta meta;
    meta.id = openai::ResponseId(endpoint_, exchange_->request().request_id);
    meta.created = absl::ToUnixSeconds(absl::Now());
    meta.model = request_.model;
    auto scheduler = engine_.Scheduler(request_.model);
    if (!scheduler.ok()) return ModelRefusal(engine_, request_.model, scheduler.status());
    openai::ResponseBuilder builder(request_, std::move(meta), (*scheduler)->model().tokenizer());
    GenerationEvent finished;
    finished.kind = GenerationEvent::Kind::kFinished;
    finished.finish_reason = FinishReason::kLength;
    finished.prompt_tokens = echo_prompt_tokens_;
    if (!request_.stream) {
      builder.Echo(echo_);
      for (int32_t i = 0; i < request_.n; ++i) TOST_RETURN_IF_ERROR(builder.Finish(i, finished));
      exchange_->Respond(http::MakeResponse(200, builder.Body()));
      return absl::OkStatus();
    }
    exchange_->StartStream();
    std::string out = builder.Echo(echo_);
    for (int32_t i = 0; i < request_.n; ++i) {
      TOST_ASSIGN_OR_RETURN(std::string chunk, builder.FinishChunk(i, finished));
      out += chunk;
    }
    out += builder.End();
    exchange_->Write(std::move(out));
    exchange_->Finish();
    return absl::OkStatus();
  }
  // The compiler refused the tool calls' schema, which holds every called function's parameters:
  // the first function whose parameters it refuses on their own is named
  // (tools[i].function.parameters), with its own refusal. Compiled only on this failure path, each
  // within the engine's compile bound, and one that compiles is cached for the next request.
  absl::Status ToolSchemaRefusal(absl::Status status) {
    const std::string owner = CallerOf(exchange_->request());
    for (const auto& [field, parameters] : openai::ToolParameterConstraints(request_)) {
      auto compiled = engine_.CompileConstraint(request_.model, parameters, owner);
      if (!compiled.ok() && compiled.status().code() == absl::StatusCode::kInvalidArgument) {
        return ConstraintRefusal(field, compiled.status());
      }
    }
    return ConstraintRefusal("tools", std::move(status));
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
    r.prompt_cache_key = request_.identifiers.prompt_cache_key;
    r.names = openai::FieldNames(request_);
    return call.Admit(std::move(r));
  }
  Engine& engine_;
  const ServiceLimits& limits_;
  const std::shared_ptr<HttpExchange> exchange_;
  const Endpoint endpoint_;
  HandlerPool& store_admission_;
  // Set by Parse(), Admit() and Started(), then read-only.
  openai::OpenAiRequest request_;
  std::string prompt_storage_;  // a chat's rendered prompt, which the call's input views
  openai::EchoedPrompt echo_;   // echo: the prompt, scored when logprobs are asked for
  int32_t echo_prompt_tokens_ = 0;
  std::unique_ptr<openai::ResponseBuilder> builder_;
};

void Route(Engine& engine, const ServiceLimits& limits, AdmissionPools admission, Endpoint endpoint,
           std::shared_ptr<HttpExchange> exchange) {
  auto sink = std::make_shared<OpenAiSink>(engine, limits, exchange, endpoint, admission.store);
  std::shared_ptr<GenerationCall> call = GenerationCall::Create(engine, limits, sink);
  if (!admission.stateless.Schedule([sink, call] { sink->Start(*call); })) {
    RespondError(*exchange, admission.stateless.Refusal(exchange->request().path));
  }
}

// The language model a tokenizer route names (`name`), or the server's only one when it names
// none.
absl::StatusOr<const GenerativeModel*> TokenizerModel(Engine& engine, const std::string& name) {
  std::string model = name;
  if (model.empty()) {
    std::vector<std::string> served;
    for (const ModelEntry& m : engine.models()) {
      if (m.load_status.ok() && m.generator != nullptr) served.push_back(m.name);
    }
    if (served.size() != 1) {
      return openai::FieldError(
          "model", absl::StrCat("missing: expected the name of a language model (this server "
                                "serves ",
                                served.size(), "), as GET /v1/models lists them"));
    }
    model = served[0];
  }
  auto scheduler = engine.Scheduler(model);
  if (!scheduler.ok()) return ModelRefusal(engine, model, scheduler.status());
  return &(*scheduler)->model();
}

absl::Status Tokenize(Engine& engine, const ServiceLimits& limits, HttpExchange& exchange) {
  TOST_ASSIGN_OR_RETURN(openai::TokenizeRequest r,
                        openai::ParseTokenizeRequest(exchange.request().body));
  TOST_ASSIGN_OR_RETURN(const GenerativeModel* model, TokenizerModel(engine, r.model));
  GenerationInput in;
  in.prompt_text = r.prompt;
  GenerationFieldNames names;
  names.prompt_text = "prompt";
  auto tokens = PromptTokenIds(in, model->tokenizer(), limits, names);
  if (!tokens.ok()) return openai::WithParam(tokens.status(), "prompt");
  exchange.Respond(http::MakeResponse(
      200, openai::TokenizeBody(*tokens, model->config().language.context_length)));
  return absl::OkStatus();
}

absl::Status Detokenize(Engine& engine, const ServiceLimits& limits, HttpExchange& exchange) {
  TOST_ASSIGN_OR_RETURN(openai::DetokenizeRequest r,
                        openai::ParseDetokenizeRequest(exchange.request().body));
  TOST_ASSIGN_OR_RETURN(const GenerativeModel* model, TokenizerModel(engine, r.model));
  GenerationInput in;
  in.prompt_tokens = absl::MakeConstSpan(r.tokens);
  GenerationFieldNames names;
  names.prompt_tokens = "tokens";
  // The prompt limit bounds the ids' count as it bounds a prompt's.
  auto tokens = PromptTokenIds(in, model->tokenizer(), limits, names);
  if (!tokens.ok()) return openai::WithParam(tokens.status(), "tokens");
  const int64_t vocab = model->tokenizer().vocab_size();
  std::string bytes;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const int32_t id = (*tokens)[i];
    if (id >= vocab) {
      return openai::FieldError(absl::StrCat("tokens[", i, "]"),
                                absl::StrCat("expected a token id of the model's vocabulary (0 to ",
                                             vocab - 1, "), got ", id));
    }
    bytes += model->tokenizer().TokenBytes(id);
  }
  exchange.Respond(http::MakeResponse(200, openai::DetokenizeBody(bytes)));
  return absl::OkStatus();
}

// The tokenizer routes run on the stateless admission pool: a prompt of up to the prompt limit is
// tokenised off the connection's thread.
void TokenizerRoute(Engine& engine, const ServiceLimits& limits, HandlerPool& pool,
                    std::shared_ptr<HttpExchange> exchange,
                    absl::Status (*handle)(Engine&, const ServiceLimits&, HttpExchange&)) {
  const std::string path = exchange->request().path;
  if (!pool.Schedule([&engine, &limits, exchange, handle] {
        if (exchange->cancelled()) return;
        if (absl::Status s = handle(engine, limits, *exchange); !s.ok()) RespondError(*exchange, s);
      })) {
    RespondError(*exchange, pool.Refusal(path));
  }
}

}  // namespace

void AddOpenAiRoutes(ServingEngine engine, const ServiceLimits& limits, AdmissionPools admission,
                     http::HttpRouter& router) {
  router.Handle("GET", "/v1/models", [engine](std::shared_ptr<HttpExchange> exchange) {
    if (Engine* e = EngineOrLoading(engine, *exchange))
      exchange->Respond(http::MakeResponse(200, openai::ModelsListBody(e->models())));
  });
  router.Handle("GET", "/v1/models/{model}", [engine](std::shared_ptr<HttpExchange> exchange) {
    Engine* e = EngineOrLoading(engine, *exchange);
    if (e == nullptr) return;
    const std::string name(exchange->request().PathParam("model"));
    if (std::optional<std::string> body = openai::ModelBody(e->models(), name)) {
      exchange->Respond(http::MakeResponse(200, *std::move(body)));
      return;
    }
    // Not served here: the engine's own words (unknown, failed to load, or a classifier).
    absl::Status status =
        absl::NotFoundError(absl::StrCat("model ", QuoteClientText(name), " is not served"));
    if (auto scheduler = e->Scheduler(name); !scheduler.ok()) status = scheduler.status();
    RespondError(*exchange, ModelRefusal(*e, name, std::move(status)));
  });
  router.Handle("GET", "/tokenizer_info", [engine](std::shared_ptr<HttpExchange> exchange) {
    Engine* e = EngineOrLoading(engine, *exchange);
    if (e == nullptr) return;
    auto model = TokenizerModel(*e, "");
    if (!model.ok()) return RespondError(*exchange, model.status());
    exchange->Respond(http::MakeResponse(
        200, openai::TokenizerInfoBody((*model)->config(), (*model)->tokenizer())));
  });
  router.Handle("POST", "/tokenize",
                [engine, &limits, admission](std::shared_ptr<HttpExchange> exchange) {
                  if (Engine* e = EngineOrLoading(engine, *exchange))
                    TokenizerRoute(*e, limits, admission.stateless, std::move(exchange), Tokenize);
                });
  router.Handle(
      "POST", "/detokenize", [engine, &limits, admission](std::shared_ptr<HttpExchange> exchange) {
        if (Engine* e = EngineOrLoading(engine, *exchange))
          TokenizerRoute(*e, limits, admission.stateless, std::move(exchange), Detokenize);
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
