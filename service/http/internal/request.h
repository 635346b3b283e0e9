// What a connection does with a complete request before any handler sees it, for the HTTP server's
// own .cc files only: the HttpRequest a handler gets from the parsed message (its request id and
// bearer token decided here), and whether the router lets it through or the server answers itself
// (401/403 from the authenticator, 404, 405). Neither touches the socket.
#pragma once

#include <optional>
#include <string>

#include <boost/beast/http.hpp>

#include "service/http/http_server.h"

namespace tost::http {
namespace internal {

// The request of `message` (its body moved out) from `peer`. Header names are lower-cased; the
// request id and trace come from its x-request-id and traceparent headers
// (service/observability/trace_context.h: IdentifyRequest).
HttpRequest ParseRequest(boost::beast::http::request<boost::beast::http::string_body>& message,
                         const std::string& peer);

// The server's own answer to `request` routed to `match`, or nothing when its handler should run.
// Non-public routes (and unknown ones, so an unauthenticated client learns nothing of what exists)
// go through the router's authenticator first; a caller it accepts is set in request.caller.
std::optional<HttpResponse> RouteRefusal(const HttpServer::Core& core,
                                         const HttpRouter::Match& match, HttpRequest& request);

}  // namespace internal
}  // namespace tost::http
