#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "service/http/http_server.h"
#include "service/http/internal/core.h"
#include "service/http/internal/request.h"
#include "service/observability/logging.h"
#include "service/observability/trace_context.h"

namespace tost::http {

using internal::Absl;

HttpResponse MakeResponse(int status, std::string body, std::string content_type) {
  HttpResponse r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

std::string_view HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return {};
}

std::string_view HttpRequest::PathParam(std::string_view name) const {
  for (const auto& [param, value] : path_params) {
    if (param == name) return value;
  }
  return {};
}

namespace internal {

HttpRequest ParseRequest(bhttp::request<bhttp::string_body>& message, const std::string& peer) {
  HttpRequest r;
  r.method = std::string(message.method_string());
  const std::string_view target = message.target();
  const size_t q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
  for (const auto& field : message) {
    r.headers.emplace_back(absl::AsciiStrToLower(Absl(field.name_string())),
                           std::string(field.value()));
  }
  r.body = std::move(message.body());
  service::RequestIdentity who =
      service::IdentifyRequest(r.Header("x-request-id"), r.Header("traceparent"));
  r.request_id = std::move(who.request_id);
  r.trace_id = std::move(who.trace_id);
  r.span_id = std::move(who.span_id);
  r.peer = peer;
  const std::string_view auth = r.Header("authorization");
  if (absl::StartsWithIgnoreCase(Absl(auth), "bearer ")) {
    r.bearer_token = std::string(absl::StripAsciiWhitespace(Absl(auth.substr(7))));
  }
  return r;
}

}  // namespace internal
}  // namespace tost::http
