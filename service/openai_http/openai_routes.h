// The OpenAI-compatible API on the HTTP front end: GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions. Each generation route is a CallSink of a GenerationCall
// (service/generation), which holds every admission and streaming rule; this file parses the JSON
// body (service/openai), names errors as the request named its fields, and writes one JSON body or
// SSE chunks, pausing while the exchange's buffer is full (HasRoom / OnWritable). An unseeded
// request gets a random seed (OpenAI's behaviour); one that sends `seed` is reproducible.
#pragma once

#include <functional>

#include "service/api/handler_pool.h"
#include "service/api/request_input.h"
#include "service/engine/engine.h"
#include "service/http/http_server.h"

namespace tost::service {

// The engine once the models are loaded, null before: the HTTP front end listens while they load
// (as gRPC's loading responder does), and the routes answer 503 until then.
using ServingEngine = std::function<Engine*()>;

// Adds the three routes to `router`. The engine it returns, `limits` and `admission`'s pools must
// outlive the HTTP server, and the engine must outlive the pools too (their destructors run the
// tasks still queued). A request is parsed on the stateless pool and, when it continues a session,
// admitted on the store pool (handler_pool.h); a request a pool refuses (its queue full) is
// answered 429 with Retry-After. Every route needs the router's authenticator: the request's
// `caller` owns the sessions, blobs and prefix-cache entries it creates.
void AddOpenAiRoutes(ServingEngine engine, const ServiceLimits& limits, AdmissionPools admission,
                     http::HttpRouter& router);

}  // namespace tost::service
