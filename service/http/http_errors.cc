#include "service/http/http_errors.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/error_detail.h"

namespace tost::http {
namespace {

// Debian's Abseil has its own string_view type.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // the client went away; nginx's number, never seen by the client
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string_view OpenAiErrorType(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    default:
      return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string OpenAiErrorBody(std::string_view message, std::string_view type, std::string_view param,
                            std::string_view code) {
  // The routes' errors come bounded (openai_http/route_support.h: ClientStatus); this bounds the
  // HTTP layer's own and any other caller's all the same.
  std::string shown(message);
  if (message.size() > kMaxClientMessageBytes) {
    size_t n = kMaxClientMessageBytes - 32;  // room for the length
    while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xc0) == 0x80) --n;  // whole UTF-8
    shown = absl::StrCat(Absl(message.substr(0, n)), "... (", message.size(), " bytes)");
  }
  nlohmann::json error = {{"message", std::move(shown)},
                          {"type", std::string(type)},
                          {"param", nullptr},
                          {"code", nullptr}};
  if (!param.empty()) error["param"] = std::string(param);
  if (!code.empty()) error["code"] = std::string(code);
  // Replaced rather than refused: a message may quote what a client sent.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
}

std::optional<int64_t> RetryAfterSeconds(const absl::Status& status) {
  const std::string_view message(status.message().data(), status.message().size());
  constexpr std::string_view kAbout = "retry after about ";
  if (const size_t at = message.find(kAbout); at != std::string_view::npos) {
    std::string_view rest = message.substr(at + kAbout.size());
    const size_t digits = rest.find_first_not_of("0123456789");
    int64_t ms = 0;
    if (digits != 0 && absl::SimpleAtoi(Absl(rest.substr(0, digits)), &ms) &&
        absl::StartsWith(Absl(rest.substr(digits == std::string_view::npos ? rest.size() : digits)),
                         " ms")) {
      return std::max<int64_t>(1, (ms + 999) / 1000);
    }
  }
  if (message.find("retry after") != std::string_view::npos) return 1;
  return std::nullopt;
}

HttpResponse ErrorResponse(const absl::Status& status, std::string_view param) {
  HttpResponse r;
  r.status = HttpStatusFor(status.code());
  r.content_type = "application/json";
  r.body = OpenAiErrorBody(std::string_view(status.message().data(), status.message().size()),
                           OpenAiErrorType(r.status), param,
                           absl::AsciiStrToLower(absl::StatusCodeToString(status.code())));
  // A full queue (429) and a store that cannot be reached (503) say when to come back.
  if (r.status == 429 || r.status == 503) {
    if (const auto seconds = RetryAfterSeconds(status))
      r.headers.emplace_back("Retry-After", absl::StrCat(*seconds));
  }
  return r;
}

HttpResponse ErrorResponse(int http_status, std::string_view message) {
  HttpResponse r;
  r.status = http_status;
  r.content_type = "application/json";
  r.body = OpenAiErrorBody(message, OpenAiErrorType(http_status));
  return r;
}

}  // namespace tost::http
