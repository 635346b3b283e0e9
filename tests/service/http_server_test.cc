// The HTTP server of service/http over real sockets on 127.0.0.1: routing, request fields, limits
// and timeouts, streams with backpressure and cancellation, drain, and the OpenAI-shaped errors.
// (The /metrics endpoint's protections, on the same server, are in metrics_test.cc.)
#include "service/http/http_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "service/http/http_errors.h"
#include "service/http/http_query.h"
#include "tests/service/socket_test_util.h"

namespace tost::http {
namespace {

using ::tost::testing::Connect;
using ::tost::testing::ReadAll;
using ::tost::testing::SendAll;

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// Reads until `needle` has arrived (or the connection ends / 10 s pass).
std::string ReadUntil(int fd, std::string_view needle) {
  std::string got;
  char buf[4096];
  while (got.find(needle) == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  SendAll(fd, request);
  std::string response = ReadAll(fd);
  close(fd);
  return response;
}

// How long until the server closes `fd` (without sending), `limit` if it stays open.
SteadyClock::duration TimeUntilClosed(int fd, SteadyClock::duration limit) {
  const auto start = SteadyClock::now();
  while (SteadyClock::now() - start < limit) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) == 1) {
      char buf[4096];
      if (read(fd, buf, sizeof(buf)) <= 0) return SteadyClock::now() - start;
    }
  }
  return limit;
}

bool StartsWith(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

HttpServerOptions TestOptions() {
  HttpServerOptions o;
  o.address = "127.0.0.1";
  o.port = 0;
  o.log_requests = false;
  return o;
}

std::unique_ptr<HttpServer> StartOrDie(HttpServerOptions options, HttpRouter router) {
  auto server = HttpServer::Start(std::move(options), std::move(router));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

HttpHandler Text(std::string body) {
  return [body](std::shared_ptr<HttpExchange> e) {
    e->Respond(MakeResponse(200, body, "text/plain"));
  };
}

TEST(HttpServerTest, AHandlersLogFieldsGoOnItsAccessLogLineEscaped) {
  HttpRouter router;
  router.Handle("POST", "/who", [](std::shared_ptr<HttpExchange> e) {
    // From another thread, as the OpenAI routes add theirs from an admission thread.
    std::thread([e] {
      e->AddLogField("user", "eve\" status=500\nforged line");
      e->Respond(MakeResponse(200, "ok", "text/plain"));
    }).detach();
  });
  router.Handle("POST", "/plain", Text("ok"));
  HttpServerOptions o = TestOptions();
  o.log_requests = true;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  ::testing::internal::CaptureStderr();
  const std::string request =
      "POST /who HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  EXPECT_TRUE(StartsWith(Exchange(server->port(), request), "HTTP/1.1 200"));
  EXPECT_TRUE(StartsWith(Exchange(server->port(),
                                  "POST /plain HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Length: 0\r\nConnection: close\r\n\r\n"),
                         "HTTP/1.1 200"));
  server->Stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  const size_t who = log.find("path=/who ");
  ASSERT_NE(who, std::string::npos) << log;
  const std::string line = log.substr(who, log.find('\n', who) - who);
  EXPECT_NE(line.find(R"( user="eve\" status=500\nforged line")"), std::string::npos) << line;
  EXPECT_EQ(log.find("\nforged"), std::string::npos) << log;
  // Another request on the server: no field of the first.
  const size_t plain = log.find("path=/plain ");
  ASSERT_NE(plain, std::string::npos) << log;
  EXPECT_EQ(log.substr(plain, log.find('\n', plain) - plain).find("user="), std::string::npos);
}

TEST(HttpRouterTest, ExactPathsByMethodWith405AndAllowElse404) {
  HttpRouter router;
  router.Handle("GET", "/a", Text("a"));
  router.Handle("POST", "/a", Text("a"));
  router.Handle("POST", "/b", Text("b"));
  EXPECT_NE(router.Find("GET", "/a").handler, nullptr);
  EXPECT_NE(router.Find("HEAD", "/a").handler, nullptr) << "HEAD is served by GET";
  const auto put = router.Find("PUT", "/a");
  EXPECT_EQ(put.handler, nullptr);
  EXPECT_EQ(put.status, 405);
  EXPECT_EQ(put.allow, "GET, HEAD, POST");
  EXPECT_EQ(router.Find("GET", "/b").allow, "POST");
  EXPECT_EQ(router.Find("GET", "/a/").status, 404) << "exact paths only";
  EXPECT_EQ(router.Find("GET", "/c").status, 404);
}

using Params = std::vector<std::pair<std::string, std::string>>;

TEST(HttpRouterTest, PatternsCapturePercentDecodedSegmentsAndExactPathsWin) {
  HttpRouter router;
  router.Handle("GET", "/v1/responses/{response_id}", Text("get"));
  router.Handle("DELETE", "/v1/responses/{response_id}", Text("delete"));
  router.Handle("GET", "/v1/responses/{response_id}/input_items", Text("items"));
  router.Handle("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", Text("del"));
  // Registered after the pattern it overlaps, and still preferred.
  router.Handle("GET", "/v1/responses/stats", Text("stats"));

  const auto get = router.Find("GET", "/v1/responses/resp_1");
  EXPECT_NE(get.handler, nullptr);
  EXPECT_EQ(get.route, "/v1/responses/{response_id}");
  EXPECT_EQ(get.path_params, (Params{{"response_id", "resp_1"}}));
  EXPECT_NE(router.Find("HEAD", "/v1/responses/resp_1").handler, nullptr);
  const auto items = router.Find("GET", "/v1/responses/a%20b+c%2B/input_items");
  EXPECT_EQ(items.route, "/v1/responses/{response_id}/input_items");
  EXPECT_EQ(items.path_params, (Params{{"response_id", "a b+c+"}})) << "'+' is itself in a path";
  const auto del = router.Find("DELETE", "/v1/conversations/conv_1/items/msg_2");
  EXPECT_NE(del.handler, nullptr);
  EXPECT_EQ(del.path_params, (Params{{"conversation_id", "conv_1"}, {"item_id", "msg_2"}}));

  const auto stats = router.Find("GET", "/v1/responses/stats");
  EXPECT_EQ(stats.route, "/v1/responses/stats");
  EXPECT_TRUE(stats.path_params.empty());
  // The exact path has no DELETE; the pattern that has one serves it.
  const auto delete_stats = router.Find("DELETE", "/v1/responses/stats");
  EXPECT_EQ(delete_stats.route, "/v1/responses/{response_id}");
  EXPECT_EQ(delete_stats.path_params, (Params{{"response_id", "stats"}}));

  const auto post = router.Find("POST", "/v1/responses/resp_1");
  EXPECT_EQ(post.handler, nullptr);
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.allow, "DELETE, GET, HEAD");
  EXPECT_EQ(post.route, "/v1/responses/{response_id}");
  EXPECT_EQ(router.Find("PUT", "/v1/conversations/c/items/i").allow, "DELETE");

  for (const char* path : {"/v1/responses", "/v1/responses/r/input_items/x", "/v1/responses/",
                           "/v1/responses//input_items", "/v1/conversations/c/items/",
                           "/v1/responses/%zz", "/v1/responses/a%2", "/v1/responses/a%2Fb",
                           "/v1/responses/a%2fb", "/v1/responses/a%00b", "v1/responses/r"}) {
    const auto m = router.Find("GET", path);
    EXPECT_EQ(m.status, 404) << path;
    EXPECT_EQ(m.handler, nullptr) << path;
    EXPECT_EQ(m.route, "") << path;
  }
}

TEST(HttpRouterTest, OfOverlappingPatternsTheLeftmostLiteralWins) {
  HttpRouter router;
  router.Handle("GET", "/v1/{kind}/{id}/content", Text("any"));
  router.Handle("GET", "/v1/{kind}/latest/content", Text("latest"));
  router.Handle("GET", "/v1/files/{id}/content", Text("file"));
  EXPECT_EQ(router.Find("GET", "/v1/files/latest/content").route, "/v1/files/{id}/content");
  EXPECT_EQ(router.Find("GET", "/v1/blobs/latest/content").route, "/v1/{kind}/latest/content");
  const auto any = router.Find("GET", "/v1/blobs/b1/content");
  EXPECT_EQ(any.route, "/v1/{kind}/{id}/content");
  EXPECT_EQ(any.path_params, (Params{{"kind", "blobs"}, {"id", "b1"}}));
}

TEST(HttpRouterTest, AMalformedPatternAbortsNamingTheRoute) {
  EXPECT_DEATH(HttpRouter().Handle("GET", "/v1/x{id}", Text("")),
               "HTTP route GET /v1/x\\{id\\}: segment");
  EXPECT_DEATH(HttpRouter().Handle("GET", "/v1/{id}/{id}", Text("")), "used twice");
}

TEST(HttpServerTest, RoutesAndFillsTheRequestAndKeepsTheConnectionAlive) {
  HttpRouter router;
  std::shared_ptr<HttpRequest> seen = std::make_shared<HttpRequest>();
  router.Handle("POST", "/echo", [seen](std::shared_ptr<HttpExchange> e) {
    *seen = e->request();
    e->Respond(MakeResponse(201, e->request().body, "text/plain"));
  });
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  SendAll(fd,
          "POST /echo?x=1&y=2 HTTP/1.1\r\nHost: h\r\nX-Request-Id: abc-123\r\nAuthorization: "
          "Bearer tok123\r\nContent-Length: 5\r\n\r\nhello");
  std::string first = ReadUntil(fd, "hello");
  EXPECT_TRUE(StartsWith(first, "HTTP/1.1 201 Created\r\n")) << first;
  EXPECT_NE(first.find("x-request-id: abc-123\r\n"), std::string::npos) << first;
  EXPECT_EQ(seen->method, "POST");
  EXPECT_EQ(seen->path, "/echo");
  EXPECT_EQ(seen->query, "x=1&y=2");
  EXPECT_EQ(seen->Header("host"), "h");
  EXPECT_EQ(seen->bearer_token, "tok123");
  EXPECT_EQ(seen->request_id, "abc-123");
  EXPECT_EQ(seen->route, "/echo");
  EXPECT_TRUE(StartsWith(seen->peer, "127.0.0.1:"));
  // The same connection serves the next request; an invalid request id is replaced.
  SendAll(fd, "POST /echo HTTP/1.1\r\nX-Request-Id: bad id\r\nContent-Length: 2\r\n\r\nok");
  std::string second = ReadUntil(fd, "\r\n\r\nok");
  EXPECT_TRUE(StartsWith(second, "HTTP/1.1 201")) << second;
  EXPECT_NE(seen->request_id, "bad id");
  EXPECT_EQ(seen->request_id.size(), 16u);
  EXPECT_NE(second.find(absl::StrCat("x-request-id: ", seen->request_id)), std::string::npos);
  close(fd);
}

using RouteStatuses = std::vector<std::pair<std::string, int>>;

// The route and status of each finished request, as the metrics observer sees them.
class RouteRecorder : public HttpObserver {
 public:
  void OnRequestStarted(const HttpRequest&) override {}
  void OnRequestFinished(const HttpRequest& request, int status, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    finished_.emplace_back(request.route, status);
  }
  // Those finished, once there are `n` (or after 10 s).
  RouteStatuses Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    return finished_;
  }

 private:
  absl::Mutex mu_;
  RouteStatuses finished_ ABSL_GUARDED_BY(mu_);
};

TEST(HttpServerTest, APatternRouteHandlerSeesItsParamsAndItsRouteLabelIsThePattern) {
  HttpRouter router;
  std::shared_ptr<HttpRequest> seen = std::make_shared<HttpRequest>();
  router.Handle("GET", "/items/{id}", [seen](std::shared_ptr<HttpExchange> e) {
    *seen = e->request();
    e->Respond(MakeResponse(200, std::string(e->request().PathParam("id")), "text/plain"));
  });
  RouteRecorder recorder;
  HttpServerOptions o = TestOptions();
  o.observer = &recorder;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const std::string ok = Exchange(server->port(), "GET /items/item%201?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(ok, "HTTP/1.1 200")) << ok;
  EXPECT_EQ(ok.substr(ok.find("\r\n\r\n") + 4), "item 1");
  EXPECT_EQ(seen->path, "/items/item%201") << "the path as sent";
  EXPECT_EQ(seen->route, "/items/{id}");
  EXPECT_EQ(seen->PathParam("id"), "item 1");
  EXPECT_EQ(seen->PathParam("other"), "");
  EXPECT_EQ(seen->path_params, (Params{{"id", "item 1"}}));
  const std::string slash = Exchange(server->port(), "GET /items/a%2Fb HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(slash, "HTTP/1.1 404")) << slash;
  const std::string wrong = Exchange(server->port(), "POST /items/x HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(wrong, "HTTP/1.1 405")) << wrong;
  EXPECT_NE(wrong.find("Allow: GET, HEAD\r\n"), std::string::npos) << wrong;
  EXPECT_EQ(recorder.Await(3),
            (RouteStatuses{{"/items/{id}", 200}, {"", 404}, {"/items/{id}", 405}}));
}

TEST(HttpQueryTest, ParsesPairsInOrderDecodingPercentAndPlus) {
  const auto q = ParseQuery("limit=20&order=asc&after=msg%5Fx&q=a+b%2Bc&&flag&empty=&=v&k=1=2");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, (Params{{"limit", "20"},
                        {"order", "asc"},
                        {"after", "msg_x"},
                        {"q", "a b+c"},
                        {"flag", ""},
                        {"empty", ""},
                        {"", "v"},
                        {"k", "1=2"}}));
  EXPECT_EQ(QueryValue(*q, "after"), "msg_x");
  EXPECT_EQ(QueryValue(*q, "flag"), "");
  EXPECT_EQ(QueryValue(*q, "missing"), std::nullopt);
  EXPECT_EQ(QueryValue(*ParseQuery("a=1&a=2"), "a"), "2") << "the last value wins";
  EXPECT_TRUE(ParseQuery("")->empty());
  EXPECT_TRUE(ParseQuery("&&")->empty());
  EXPECT_EQ(*ParseQuery("k%3D=v%26"), (Params{{"k=", "v&"}}));
  EXPECT_EQ(PercentDecode("a+b%41"), "a+bA");
  EXPECT_EQ(PercentDecode("a+b", /*plus_is_space=*/true), "a b");
  EXPECT_EQ(PercentDecode("%4"), std::nullopt);
  EXPECT_EQ(PercentDecode("%g0"), std::nullopt);
}

TEST(HttpQueryTest, RefusesBadEscapesNamingThePieceAndMoreThan64Pairs) {
  const auto bad = ParseQuery("limit=20&after=%zz%0A\"x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "query parameter \"after=%zz%0A\\\"x\": invalid percent-encoding (expected '%' and two "
            "hex digits)");
  EXPECT_EQ(ParseQuery("a%2").status().code(), absl::StatusCode::kInvalidArgument);
  const auto long_piece = ParseQuery(absl::StrCat("k=", std::string(1000, 'v'), "%"));
  EXPECT_EQ(long_piece.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(long_piece.status().message().size(), 200u) << long_piece.status();

  std::string query;
  for (int i = 0; i < 64; ++i) absl::StrAppend(&query, i == 0 ? "" : "&", "k", i, "=", i);
  const auto at_limit = ParseQuery(query);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->size(), 64u);
  EXPECT_EQ(QueryValue(*at_limit, "k63"), "63");
  EXPECT_TRUE(ParseQuery(absl::StrCat(query, "&&")).ok()) << "empty pieces are not pairs";
  const auto over = ParseQuery(absl::StrCat(query, "&k64=64"));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(), "query has 65 parameters; at most 64 are accepted");
}

TEST(HttpServerTest, AnswersUnknownPathsAndMethodsAndMalformedRequests) {
  HttpRouter router;
  router.Handle("GET", "/x", Text("x"));
  HttpServerOptions o = TestOptions();
  o.error_response = [](int status, std::string_view message) {
    return ErrorResponse(status, message);
  };
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const std::string not_found = Exchange(server->port(), "GET /y HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(not_found, "HTTP/1.1 404 Not Found\r\n")) << not_found;
  const auto body = nlohmann::json::parse(not_found.substr(not_found.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["error"]["type"], "not_found_error");
  EXPECT_EQ(body["error"]["message"], "no route for \"/y\"");
  // The client's path comes back quoted and short, however long it was.
  const std::string long_path =
      Exchange(server->port(), absl::StrCat("GET /", std::string(8000, 'p'), " HTTP/1.0\r\n\r\n"));
  const auto long_body = nlohmann::json::parse(long_path.substr(long_path.find("\r\n\r\n") + 4));
  EXPECT_EQ(long_body["error"]["message"],
            absl::StrCat("no route for \"/", std::string(63, 'p'), "...\" (8001 bytes)"));
  const std::string wrong = Exchange(server->port(), "DELETE /x HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(wrong, "HTTP/1.1 405 Method Not Allowed\r\n")) << wrong;
  EXPECT_NE(wrong.find("Allow: GET, HEAD\r\n"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find(R"("/x\" takes GET, HEAD, got \"DELETE\")"), std::string::npos) << wrong;
  const std::string head = Exchange(server->port(), "HEAD /x HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_NE(head.find("Content-Length: 1\r\n"), std::string::npos);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "HEAD has no body";
  EXPECT_TRUE(StartsWith(Exchange(server->port(), "nonsense\r\n\r\n"), "HTTP/1.1 400"));
}

TEST(HttpServerTest, AnUnansweredExchangeAnswers500) {
  HttpRouter router;
  router.Handle("GET", "/drop", [](std::shared_ptr<HttpExchange>) {});
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(StartsWith(Exchange(server->port(), "GET /drop HTTP/1.0\r\n\r\n"), "HTTP/1.1 500"));
}

TEST(HttpServerTest, AuthenticatesEveryRouteButPublicOnesBeforeSayingWhatExists) {
  HttpRouter router;
  std::shared_ptr<std::string> caller = std::make_shared<std::string>();
  router.Handle("GET", "/private", [caller](std::shared_ptr<HttpExchange> e) {
    *caller = e->request().caller;
    e->Respond({});
  });
  router.Handle("GET", "/health", Text("ok"), {.is_public = true});
  router.SetAuthenticator([](const HttpRequest& r) -> absl::StatusOr<std::string> {
    if (r.bearer_token == "good") return std::string("alice");
    return absl::UnauthenticatedError("missing or unknown API key");
  });
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string no_key = Exchange(port, "GET /private HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(StartsWith(no_key, "HTTP/1.1 401")) << no_key;
  EXPECT_NE(no_key.find("WWW-Authenticate: Bearer"), std::string::npos);
  EXPECT_TRUE(StartsWith(Exchange(port, "GET /nowhere HTTP/1.0\r\n\r\n"), "HTTP/1.1 401"));
  EXPECT_TRUE(StartsWith(Exchange(port, "GET /health HTTP/1.0\r\n\r\n"), "HTTP/1.1 200"));
  EXPECT_TRUE(
      StartsWith(Exchange(port, "GET /private HTTP/1.0\r\nAuthorization: Bearer good\r\n\r\n"),
                 "HTTP/1.1 200"));
  EXPECT_EQ(*caller, "alice");
  EXPECT_TRUE(
      StartsWith(Exchange(port, "GET /nowhere HTTP/1.0\r\nAuthorization: Bearer good\r\n\r\n"),
                 "HTTP/1.1 404"));
}

TEST(HttpServerTest, RefusesOversizedHeadersWith431AndBodiesWith413) {
  HttpRouter router;
  router.Handle("POST", "/p", Text("fine"));
  HttpServerOptions o = TestOptions();
  o.max_header_bytes = 4096;
  o.max_body_bytes = 1000;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string big_header = Exchange(
      port, absl::StrCat("POST /p HTTP/1.1\r\nX-Big: ", std::string(5000, 'a'), "\r\n\r\n"));
  EXPECT_TRUE(StartsWith(big_header, "HTTP/1.1 431 Request Header Fields Too Large\r\n"))
      << big_header;
  // Declared too long: refused from the header, before any of the body is read.
  const std::string declared = Exchange(port, "POST /p HTTP/1.1\r\nContent-Length: 1001\r\n\r\n");
  EXPECT_TRUE(StartsWith(declared, "HTTP/1.1 413")) << declared;
  // Chunked, found too long as it arrives.
  const std::string chunked =
      Exchange(port, absl::StrCat("POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n",
                                  std::string(1000, 'b'), "\r\n1\r\nc\r\n0\r\n\r\n"));
  EXPECT_TRUE(StartsWith(chunked, "HTTP/1.1 413")) << chunked;
  const std::string fits = Exchange(
      port,
      absl::StrCat("POST /p HTTP/1.0\r\nContent-Length: 1000\r\n\r\n", std::string(1000, 'b')));
  EXPECT_TRUE(StartsWith(fits, "HTTP/1.1 200")) << fits;
}

// A slowloris client (a byte at a time, never ending its header) is reset at the header deadline
// however steadily it trickles, and one with a slow body at the body deadline; meanwhile others
// are served at once.
TEST(HttpServerTest, ClosesSlowHeadersAndBodiesAtTheirDeadlinesWhileServingOthers) {
  HttpRouter router;
  router.Handle("POST", "/p", Text("fine"));
  router.Handle("GET", "/g", Text("fine"));
  HttpServerOptions o = TestOptions();
  o.read_header_timeout_ms = 500;
  o.read_body_timeout_ms = 500;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const int header = Connect(port);
  const int body = Connect(port);
  SendAll(body, "POST /p HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  std::atomic<bool> stop = false;
  std::thread trickle([&] {
    const std::string h = "GET /g HTTP/1.1\r\nX-Slow: ";
    for (size_t i = 0; !stop; ++i) {
      const char c = i < h.size() ? h[i] : 'a';
      send(header, &c, 1, MSG_NOSIGNAL);
      send(body, "b", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  const auto start = SteadyClock::now();
  EXPECT_TRUE(StartsWith(Exchange(port, "GET /g HTTP/1.0\r\n\r\n"), "HTTP/1.1 200"));
  EXPECT_LT(SteadyClock::now() - start, milliseconds(400));
  const auto header_lasted = TimeUntilClosed(header, std::chrono::seconds(5));
  stop = true;
  trickle.join();
  const auto body_lasted = TimeUntilClosed(body, std::chrono::seconds(5));
  EXPECT_GE(header_lasted, milliseconds(400));
  EXPECT_LT(header_lasted, milliseconds(3000));
  EXPECT_LT(body_lasted, milliseconds(3000));
  close(header);
  close(body);
}

TEST(HttpServerTest, ClosesAKeptAliveConnectionIdleForTooLong) {
  HttpRouter router;
  router.Handle("GET", "/g", Text("fine"));
  HttpServerOptions o = TestOptions();
  o.idle_timeout_ms = 300;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  SendAll(fd, "GET /g HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(StartsWith(ReadUntil(fd, "fine"), "HTTP/1.1 200"));
  const auto lasted = TimeUntilClosed(fd, std::chrono::seconds(5));
  EXPECT_GE(lasted, milliseconds(250));
  EXPECT_LT(lasted, milliseconds(2000));
  close(fd);
}

// A handler on another thread streams events; chunked on the wire, ended by the last chunk.
TEST(HttpServerTest, StreamsServerSentEventsFromAnotherThread) {
  HttpRouter router;
  std::vector<std::thread> workers;
  absl::Mutex mu;
  router.Handle("GET", "/events", [&](std::shared_ptr<HttpExchange> e) {
    absl::MutexLock lock(&mu);
    workers.emplace_back([e] {
      e->StartStream();
      for (int i = 0; i < 3; ++i) e->Write(absl::StrCat("data: ", i, "\n\n"));
      e->Finish();
    });
  });
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  SendAll(fd, "GET /events HTTP/1.1\r\n\r\n");
  const std::string got = ReadUntil(fd, "\r\n0\r\n\r\n");
  close(fd);
  {
    absl::MutexLock lock(&mu);
    for (auto& t : workers) t.join();
  }
  EXPECT_TRUE(StartsWith(got, "HTTP/1.1 200 OK\r\n")) << got;
  EXPECT_NE(got.find("Content-Type: text/event-stream\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("data: 0\n\n"), std::string::npos) << got;
  EXPECT_NE(got.find("data: 2\n\n"), std::string::npos) << got;
  EXPECT_EQ(got.substr(got.size() - 5), "0\r\n\r\n") << got;
}

// A writer that respects HasRoom()/OnWritable() holds at most about stream_buffer_bytes while its
// client does not read, resumes when it does, and is cancelled when it disconnects.
TEST(HttpServerTest, StreamBackpressureBoundsTheBufferAndCancelsOnDisconnect) {
  constexpr size_t kBuffer = 64 << 10;
  constexpr size_t kChunk = 4 << 10;
  struct Writer {
    std::shared_ptr<HttpExchange> exchange;
    std::atomic<size_t> max_buffered{0};
    std::atomic<int64_t> written{0};
    std::atomic<bool> paused{false};
    absl::Notification cancelled;
    // Works on its own reference to the exchange: a disconnect runs the pending OnWritable
    // callback on the server's thread after OnCancel, while the test's thread may already be
    // resetting `exchange`.
    void Pump(const std::shared_ptr<HttpExchange>& e) {
      while (!e->cancelled()) {
        if (!e->HasRoom()) {
          paused = true;
          e->OnWritable([this, e] { Pump(e); });
          return;
        }
        e->Write(std::string(kChunk, 'x'));
        written += kChunk;
        max_buffered = std::max(max_buffered.load(), e->buffered_bytes());
      }
    }
  };
  Writer writer;
  HttpRouter router;
  router.Handle("GET", "/events", [&](std::shared_ptr<HttpExchange> e) {
    writer.exchange = e;
    e->OnCancel([&] { writer.cancelled.Notify(); });
    e->StartStream();
    writer.Pump(e);
  });
  HttpServerOptions o = TestOptions();
  o.stream_buffer_bytes = kBuffer;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port(), /*receive_buffer=*/4096);
  SendAll(fd, "GET /events HTTP/1.1\r\n\r\n");
  std::this_thread::sleep_for(milliseconds(500));  // the client reads nothing
  EXPECT_TRUE(writer.paused.load());
  EXPECT_LE(writer.max_buffered.load(), kBuffer + kChunk);
  // Written at most: the buffer, the kernel's socket buffers, and a chunk.
  const int64_t stalled_at = writer.written.load();
  EXPECT_LT(stalled_at, int64_t{16} << 20);
  // Reading lets it go on (once the kernel's buffers, megabytes on loopback, have room again).
  char buf[65536];
  const auto start = SteadyClock::now();
  while (writer.written.load() <= stalled_at &&
         SteadyClock::now() - start < std::chrono::seconds(5))
    ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  EXPECT_GT(writer.written.load(), stalled_at);
  EXPECT_LE(writer.max_buffered.load(), kBuffer + kChunk);
  EXPECT_FALSE(writer.cancelled.HasBeenNotified());
  close(fd);
  EXPECT_TRUE(writer.cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(writer.exchange->cancelled());
  EXPECT_FALSE(writer.exchange->Write("late")) << "writes after cancellation are refused";
  writer.exchange.reset();
}

// A client that stops reading a stream is cut off after write_timeout_ms and the stream cancelled.
TEST(HttpServerTest, CancelsAStreamWhoseClientStopsReading) {
  absl::Notification cancelled;
  std::shared_ptr<HttpExchange> kept;
  std::thread writer;
  HttpRouter router;
  router.Handle("GET", "/events", [&](std::shared_ptr<HttpExchange> e) {
    kept = e;
    e->OnCancel([&] { cancelled.Notify(); });
    e->StartStream();
    writer = std::thread([e] {
      // Ignores backpressure: only the write deadline stops it.
      while (!e->cancelled()) {
        e->Write(std::string(64 << 10, 'x'));
        std::this_thread::sleep_for(milliseconds(5));
      }
    });
  });
  HttpServerOptions o = TestOptions();
  o.write_timeout_ms = 300;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port(), 4096);
  SendAll(fd, "GET /events HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  writer.join();
  close(fd);
  kept.reset();
}

// Drain: no new connections, the stream in flight goes on to its end, then the server stops; a
// stream past the drain deadline is cut.
TEST(HttpServerTest, DrainLetsStreamsInFlightFinishUpToTheDeadline) {
  std::shared_ptr<HttpExchange> stream;
  absl::Notification started;
  HttpRouter router;
  router.Handle("GET", "/events", [&](std::shared_ptr<HttpExchange> e) {
    stream = e;
    e->StartStream();
    e->Write("data: first\n\n");
    started.Notify();
  });
  router.Handle("GET", "/g", Text("fine"));
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const int idle = Connect(port);  // kept alive, between requests
  SendAll(idle, "GET /g HTTP/1.1\r\n\r\n");
  ReadUntil(idle, "fine");
  const int fd = Connect(port);
  SendAll(fd, "GET /events HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_NE(ReadUntil(fd, "first").find("data: first"), std::string::npos);
  server->StartDrain();
  EXPECT_LT(TimeUntilClosed(idle, std::chrono::seconds(2)), std::chrono::seconds(1))
      << "an idle connection closes at once";
  std::thread finisher([&] {
    std::this_thread::sleep_for(milliseconds(300));
    stream->Write("data: last\n\n");
    stream->Finish();
  });
  const auto start = SteadyClock::now();
  server->Drain(absl::Seconds(5));
  const auto took = SteadyClock::now() - start;
  finisher.join();
  EXPECT_GE(took, milliseconds(250)) << "the drain waited for the stream";
  EXPECT_LT(took, std::chrono::seconds(3));
  const std::string rest = ReadAll(fd);
  EXPECT_NE(rest.find("data: last"), std::string::npos) << rest;
  EXPECT_NE(rest.find("0\r\n\r\n"), std::string::npos) << rest;
  close(fd);
  close(idle);
  stream.reset();
  // Refused now.
  const int late = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(connect(late, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(late);
}

TEST(HttpServerTest, DrainCutsAStreamStillOpenAtTheDeadline) {
  std::shared_ptr<HttpExchange> stream;
  absl::Notification cancelled;
  HttpRouter router;
  router.Handle("GET", "/events", [&](std::shared_ptr<HttpExchange> e) {
    stream = e;
    e->OnCancel([&] { cancelled.Notify(); });
    e->StartStream();
  });
  auto server = StartOrDie(TestOptions(), std::move(router));
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  SendAll(fd, "GET /events HTTP/1.1\r\n\r\n");
  ReadUntil(fd, "\r\n\r\n");
  const auto start = SteadyClock::now();
  server->Drain(absl::Milliseconds(300));
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(cancelled.HasBeenNotified());
  EXPECT_FALSE(stream->Write("data: late\n\n"));
  close(fd);
  stream.reset();
}

TEST(HttpServerTest, RefusesANewcomerWhenEveryConnectionIsBusyAtTheCap) {
  std::vector<std::shared_ptr<HttpExchange>> held;
  absl::Mutex mu;
  HttpRouter router;
  router.Handle("GET", "/hold", [&](std::shared_ptr<HttpExchange> e) {
    absl::MutexLock lock(&mu);
    held.push_back(e);
  });
  HttpServerOptions o = TestOptions();
  o.max_connections = 2;
  auto server = StartOrDie(o, std::move(router));
  ASSERT_NE(server, nullptr);
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    fds.push_back(Connect(server->port()));
    SendAll(fds.back(), "GET /hold HTTP/1.1\r\n\r\n");
  }
  for (int i = 0; i < 100 && server->requests_in_flight() < 2; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  const int third = Connect(server->port());
  EXPECT_LT(TimeUntilClosed(third, std::chrono::seconds(3)), std::chrono::seconds(1));
  close(third);
  {
    absl::MutexLock lock(&mu);
    for (auto& e : held) e->Respond({});
  }
  for (int fd : fds) {
    EXPECT_TRUE(StartsWith(ReadUntil(fd, "\r\n\r\n"), "HTTP/1.1 200"));
    close(fd);
  }
  absl::MutexLock lock(&mu);
  held.clear();
}

TEST(HttpServerTest, OptionsOutOfRangeAndUnbindablePortsAreRefused) {
  HttpServerOptions o = TestOptions();
  o.max_connections = 0;
  EXPECT_EQ(HttpServer::Start(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = TestOptions();
  o.tls_cert_file = "/nonexistent.pem";
  EXPECT_FALSE(HttpServer::Start(o, {}).ok()) << "a certificate without its key";
  auto first = StartOrDie(TestOptions(), {});
  ASSERT_NE(first, nullptr);
  o = TestOptions();
  o.port = first->port();
  EXPECT_EQ(HttpServer::Start(o, {}).status().code(), absl::StatusCode::kUnavailable);
}

TEST(HttpErrorsTest, MapsStatusesToHttpAndOpenAiShapeWithRetryAfter) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);

  const HttpResponse bad =
      ErrorResponse(absl::InvalidArgumentError("max_tokens: expected > 0"), "max_tokens");
  EXPECT_EQ(bad.status, 400);
  const auto j = nlohmann::json::parse(bad.body);
  EXPECT_EQ(j["error"]["message"], "max_tokens: expected > 0");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(j["error"]["code"], "invalid_argument");
  EXPECT_TRUE(bad.headers.empty());

  const HttpResponse busy = ErrorResponse(absl::ResourceExhaustedError(
      "model digits: classification queue is full: 64 requests waiting (max_queue_size 64); "
      "retry after about 1500 ms"));
  EXPECT_EQ(busy.status, 429);
  ASSERT_EQ(busy.headers.size(), 1u);
  EXPECT_EQ(busy.headers[0], (std::pair<std::string, std::string>("Retry-After", "2")));
  EXPECT_EQ(RetryAfterSeconds(absl::ResourceExhaustedError("retry after a short backoff")), 1);
  EXPECT_EQ(RetryAfterSeconds(absl::ResourceExhaustedError("out of sessions")), std::nullopt);
  EXPECT_TRUE(ErrorResponse(absl::ResourceExhaustedError("out of sessions")).headers.empty());
  const auto none = nlohmann::json::parse(ErrorResponse(404, "no route for /x").body);
  EXPECT_TRUE(none["error"]["param"].is_null());
  EXPECT_TRUE(none["error"]["code"].is_null());
}

}  // namespace
}  // namespace tost::http
