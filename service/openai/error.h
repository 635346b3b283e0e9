// OpenAI's error shape for the OpenAI-compatible API: {"error": {"message", "type", "param",
// "code"}}, built from the absl::Status the protocol layer or the engine returned. The HTTP status
// is the HTTP layer's mapping of the same absl::StatusCode; this file only builds the body.
//
// Which request field a status is about travels with the status itself (a payload set by
// FieldError), so that the errors of the request parser reach the body's "param" however many
// layers return them.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tost::service::openai {

// OpenAI's error "type" for a status code: invalid_request_error (INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION, ALREADY_EXISTS, ABORTED, UNIMPLEMENTED), authentication_error
// (UNAUTHENTICATED), permission_error (PERMISSION_DENIED), not_found_error (NOT_FOUND),
// rate_limit_error (RESOURCE_EXHAUSTED), server_error (everything else: INTERNAL, UNAVAILABLE,
// DEADLINE_EXCEEDED, ...).
const char* OpenAiErrorType(absl::StatusCode code);

// INVALID_ARGUMENT "<param>: <message>", carrying `param` for OpenAiErrorBody.
absl::Status FieldError(absl::string_view param, absl::string_view message);
// `status` with `param` attached (kept if it already names one).
absl::Status WithParam(absl::Status status, absl::string_view param);
// The field a status is about ("" when none was attached).
std::string ErrorParam(const absl::Status& status);

// {"error": {"message": status.message(), "type": OpenAiErrorType(code), "param": param or the
// status's own (null when neither), "code": the status code in snake case ("invalid_argument",
// "resource_exhausted", ...)}}. Valid JSON whatever bytes the message holds (invalid UTF-8 is
// written as \xNN). An OK status is reported as an internal error: it means a caller bug.
std::string OpenAiErrorBody(const absl::Status& status, absl::string_view param = "");

}  // namespace tost::service::openai
