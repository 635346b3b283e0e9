// OpenAI's Responses API and Conversations API on the HTTP front end, where a conversation is its
// state: a few KB of statistics per stored response, whatever the conversation's length.
//
//   POST   /v1/responses                      a response (JSON or the Responses event stream)
//   GET    /v1/responses/{id}                 a stored response
//   DELETE /v1/responses/{id}
//   GET    /v1/responses/{id}/input_items     its input items, paginated
//   POST   /v1/conversations                  a conversation (with items to start from)
//   GET    /v1/conversations/{id}             ... and POST (metadata), DELETE
//   GET    /v1/conversations/{id}/items       ... and POST (add items)
//   GET    /v1/conversations/{id}/items/{item_id}, DELETE (an item not yet answered)
//
// A response with `store` (the default) keeps the state after its output, sealed and bound to its
// owner, in the RecordStore: a request naming it as previous_response_id continues that state and
// prefills only its own input, on any replica sharing the store; two requests may continue the
// same response (a branch). A response in a conversation advances the conversation's state the
// same way. `store: false` keeps nothing; the `state` / `return_state` extensions carry the blob
// instead, as on the chat routes. Every generation is a CallSink of a GenerationCall
// (service/generation), as the chat routes are.
#pragma once

#include "service/api/handler_pool.h"
#include "service/api/request_input.h"
#include "service/engine/record_store.h"
#include "service/http/http_server.h"
#include "service/openai_http/openai_routes.h"

namespace tost::service {

// Adds the routes to `router`. `store` holds responses and conversations; it, `limits`,
// `admission`'s pools and `observer` (may be null) must outlive the HTTP server, and the engine
// must outlive the pools. Store calls run on the store pool's threads (handler_pool.h), never on a
// connection's: the stored responses' and conversations' routes, a new response that continues a
// stored one or a conversation (parsed on the stateless pool first), and a response's writes.
void AddResponsesRoutes(ServingEngine engine, const ServiceLimits& limits, AdmissionPools admission,
                        RecordStore& store, ResponsesObserver* observer, http::HttpRouter& router);

}  // namespace tost::service
