// An asynchronous HTTP/1.1 server (Boost.Beast over Asio) for the server's HTTP front end and its
// /metrics endpoint. Neither gRPC nor LibTorch: routes and their handlers come from the caller.
//
// Threads: an io_context run by `threads` threads that the HttpServer owns and joins; each
// connection runs on its own strand. Handlers are called on that strand and must not block for
// long (hand work to another thread and answer from there: HttpExchange is thread-safe).
//
// What a client cannot do (each is an option below): hold a connection by sending its header or
// body slowly (one deadline for the whole header, another for the whole body, however steadily it
// trickles), hold a connection idle between requests, read a response slowly (a deadline for the
// whole response, or for each write of a stream), send an oversized header (431) or body (413), or
// open more than max_connections (at the cap an idle or still-reading connection is dropped, the
// oldest first, else the new one is refused). Given up on, a connection is reset, so the kernel
// does not keep its buffers; answered and closing, it is shut down for writing and its input
// discarded for a moment, so an error answer is not destroyed by a reset before the client reads
// it.
//
// A stream (Server-Sent Events) is chunked: StartStream() sends the header, Write() queues chunks
// without blocking, and the writer keeps its buffer bounded with HasRoom()/OnWritable(); a client
// that stops reading is cut off after write_timeout_ms, and one that disconnects cancels the
// exchange (OnCancel) so the work behind it can stop.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tost::http {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // as sent: "GET", "POST", ...
  std::string path;     // the target up to '?', as sent (percent-encoding kept)
  std::string query;    // after the '?', without it; empty if none
  HttpHeaders headers;  // names lower-cased, in the order sent
  std::string body;
  // The client's x-request-id when valid (service/observability/logging.h: IsValidRequestId),
  // else, with a valid W3C traceparent header, "<trace_id>-<span_id>", else a new one; echoed in
  // the response's x-request-id (service/observability/trace_context.h).
  std::string request_id;
  // From a valid traceparent header: its trace id, and this server's span id for the request
  // (both in the access log line); empty without one.
  std::string trace_id;
  std::string span_id;
  std::string peer;  // "ADDRESS:PORT" of the client
  // Identity material for authentication: the token of `Authorization: Bearer <token>` (empty if
  // none), and with TLS the client certificate's subject (one line, "/CN=alice") and identity as
  // gRPC reports it (its first DNS subject alternative name, else its common name); empty without
  // a client certificate.
  std::string bearer_token;
  std::string tls_client_subject;
  std::string tls_client_identity;
  // Set by the router: the route's path as registered, a pattern's `{name}` segments kept ("" when
  // no route matched; a bounded metrics label, whatever ids the path carries), the values the
  // pattern captured (name and percent-decoded segment, in path order), and the caller's identity
  // from the router's authenticator ("" for public routes or without one).
  std::string route;
  std::vector<std::pair<std::string, std::string>> path_params;
  std::string caller;

  // The first value of header `lower_name` (lower case), "" if absent.
  std::string_view Header(std::string_view lower_name) const;
  // The value captured by the route's `{name}` segment, "" if the route has none.
  std::string_view PathParam(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;  // besides Content-Type, Content-Length, Connection and x-request-id
  std::string body;
};

// A whole response of `body` as `content_type`.
HttpResponse MakeResponse(int status, std::string body,
                          std::string content_type = "application/json");

namespace internal {
class ConnectionBase;
}

// One request and its answer: either Respond() once, or StartStream(), Write()... and Finish().
// Every method may be called from any thread; what touches the socket runs on the connection's
// strand. An exchange dropped unanswered answers 500 (a stream dropped unfinished is finished).
class HttpExchange {
 public:
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }

  // The whole response. False (and nothing sent) if already answered or streaming.
  bool Respond(HttpResponse response);
  // Sends the status and headers of a chunked response; Content-Type defaults to
  // text/event-stream (with Cache-Control: no-cache). False if already answered.
  bool StartStream(int status = 200, HttpHeaders headers = {},
                   std::string content_type = "text/event-stream");
  // Queues one chunk (an SSE event: "data: ...\n\n"). Never blocks; false (chunk dropped) once
  // finished or cancelled, or before StartStream.
  bool Write(std::string chunk);
  // Bytes queued by Write() and not yet taken by the kernel.
  size_t buffered_bytes() const { return buffered_bytes_.load(std::memory_order_acquire); }
  // Whether buffered_bytes() is below the server's stream_buffer_bytes: a writer that finds no
  // room should pause and wait for OnWritable.
  bool HasRoom() const;
  // `callback` runs once, on the connection's strand: at once (posted) if there is room, else
  // when the buffer has drained to half of stream_buffer_bytes, or when the exchange is
  // cancelled (so a paused writer always wakes; check cancelled()).
  void OnWritable(std::function<void()> callback);
  // Ends the stream (the last chunk) after the queued ones.
  void Finish();
  // Resets the connection, dropping whatever is queued for it, and cancels the exchange: for a
  // writer that gives up on a client that stopped reading.
  void Abort();

  // Adds `key`=`value` to this request's access-log line (escaped as every logged string is; the
  // caller bounds `value`, since a line holds it whole in JSON). Call it before the answer: the
  // line is written once the answer is, and a field added later is dropped.
  void AddLogField(std::string key, std::string value);

  // True once the client disconnected, a write failed or timed out, or the server stopped.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // `callback` runs once when the exchange is cancelled (on the strand; posted at once if it
  // already is). Not run for an exchange that ends normally.
  void OnCancel(std::function<void()> callback);

 private:
  friend class internal::ConnectionBase;
  HttpExchange(std::shared_ptr<internal::ConnectionBase> connection, HttpRequest request,
               size_t stream_buffer_bytes);
  // On the strand: the connection's side.
  void Cancel();
  void Drained(size_t bytes);

  const std::shared_ptr<internal::ConnectionBase> connection_;
  const HttpRequest request_;
  const size_t stream_buffer_bytes_;
  std::atomic<size_t> buffered_bytes_{0};
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  enum class State { kNew, kAnswered, kStreaming, kFinished };
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  std::vector<std::function<void()>> on_cancel_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> on_writable_ ABSL_GUARDED_BY(mu_);
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct RouteOptions {
  // Served without the router's authenticator (health probes carry no key).
  bool is_public = false;
};

// Routes by method and path. A route's path is compared segment by segment (between '/'s): a
// literal segment must equal the request's as sent (percent-encoding kept), and a whole segment
// `{name}` matches any one non-empty segment, captured percent-decoded into the request's
// path_params; a segment whose decoding is invalid or holds '/' or NUL matches no `{name}`.
// Segment counts must be equal. Of the routes that match a request's path and method, the most
// specific wins: at the first segment where two differ, a literal beats a `{name}` (so an exact
// path beats any pattern); equals go by registration order. HEAD is served by a path's GET handler
// (the body is not sent). A path that some route matches but none for the method: 405, with Allow
// listing the methods of every route that matches it; no route: 404. Fixed once the server starts
// (HttpServer::Start takes it by value).
class HttpRouter {
 public:
  // `path` starts with '/'. A '{' or '}' anywhere but around a whole segment's name, or a name
  // used twice in one path, is a programming error: the process aborts, saying which route.
  void Handle(std::string method, std::string path, HttpHandler handler, RouteOptions options = {});
  // Called before every non-public route's handler, and before the 404/405 of an unknown route (so
  // an unauthenticated client learns nothing of what exists): an error (UNAUTHENTICATED: 401,
  // PERMISSION_DENIED: 403) is answered with it; a value is the request's `caller`.
  void SetAuthenticator(std::function<absl::StatusOr<std::string>(const HttpRequest&)> auth);

  struct Match {
    const HttpHandler* handler = nullptr;  // null: answer `status`
    int status = 200;                      // 404 or 405 without a handler
    std::string allow;                     // for 405: "GET, HEAD", ...
    std::string route;                     // the route's path (a pattern), when one matches
    std::vector<std::pair<std::string, std::string>> path_params;  // with a handler
    bool is_public = false;
  };
  Match Find(std::string_view method, std::string_view path) const;
  const std::function<absl::StatusOr<std::string>(const HttpRequest&)>& authenticator() const {
    return authenticator_;
  }

 private:
  struct Route {
    std::string method;
    std::string path;
    HttpHandler handler;
    RouteOptions options;
    // For a pattern, the path's segments after its leading '/', a `{name}` one held as its name
    // with is_param set; both empty for an exact path, which is compared whole.
    std::vector<std::string> segments;
    std::vector<bool> is_param;
  };
  std::vector<Route> routes_;
  std::function<absl::StatusOr<std::string>(const HttpRequest&)> authenticator_;
};

// Request accounting for metrics: started when the request is complete and routed, finished when
// its answer has been written (or failed). Called on the connection's strand; must not block.
class HttpObserver {
 public:
  virtual ~HttpObserver() = default;
  virtual void OnRequestStarted(const HttpRequest& request) = 0;
  // `status` is what was sent; 499 when the client went away before the answer was written.
  virtual void OnRequestFinished(const HttpRequest& request, int status,
                                 absl::Duration elapsed) = 0;
};

struct HttpServerOptions {
  std::string address = "0.0.0.0";
  int port = 8501;            // 0: the kernel picks a free one (HttpServer::port() reports it)
  int threads = 2;            // running the io_context; owned and joined by the server
  std::string name = "http";  // in log lines and error messages ("metrics", ...)
  size_t max_header_bytes = 16 << 10;  // request line and header fields; beyond: 431
  size_t max_body_bytes = 8 << 20;     // beyond: 413 (checked against Content-Length first)
  // From accept (the first request: TLS handshake included) or from its first byte (later ones on
  // a kept-alive connection) to the end of the header: one deadline, however steadily the client
  // trickles. Past it the connection is reset.
  int64_t read_header_timeout_ms = 10'000;
  int64_t read_body_timeout_ms = 60'000;  // from the end of the header to the end of the body
  int64_t idle_timeout_ms = 60'000;       // a kept-alive connection waiting for its next request
  // The whole of a response, or each write of a stream (a client that stops reading is cut off
  // and its exchange cancelled).
  int64_t write_timeout_ms = 30'000;
  int max_connections = 1024;
  bool keep_alive = true;  // false: every response says Connection: close
  // Per stream: HasRoom() is false while this many bytes wait for the kernel.
  size_t stream_buffer_bytes = 256 << 10;
  // TLS, as the gRPC server's --tls_cert_file/--tls_key_file/--tls_client_ca_file: a PEM chain and
  // its key turn TLS on; a client CA requires client certificates it signed (mTLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  bool log_requests = true;  // one access-log line per request (service/observability/logging.h)
  HttpObserver* observer = nullptr;  // not owned; must outlive the server
  // The answers the server gives itself (400, 401, 403, 404, 405, 413, 431, 500): status and a
  // message that says what was expected. Default: the message as text/plain.
  std::function<HttpResponse(int status, std::string_view message)> error_response;
};

// INVALID_ARGUMENT naming the option when one is out of range.
absl::Status ValidateHttpServerOptions(const HttpServerOptions& options);

class HttpServer {
 public:
  // Binds, listens and starts the threads. INVALID_ARGUMENT for bad options, an address that does
  // not resolve or unreadable/invalid TLS files; UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpRouter router);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  int64_t open_connections() const;
  int64_t requests_in_flight() const;

  // Stops accepting and closes idle connections; requests in flight and streams go on, and their
  // responses say Connection: close. Idempotent.
  void StartDrain();
  // StartDrain(), waits until every connection has ended or `timeout` has passed, then Stop().
  void Drain(absl::Duration timeout);
  // Resets every connection (streams are cancelled) and joins the threads. Idempotent; not from a
  // handler.
  void Stop();

  struct Core;  // shared with the connections (service/http/internal/core.h)

 private:
  HttpServer() = default;

  std::shared_ptr<Core> core_;
  int port_ = 0;
  absl::Mutex stop_mu_;  // serializes Stop() callers around the joins
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace tost::http
