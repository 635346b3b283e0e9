// Errors of the HTTP front end in OpenAI's JSON shape, so OpenAI clients parse them:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": "..."}}
// and the one mapping of absl::Status to an HTTP status that every route uses:
//   INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION 400   UNAUTHENTICATED    401
//   PERMISSION_DENIED                                 403   NOT_FOUND          404
//   ALREADY_EXISTS, ABORTED                           409   RESOURCE_EXHAUSTED 429 (+ Retry-After)
//   CANCELLED                                         499   UNAVAILABLE        503
//   DEADLINE_EXCEEDED                                 504   anything else      500
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "service/http/http_server.h"

namespace tost::http {

int HttpStatusFor(absl::StatusCode code);

// The "type" OpenAI gives errors of that HTTP status: invalid_request_error, authentication_error,
// permission_error, not_found_error, rate_limit_error, server_error.
std::string_view OpenAiErrorType(int http_status);

// The JSON body; `param` (the request field at fault) and `code` are null when empty.
std::string OpenAiErrorBody(std::string_view message, std::string_view type,
                            std::string_view param = "", std::string_view code = "");

// Seconds a client should wait before retrying, from the retry hint the engine's refusals carry in
// their message ("retry after about N ms": N rounded up to whole seconds; "retry after a short
// backoff": 1); nullopt without a hint.
std::optional<int64_t> RetryAfterSeconds(const absl::Status& status);

// A failed `status` as an HTTP response: the mapped status, the OpenAI-shaped body (code: the
// status code's name in lower case, e.g. "invalid_argument"), and Retry-After for a 429 or 503
// whose status carries a retry hint.
HttpResponse ErrorResponse(const absl::Status& status, std::string_view param = "");
// An error the HTTP layer itself gives (400, 404, 405, 413, 431, ...): what
// HttpServerOptions::error_response takes.
HttpResponse ErrorResponse(int http_status, std::string_view message);

}  // namespace tost::http
