// The OpenAI-compatible API on the HTTP front end: GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions, mapped onto the engine's generation schedulers (the same ones tost.v1
// Generate uses; no second queue). The bodies are service/openai's (parsed, rendered, built there);
// this file is the plumbing between an HttpExchange and GenerationJobs:
//
//   parse -> resolve the model and the state (fresh, session_id, or a state blob: the same owner
//   checks as gRPC, ResolveGenerationSource) -> one scheduler place per choice (429 with
//   Retry-After when full, 503 while draining) -> build, compile the request's constraint if it
//   has one (Engine::CompileConstraint; a refused one is 400 naming its field, a compile past its
//   time bound 429 with Retry-After) and submit -> consume the jobs' events from their listeners,
//   holding no thread per request.
//
// Admission (everything up to the submit) runs on the `admission` pool's threads, as tost.v1
// Generate's does (the server gives both the same pool), never on the HTTP server's I/O threads: it
// may wait (a session checked out of a shared store, a prompt of up to a MiB tokenised, a
// constraint compiled for up to --max_compile_ms), and an I/O thread that waits holds up every
// connection on it: other streams' tokens, health probes, /metrics.
//
// A non-streamed request collects its events and answers once. A streamed one (stream: true)
// writes each SSE chunk as its token is produced. When the client reads slower than the server
// generates, the stream's buffer fills (HttpExchange::HasRoom false) and the call stops taking
// events until OnWritable: the job's events pile up in the job, and the scheduler pauses it at
// --max_buffered_tokens and ends it after --stream_stall_timeout_ms; the call then resets the
// connection (the client is not reading) and checks the session's state in as gRPC does. A client
// that disconnects cancels its jobs.
//
// n > 1: n jobs, one per choice, each with seed ChoiceSeed(seed, i), all prefilling the same
// prompt; the engine's prefix-state cache makes a repeated prompt cheap for later requests, though
// not for choices prefilled side by side.
//
// An unseeded request is given a random seed (OpenAI's behaviour: unseeded requests vary); a
// request that sends `seed` is reproducible.
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

// Adds the three routes to `router`. The engine it returns, `limits` and `admission` must outlive
// the HTTP server, and the engine must outlive `admission` too (its destructor runs the tasks still
// queued). A request `admission` refuses (its queue full) is answered 429 with Retry-After. Every
// route needs the router's authenticator: the request's `caller` owns the sessions, blobs and
// prefix-cache entries it creates.
void AddOpenAiRoutes(ServingEngine engine, const ServiceLimits& limits, HandlerPool& admission,
                     http::HttpRouter& router);

}  // namespace tost::service
