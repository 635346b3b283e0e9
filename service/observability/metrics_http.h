// The HTTP endpoint Prometheus scrapes: GET /metrics returns the text exposition format.
//
// Why not prometheus::Exposer (prometheus-cpp-pull): it runs CivetWeb, whose threads are created
// with a fixed small stack; in tost_server the loaded libraries' static TLS (LibTorch, ...) exceeds
// it and pthread_create fails with EINVAL. Nor a thread per connection: any HTTP server that times
// out each read rather than each request lets a few clients trickling a byte at a time hold every
// thread. So one thread with an ordinary stack runs a poll() loop over non-blocking sockets: it
// reads every request incrementally, gives each connection a deadline for its whole request and
// another for its whole response, and caps connections and header size, so no client can keep a
// scrape from being answered.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tost::service {

struct MetricsHttpServerOptions {
  // From accept to the end of the request header (the blank line). A connection that has not sent
  // a complete header by then is closed, however steadily it trickles bytes.
  absl::Duration request_timeout = absl::Seconds(5);
  // From the complete request to the last byte of the response handed to the kernel: a client
  // that reads too slowly is cut off rather than holding its connection.
  absl::Duration response_timeout = absl::Seconds(10);
  // Open connections at most. One more is accepted by closing the one that matters least: an
  // answered one first, else the oldest still sending its request, else the oldest being answered.
  int max_connections = 64;
  // A request header (request line included) longer than this is refused with 431.
  size_t max_header_bytes = 8192;
};

class MetricsHttpServer {
 public:
  // Listens on address:port (port 0: a free one) and serves `render()` at GET (or HEAD) /metrics,
  // 404 for other paths, 405 for other methods, 400 for a malformed request line, 431 for an
  // oversized header; each connection is closed after its answer. `render` is called on the
  // server's thread, once per complete GET /metrics. UNAVAILABLE if the address cannot be bound,
  // INVALID_ARGUMENT if the address does not resolve or the options are out of range.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, int port, std::function<std::string()> render,
      const MetricsHttpServerOptions& options = {});
  // Stop() then close the listening socket.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Stops accepting, closes every open connection and joins the thread; returns as soon as a
  // render in progress (if any) finishes. Idempotent and safe to call from any thread but the
  // server's own (i.e. not from `render`).
  void Stop();

  int port() const { return port_; }

 private:
  struct Connection;

  MetricsHttpServer(int listen_fd, int port, std::function<std::string()> render,
                    const MetricsHttpServerOptions& options);
  void Loop();
  // Accepts what is pending; false when out of descriptors (or kernel memory).
  bool Accept(std::vector<Connection>& connections);
  void OnReadable(Connection& c);
  void OnWritable(Connection& c);
  void Answer(Connection& c);

  const int listen_fd_;
  const int port_;
  std::function<std::string()> render_;
  const MetricsHttpServerOptions options_;
  int wake_[2] = {-1, -1};  // a pipe: written once by Stop() to end Loop()
  std::mutex stop_mu_;      // serializes Stop() callers around the join
  std::thread thread_;
};

}  // namespace tost::service
