#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/http/http_server.h"
#include "service/http/internal/core.h"
#include "service/http/internal/request.h"

namespace tost::http {

namespace {

HttpResponse DefaultErrorResponse(int status, std::string_view message) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = absl::StrCat(internal::Absl(message), "\n");
  return r;
}

}  // namespace

void HttpRouter::Handle(std::string method, std::string path, HttpHandler handler,
                        RouteOptions options) {
  routes_.push_back({std::move(method), std::move(path), std::move(handler), options});
}

void HttpRouter::SetAuthenticator(
    std::function<absl::StatusOr<std::string>(const HttpRequest&)> auth) {
  authenticator_ = std::move(auth);
}

HttpRouter::Match HttpRouter::Find(std::string_view method, std::string_view path) const {
  Match m;
  std::vector<std::string> allowed;
  for (const Route& r : routes_) {
    if (r.path != path) continue;
    m.route = r.path;
    if (r.method == method || (method == "HEAD" && r.method == "GET")) {
      m.handler = &r.handler;
      m.is_public = r.options.is_public;
      return m;
    }
    allowed.push_back(r.method);
    if (r.method == "GET") allowed.push_back("HEAD");
  }
  if (allowed.empty()) {
    m.status = 404;
    return m;
  }
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
  m.status = 405;
  m.allow = absl::StrJoin(allowed, ", ");
  return m;
}

HttpResponse HttpServer::Core::Error(int status, std::string_view message) const {
  return options.error_response ? options.error_response(status, message)
                                : DefaultErrorResponse(status, message);
}

namespace internal {

std::optional<HttpResponse> RouteRefusal(const HttpServer::Core& core,
                                         const HttpRouter::Match& match, HttpRequest& r) {
  const HttpRouter& router = core.router;
  if (!match.is_public && router.authenticator()) {
    absl::StatusOr<std::string> caller = router.authenticator()(r);
    if (!caller.ok()) {
      const int status = caller.status().code() == absl::StatusCode::kPermissionDenied ? 403 : 401;
      HttpResponse e = core.Error(status, std::string_view(caller.status().message().data(),
                                                           caller.status().message().size()));
      if (status == 401) e.headers.emplace_back("WWW-Authenticate", "Bearer");
      return e;
    }
    r.caller = *std::move(caller);
  }
  if (match.handler != nullptr) return std::nullopt;
  HttpResponse e =
      match.status == 405
          ? core.Error(405, absl::StrCat(r.path, " takes ", match.allow, ", got ", r.method))
          : core.Error(404, absl::StrCat("no route for ", r.path));
  if (match.status == 405) e.headers.emplace_back("Allow", match.allow);
  return e;
}

}  // namespace internal
}  // namespace tost::http
