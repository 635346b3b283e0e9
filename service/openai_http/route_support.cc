#include "service/openai_http/route_support.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "base/error_detail.h"
#include "service/engine/client_text.h"
#include "service/engine/session_codec.h"
#include "service/http/http_errors.h"
#include "service/observability/logging.h"
#include "service/openai/error.h"

namespace tost::service {

absl::Status ClientStatus(const http::HttpExchange& exchange, const absl::Status& status) {
  const http::HttpRequest& request = exchange.request();
  ClientError client = ForClient(status, request.request_id);
  if (client.withheld) {
    Log(IsServerFailure(status.code()) ? LogLevel::kError : LogLevel::kWarning,
        "http error: part withheld from the client",
        {{"request_id", request.request_id},
         {"method", request.method},
         {"path", request.path},
         {"code", absl::StatusCodeToString(status.code())},
         {"error", FullErrorText(status)}});
  }
  return std::move(client.status);
}

void RespondError(http::HttpExchange& exchange, const absl::Status& status) {
  const absl::Status client = ClientStatus(exchange, status);
  exchange.Respond(http::ErrorResponse(client, openai::ErrorParam(client)));
}

Engine* EngineOrLoading(const ServingEngine& engine, http::HttpExchange& exchange) {
  Engine* e = engine();
  if (e == nullptr) {
    exchange.Respond(http::ErrorResponse(absl::UnavailableError(
        "the server is still loading its models; retry in a few seconds (GET /v1/health/ready "
        "answers 200 once it serves)")));
  }
  return e;
}

absl::Status ModelRefusal(Engine& engine, const std::string& model, absl::Status status) {
  // The engine's words for a classifier name gRPC's RPCs; these routes say what they serve.
  auto entry = engine.Find(model);
  if (status.code() != absl::StatusCode::kInvalidArgument || !entry.ok() ||
      (*entry)->classifier == nullptr) {
    return openai::WithParam(std::move(status), "model");
  }
  return openai::WithParam(
      absl::InvalidArgumentError(absl::StrCat(
          "model ", QuoteClientText(model),
          " is a classifier (tost_vision): completions, chat completions and responses need a "
          "language model (tost_lm); GET /v1/models lists them")),
      "model");
}

absl::Status ConstraintRefusal(const std::string& field, absl::Status status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:     // the compiler refused the schema, regex, ...
    case absl::StatusCode::kFailedPrecondition:  // the model cannot serve constraints: 400 too
      return openai::WithParam(
          absl::Status(status.code(), absl::StrCat(field, ": ", status.message())), field);
    case absl::StatusCode::kResourceExhausted:
      // The compile ran past its bound: 429 with a Retry-After of 1 s (http::ErrorResponse reads
      // the hint), not 503. Gateways count 5xx against a replica that is healthy here, and is the
      // one most likely to answer the retry from its cache; 429 is also what a full queue
      // answers, and what gRPC callers get.
      return openai::WithParam(absl::ResourceExhaustedError(absl::StrCat(
                                   field, ": ", status.message(), "; retry after about 1000 ms")),
                               field);
    default:
      return status;
  }
}

void StartCall(http::HttpExchange& exchange, GenerationCall& call,
               const std::function<absl::Status()>& admit) {
  if (exchange.cancelled()) return;  // gone while it waited for a thread: nothing to admit
  exchange.OnCancel([weak = call.weak_from_this()] {
    if (auto call = weak.lock()) call->ClientGone();
  });
  if (absl::Status admitted = admit(); !admitted.ok()) RespondError(exchange, admitted);
}

absl::Status AdmitOnStorePool(HandlerPool& store, std::shared_ptr<http::HttpExchange> exchange,
                              GenerationCall& call, std::function<absl::Status()> admit) {
  const std::string path = exchange->request().path;
  // The call (which owns the sink `admit` runs on) lives until the task has run.
  const bool scheduled = store.Schedule(
      [exchange = std::move(exchange), keep = call.shared_from_this(), admit = std::move(admit)] {
        if (exchange->cancelled()) return;  // gone while it waited for a thread
        if (absl::Status admitted = admit(); !admitted.ok()) RespondError(*exchange, admitted);
      });
  return scheduled ? absl::OkStatus() : store.Refusal(path);
}

uint64_t RandomSeed() {
  thread_local absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen);
}

std::string CallerOf(const http::HttpRequest& request) {
  return request.caller.empty() ? std::string(kAnonymousCaller) : request.caller;
}

}  // namespace tost::service
