// What the OpenAI-compatible routes (openai_routes.cc, responses_routes.cc) share: the error
// answer, the 503 while the models load, the refusals of a model or a constraint named the way the
// request named its fields, and the seed an unseeded request samples with.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "service/api/handler_pool.h"
#include "service/engine/engine.h"
#include "service/generation/generation_call.h"
#include "service/http/http_server.h"
#include "service/openai_http/openai_routes.h"

namespace tost::service {

// What the client of `exchange` is told of `status` (base/error_detail.h: bounded, no server
// detail, INTERNAL and the like as a fixed message naming the request id); what it is not told is
// logged under that id. Every error these routes answer or stream goes through it.
absl::Status ClientStatus(const http::HttpExchange& exchange, const absl::Status& status);

// OpenAI's error body with the status's HTTP code (and Retry-After when the status hints one), of
// ClientStatus(exchange, status).
void RespondError(http::HttpExchange& exchange, const absl::Status& status);

// The engine, or a 503 answered and null while the models load.
Engine* EngineOrLoading(const ServingEngine& engine, http::HttpExchange& exchange);

// The engine's refusal of `model` (param "model"), saying what these routes serve when it names a
// classifier.
absl::Status ModelRefusal(Engine& engine, const std::string& model, absl::Status status);

// The constraint compiler's refusal, naming `field` (the request field the constraint came from):
// 400 for a schema it refused or a model that cannot serve constraints, 429 with a Retry-After of
// 1 s for a compile past its bound.
absl::Status ConstraintRefusal(const std::string& field, absl::Status status);

// Starts `call` on an admission thread: nothing when the client already left, else the call learns
// of the client's leaving, and `admit` runs; its refusal is answered.
void StartCall(http::HttpExchange& exchange, GenerationCall& call,
               const std::function<absl::Status()>& admit);

// For a call StartCall began on the stateless admission pool whose parsed request names stored
// state: runs `admit` on `store` (the store pool, handler_pool.h), where waiting on the store holds
// up no call that needs none. There, nothing when the client left meanwhile; `admit`'s refusal is
// answered. The refusal of a full pool is returned (StartCall answers it: 429).
absl::Status AdmitOnStorePool(HandlerPool& store, std::shared_ptr<http::HttpExchange> exchange,
                              GenerationCall& call, std::function<absl::Status()> admit);

// OpenAI's servers sample an unseeded request differently each time: a seed from a thread-local
// generator.
uint64_t RandomSeed();

// The caller the router's authenticator set; without one (tests) everyone is the anonymous
// caller, as on gRPC without keys.
std::string CallerOf(const http::HttpRequest& request);

}  // namespace tost::service
