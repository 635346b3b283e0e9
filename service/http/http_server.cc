#include "service/http/http_server.h"

#include "absl/strings/str_cat.h"
#include "base/thread_name.h"
#include "service/http/internal/core.h"
#include "service/http/internal/tls.h"
#include "service/observability/logging.h"

namespace tost::http {

using service::Log;
using service::LogLevel;

absl::Status ValidateHttpServerOptions(const HttpServerOptions& o) {
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: port must be in [0, 65535] (0 picks one), got ", o.port));
  }
  if (o.threads < 1 || o.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: threads must be in [1, 256], got ", o.threads));
  }
  if (o.max_connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.name, " server: max_connections must be at least 1, got ", o.max_connections));
  }
  if (o.max_header_bytes < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.name, " server: max_header_bytes must be at least 16, got ", o.max_header_bytes));
  }
  if (o.stream_buffer_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: stream_buffer_bytes must be at least 1, got 0"));
  }
  const std::pair<const char*, int64_t> timeouts[] = {
      {"read_header_timeout_ms", o.read_header_timeout_ms},
      {"read_body_timeout_ms", o.read_body_timeout_ms},
      {"idle_timeout_ms", o.idle_timeout_ms},
      {"write_timeout_ms", o.write_timeout_ms}};
  for (const auto& [name, ms] : timeouts) {
    if (ms < 1 || ms > int64_t{24} * 3600 * 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.name, " server: ", name, " must be in [1, 86400000], got ", ms));
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: tls_cert_file and tls_key_file must be given together, got ",
                     o.tls_cert_file.empty() ? "only tls_key_file" : "only tls_cert_file"));
  }
  if (o.tls_cert_file.empty() && !o.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: tls_client_ca_file needs tls_cert_file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpRouter router) {
  if (absl::Status s = ValidateHttpServerOptions(options); !s.ok()) return s;
  auto core = std::make_shared<Core>(std::move(options), std::move(router));
  const HttpServerOptions& o = core->options;
  if (!o.tls_cert_file.empty()) {
    core->ssl.emplace(net::ssl::context::tls_server);
    if (absl::Status s = internal::ConfigureTls(o, *core->ssl); !s.ok()) return s;
  }
  if (absl::Status s = internal::Listen(*core); !s.ok()) return s;
  boost::system::error_code ec;
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->port_ = core->acceptor.local_endpoint(ec).port();
  server->core_ = core;
  core->Accept(core);
  absl::MutexLock lock(&server->stop_mu_);
  for (int i = 0; i < o.threads; ++i) {
    core->running_threads.fetch_add(1);
    server->threads_.emplace_back([core] {
      NameThisThread(absl::StrCat(core->options.name, "-io"));
      // Handlers do not throw; should one, the loop goes on rather than the process ending.
      for (;;) {
        try {
          core->ioc.run();
          break;
        } catch (const std::exception& e) {
          Log(LogLevel::kError, "an HTTP handler threw", {{"error", e.what()}});
        }
      }
      core->running_threads.fetch_sub(1);
    });
  }
  return server;
}

HttpServer::~HttpServer() { Stop(); }

int64_t HttpServer::open_connections() const {
  int64_t n = 0;
  for (const auto& c : core_->Live()) n += c->phase() != internal::ConnectionBase::Phase::kClosed;
  return n;
}

int64_t HttpServer::requests_in_flight() const { return core_->in_flight.load(); }

void HttpServer::StartDrain() {
  if (core_->draining.exchange(true)) return;
  std::shared_ptr<Core> core = core_;
  net::post(core->acceptor.get_executor(), [core] {
    boost::system::error_code ec;
    core->acceptor.close(ec);
    if (core->accept_backoff) core->accept_backoff->cancel();
  });
  for (const auto& c : core_->Live()) c->CloseIfIdle();
}

void HttpServer::Drain(absl::Duration timeout) {
  StartDrain();
  const absl::Time deadline = absl::Now() + timeout;
  while (open_connections() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  Stop();
}

void HttpServer::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (threads_.empty()) return;
  std::shared_ptr<Core> core = core_;
  net::post(core->acceptor.get_executor(), [core] {
    boost::system::error_code ec;
    core->acceptor.close(ec);
    if (core->accept_backoff) core->accept_backoff->cancel();
  });
  for (const auto& c : core_->Live()) c->Abort();
  // From here no exchange can post more (ConnectionBase::Post). The aborts already posted run on
  // the connections' strands; their operations end, and with no work left the threads return by
  // themselves, so no handler is left queued holding its connection (and the io_context with it).
  // A second at most: then the loop is stopped whatever still runs.
  core_->stopped.store(true, std::memory_order_release);
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  while (core_->running_threads.load() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(2));
  core_->ioc.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace tost::http
