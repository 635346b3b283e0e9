// The HTTP endpoint Prometheus scrapes: GET /metrics returns the text exposition format.
//
// Why not prometheus::Exposer (prometheus-cpp-pull): it runs CivetWeb, whose threads are created
// with a fixed small stack; in tost_server the loaded libraries' static TLS (LibTorch, ...) exceeds
// it and pthread_create fails with EINVAL. A scrape endpoint needs one request at a time, so one
// thread with an ordinary stack serves it here.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace tost::service {

class MetricsHttpServer {
 public:
  // Listens on address:port (port 0: a free one) and serves `render()` at GET /metrics (404 for
  // other paths, 405 for other methods), one connection at a time, each closed after its answer.
  // `render` is called on the server's thread. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, int port, std::function<std::string()> render);
  // Stops accepting and joins the thread.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int port, std::function<std::string()> render);
  void Loop();
  void Serve(int fd);

  const int listen_fd_;
  const int port_;
  std::function<std::string()> render_;
  int wake_[2] = {-1, -1};  // a pipe: written once by the destructor to end Loop()
  std::thread thread_;
};

}  // namespace tost::service
