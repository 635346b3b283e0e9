// The HTTP server's shared state, for its own .cc files only (callers use http_server.h):
// HttpServer::Core, what the listener, every connection and the HttpServer hold between them, and
// ConnectionBase, what an HttpExchange and the server need of a connection whatever its stream
// (plain TCP or TLS). Which thread touches what: the acceptor runs on its own strand, a connection
// on its own; Core's map of connections is under its mutex; the flags and counters are atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "service/http/http_server.h"

namespace tost::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Strand = net::strand<net::io_context::executor_type>;
using Clock = std::chrono::steady_clock;

namespace internal {

// Debian's Abseil has its own string_view type.
inline absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace internal

struct HttpServer::Core {
  explicit Core(HttpServerOptions o, HttpRouter r)
      : options(std::move(o)), router(std::move(r)), acceptor(net::make_strand(ioc)) {}

  HttpServerOptions options;
  const HttpRouter router;
  net::io_context ioc;
  std::optional<net::ssl::context> ssl;
  tcp::acceptor acceptor;  // used on its own strand
  std::optional<net::steady_timer> accept_backoff;
  std::atomic<bool> stopped{false};
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int> running_threads{0};

  absl::Mutex mu;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::weak_ptr<internal::ConnectionBase>> connections ABSL_GUARDED_BY(mu);

  // The connections not yet destroyed (closed ones included).
  std::vector<std::shared_ptr<internal::ConnectionBase>> Live() ABSL_LOCKS_EXCLUDED(mu);
  // http_listener.cc: the accept loop, and the connection cap applied to each newcomer.
  void Accept(const std::shared_ptr<Core>& self);
  void OnAccepted(const std::shared_ptr<Core>& self, Strand strand, tcp::socket socket);
  // http_router.cc: an answer of the server's own (options.error_response, or plain text).
  HttpResponse Error(int status, std::string_view message) const;
};

namespace internal {

// What HttpExchange and the server need of a connection, whatever its stream type.
class ConnectionBase : public std::enable_shared_from_this<ConnectionBase> {
 public:
  // Ranks for eviction at the connection cap: the lower, the sooner dropped.
  enum class Phase { kIdle = 0, kReading = 1, kBusy = 2, kClosed = 3 };

  ConnectionBase(std::shared_ptr<HttpServer::Core> core, Strand strand, uint64_t id)
      : core_(std::move(core)), strand_(std::move(strand)), id_(id), accepted_(Clock::now()) {}
  virtual ~ConnectionBase() {
    absl::MutexLock lock(&core_->mu);
    core_->connections.erase(id_);
  }

  Phase phase() const { return phase_.load(std::memory_order_acquire); }
  const Strand& strand() const { return strand_; }
  Clock::time_point accepted() const { return accepted_; }

  // Any thread: runs `fn` on the connection's strand (not at all once the server has stopped: its
  // threads are gone, and the socket with them).
  void Post(std::function<void()> fn) {
    if (core_->stopped.load(std::memory_order_acquire)) return;
    net::post(strand_, [self = shared_from_this(), fn = std::move(fn)] { fn(); });
  }
  // Any thread: reset the connection.
  void Abort() {
    Post([this] { DoAbort(); });
  }
  // Any thread: close it if it is waiting for a request (a drain).
  void CloseIfIdle() {
    Post([this] { DoCloseIfIdle(); });
  }

  // On the strand, from the exchange.
  virtual void DoRespond(HttpResponse response) = 0;
  virtual void DoStartStream(int status, HttpHeaders headers, std::string content_type) = 0;
  virtual void DoWrite(std::string chunk) = 0;
  virtual void DoFinish() = 0;
  virtual void DoAbort() = 0;
  virtual void DoCloseIfIdle() = 0;
  // `from`'s access-log field; dropped unless `from` is the exchange of the request in progress.
  virtual void DoAddLogField(const HttpExchange* from, std::string key, std::string value) = 0;

 protected:
  std::shared_ptr<HttpExchange> MakeExchange(HttpRequest request) {
    return std::shared_ptr<HttpExchange>(new HttpExchange(shared_from_this(), std::move(request),
                                                          core_->options.stream_buffer_bytes));
  }
  static void CancelExchange(HttpExchange& e) { e.Cancel(); }
  static void DrainedExchange(HttpExchange& e, size_t bytes) { e.Drained(bytes); }

  const std::shared_ptr<HttpServer::Core> core_;
  const Strand strand_;
  const uint64_t id_;
  const Clock::time_point accepted_;
  std::atomic<Phase> phase_{Phase::kReading};
};

// http_connection.cc: a connection over `socket` (TLS when core->ssl is set), registered in
// core->connections under `id`; it starts on `strand`.
void StartConnection(const std::shared_ptr<HttpServer::Core>& core, Strand strand,
                     tcp::socket socket, uint64_t id);

// http_listener.cc: resolves options.address and binds and listens on the first of its addresses
// that allows it. INVALID_ARGUMENT when the address does not resolve, UNAVAILABLE when none binds.
absl::Status Listen(HttpServer::Core& core);

}  // namespace internal
}  // namespace tost::http
