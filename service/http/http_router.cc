#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/engine/client_text.h"
#include "service/http/http_query.h"
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

// Routes are fixed in code, so a malformed one is a bug to stop at startup, not a request error.
[[noreturn]] void BadRoute(std::string_view method, std::string_view path, std::string_view why) {
  std::fprintf(stderr, "tost-serve: HTTP route %s %s: %s\n", std::string(method).c_str(),
               std::string(path).c_str(), std::string(why).c_str());
  std::abort();
}

// The segments of `path` (which starts with '/') after its leading '/': "/a//b/" has "a", "",
// "b" and "".
std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> out;
  path.remove_prefix(1);
  for (;;) {
    const size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    path.remove_prefix(slash + 1);
  }
}

// Whether a route's segments (`is_param` empty: an exact path, all literal) are more specific
// than another's matching the same path: a literal beats a `{name}` at the first that differ.
bool MoreSpecific(const std::vector<bool>& a, const std::vector<bool>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const bool a_param = i < a.size() && a[i];
    const bool b_param = i < b.size() && b[i];
    if (a_param != b_param) return b_param;
  }
  return false;
}

// Whether a route (its path; for a pattern also its segments, `is_param` saying which are
// `{name}`s) matches the request `path`, split into `segments` when it starts with '/'. The
// captures go to `params` when given.
bool Matches(const std::string& route_path, const std::vector<std::string>& route_segments,
             const std::vector<bool>& is_param, std::string_view path,
             const std::vector<std::string_view>& segments,
             std::vector<std::pair<std::string, std::string>>* params) {
  if (route_segments.empty()) return route_path == path;
  if (segments.size() != route_segments.size()) return false;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!is_param[i] && segments[i] != route_segments[i]) return false;
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!is_param[i]) continue;
    if (segments[i].empty()) return false;
    // A handler takes a parameter as one name (an id, ...): a decoded '/' would let it name
    // something else, and a NUL would end it early wherever it reaches a C API.
    std::optional<std::string> value = PercentDecode(segments[i]);
    if (!value || value->find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
      return false;
    }
    if (params != nullptr) params->emplace_back(route_segments[i], *std::move(value));
  }
  return true;
}

}  // namespace

void HttpRouter::Handle(std::string method, std::string path, HttpHandler handler,
                        RouteOptions options) {
  Route r{std::move(method), std::move(path), std::move(handler), options, {}, {}};
  if (r.path.find_first_of("{}") != std::string::npos) {
    if (r.path.front() != '/') BadRoute(r.method, r.path, "a pattern must start with '/'");
    for (const std::string_view segment : Segments(r.path)) {
      const bool is_param = segment.size() > 2 && segment.front() == '{' && segment.back() == '}';
      const std::string_view name = is_param ? segment.substr(1, segment.size() - 2) : segment;
      if (name.find_first_of("{}") != std::string_view::npos) {
        BadRoute(r.method, r.path,
                 absl::StrCat("segment '", internal::Absl(segment),
                              "' is neither literal nor a whole {name}"));
      }
      for (size_t i = 0; is_param && i < r.segments.size(); ++i) {
        if (r.is_param[i] && r.segments[i] == name) {
          BadRoute(r.method, r.path, absl::StrCat("{", internal::Absl(name), "} is used twice"));
        }
      }
      r.segments.emplace_back(name);
      r.is_param.push_back(is_param);
    }
  }
  routes_.push_back(std::move(r));
}

void HttpRouter::SetAuthenticator(
    std::function<absl::StatusOr<std::string>(const HttpRequest&)> auth) {
  authenticator_ = std::move(auth);
}

HttpRouter::Match HttpRouter::Find(std::string_view method, std::string_view path) const {
  Match m;
  std::vector<std::string_view> segments;
  if (!path.empty() && path.front() == '/') segments = Segments(path);
  const Route* best = nullptr;       // of those matching the path and the method
  const Route* best_path = nullptr;  // of those matching the path: the 405's route
  std::vector<std::string> allowed;
  for (const Route& r : routes_) {
    if (!Matches(r.path, r.segments, r.is_param, path, segments, nullptr)) continue;
    if (best_path == nullptr || MoreSpecific(r.is_param, best_path->is_param)) best_path = &r;
    if (r.method == method || (method == "HEAD" && r.method == "GET")) {
      if (best == nullptr || MoreSpecific(r.is_param, best->is_param)) best = &r;
    }
    allowed.push_back(r.method);
    if (r.method == "GET") allowed.push_back("HEAD");
  }
  if (best != nullptr) {
    m.handler = &best->handler;
    m.is_public = best->options.is_public;
    m.route = best->path;
    Matches(best->path, best->segments, best->is_param, path, segments, &m.path_params);
    return m;
  }
  if (best_path == nullptr) {
    m.status = 404;
    return m;
  }
  m.route = best_path->path;
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
  // The path and method are the client's: quoted short, as every message quotes a client's text.
  HttpResponse e =
      match.status == 405
          ? core.Error(405, absl::StrCat(service::QuoteClientText(r.path), " takes ", match.allow,
                                         ", got ", service::QuoteClientText(r.method)))
          : core.Error(404, absl::StrCat("no route for ", service::QuoteClientText(r.path)));
  if (match.status == 405) e.headers.emplace_back("Allow", match.allow);
  return e;
}

}  // namespace internal
}  // namespace tost::http
