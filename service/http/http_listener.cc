// The listening socket: binding it, the accept loop on the acceptor's strand, and the connection
// cap, which decides on every newcomer which connection (if any) has to go.
#include "service/http/http_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "service/http/internal/core.h"

namespace tost::http {

namespace {

// After accept() fails for want of descriptors the listening socket stays ready; this long without
// accepting keeps the acceptor from spinning on it.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

}  // namespace

std::vector<std::shared_ptr<internal::ConnectionBase>> HttpServer::Core::Live() {
  std::vector<std::shared_ptr<internal::ConnectionBase>> live;
  absl::MutexLock lock(&mu);
  live.reserve(connections.size());
  for (auto& [id, weak] : connections) {
    if (auto c = weak.lock()) live.push_back(std::move(c));
  }
  return live;
}

void HttpServer::Core::Accept(const std::shared_ptr<Core>& self) {
  if (stopped.load() || draining.load()) return;
  Strand strand = net::make_strand(ioc);
  acceptor.async_accept(strand, [self, strand](boost::system::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (or memory): wait a little before the next try.
      if (!self->accept_backoff) self->accept_backoff.emplace(self->ioc);
      self->accept_backoff->expires_after(kAcceptBackoff);
      self->accept_backoff->async_wait([self](boost::system::error_code e) {
        if (!e) net::post(self->acceptor.get_executor(), [self] { self->Accept(self); });
      });
      return;
    }
    self->OnAccepted(self, strand, std::move(socket));
    self->Accept(self);
  });
}

void HttpServer::Core::OnAccepted(const std::shared_ptr<Core>& self, Strand strand,
                                  tcp::socket socket) {
  uint64_t id;
  std::vector<std::shared_ptr<internal::ConnectionBase>> live;
  {
    absl::MutexLock lock(&mu);
    id = ++next_id;
  }
  live = Live();
  // At the cap, make room by dropping the connection that matters least: an idle one (between
  // requests, or answered and closing) first, else the oldest still sending its request (a slow
  // sender is the likeliest culprit). Connections being answered are never dropped for a newcomer
  // (a stream is someone's generation): with all of them busy the newcomer is refused.
  int64_t open = 0;
  for (const auto& c : live) open += c->phase() != internal::ConnectionBase::Phase::kClosed;
  if (open >= options.max_connections) {
    internal::ConnectionBase* victim = nullptr;
    for (const auto& c : live) {
      const auto p = c->phase();
      if (p != internal::ConnectionBase::Phase::kIdle &&
          p != internal::ConnectionBase::Phase::kReading) {
        continue;
      }
      if (victim == nullptr || p < victim->phase() ||
          (p == victim->phase() && c->accepted() < victim->accepted())) {
        victim = c.get();
      }
    }
    if (victim == nullptr) {
      boost::system::error_code ec;
      socket.set_option(net::socket_base::linger(true, 0), ec);
      socket.close(ec);
      return;
    }
    victim->Abort();
  }
  live.clear();
  internal::StartConnection(self, std::move(strand), std::move(socket), id);
}

namespace internal {

absl::Status Listen(HttpServer::Core& core) {
  const HttpServerOptions& o = core.options;
  boost::system::error_code ec;
  tcp::resolver resolver(core.ioc);
  auto results = resolver.resolve(o.address, std::to_string(o.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(o.name, " server: address \"", o.address,
                                                   "\" does not resolve: ", ec.message()));
  }
  std::string error = "no address";
  bool bound = false;
  for (const auto& entry : results) {
    tcp::acceptor& a = core.acceptor;
    boost::system::error_code e;
    a.open(entry.endpoint().protocol(), e);
    if (e) {
      error = e.message();
      continue;
    }
    a.set_option(net::socket_base::reuse_address(true), e);
    a.bind(entry.endpoint(), e);
    // A backlog well above a burst of clients: connections beyond it wait for a SYN retransmit.
    if (!e) a.listen(net::socket_base::max_listen_connections, e);
    if (e) {
      error = e.message();
      boost::system::error_code ignored;
      a.close(ignored);
      continue;
    }
    bound = true;
    break;
  }
  if (!bound) {
    return absl::UnavailableError(
        absl::StrCat("could not serve ", o.name, " on ", o.address, ":", o.port, ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace tost::http
