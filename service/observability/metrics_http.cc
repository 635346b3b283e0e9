#include "service/observability/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tost::service {

using Clock = std::chrono::steady_clock;

struct MetricsHttpServer::Connection {
  enum class State {
    kReading,   // the request header has not all arrived
    kWriting,   // the response is being sent
    kDraining,  // answered and shut down for writing; discarding what the client still sends
  };
  int fd = -1;  // -1 once closed: removed from the list at the end of the loop iteration
  State state = State::kReading;
  Clock::time_point accepted;
  Clock::time_point deadline;  // for the current state as a whole, not for one read or write
  std::string request;
  std::string response;
  size_t sent = 0;

  // After the answer, or when the client ended the connection.
  void Close() {
    if (fd < 0) return;
    close(fd);
    fd = -1;
  }
  // When the server gives up on the client. With unread input or unsent output the kernel would
  // keep the socket and its buffers until the peer got round to it: reset the connection instead.
  void Abort() {
    if (fd < 0) return;
    const linger reset{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    Close();
  }
};

namespace {

// Once answered, a connection waits at most this long for the client's FIN while discarding what
// it sends: closing with unread input makes the kernel reset the connection, which can destroy the
// answer (a 431, say) before the client has read it.
constexpr auto kLingerTimeout = std::chrono::seconds(1);
constexpr size_t kReadChunk = 4096;
constexpr int kMaxReadsPerWakeup = 16;
// After accept() fails for want of descriptors the listening socket stays readable; this long
// without accepting keeps the loop from spinning on it.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

std::string Response(const char* status, const char* content_type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// Capped, so that now + the result cannot overflow however long (even infinite) an option is.
Clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(
      absl::ToChronoNanoseconds(std::min(d, absl::Hours(24 * 365))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, int port, std::function<std::string()> render,
    const MetricsHttpServerOptions& options) {
  if (options.request_timeout <= absl::ZeroDuration() ||
      options.response_timeout <= absl::ZeroDuration() || options.max_connections < 1 ||
      options.max_header_bytes < 16) {
    return absl::InvalidArgumentError(
        "metrics endpoint: timeouts must be positive, max_connections at least 1 and "
        "max_header_bytes at least 16");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_address \"", address, "\": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // A backlog well above a burst of scrapes: connections beyond it wait for a SYN retransmit.
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("could not serve metrics on ", address, ":", port, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(fd, bound_port, std::move(render), options));
  if (pipe2(server->wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    return absl::InternalError("metrics endpoint: pipe2 failed");
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int port, std::function<std::string()> render,
                                     const MetricsHttpServerOptions& options)
    : listen_fd_(listen_fd), port_(port), render_(std::move(render)), options_(options) {}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
  close(listen_fd_);
}

void MetricsHttpServer::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!thread_.joinable()) return;
  const char byte = 0;
  while (write(wake_[1], &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void MetricsHttpServer::Loop() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  Clock::time_point accept_paused_until{};
  while (true) {
    const Clock::time_point now = Clock::now();
    // Deadlines cover a whole phase, so a client that keeps a connection busy with a byte now and
    // then is cut off all the same.
    for (Connection& c : connections) {
      if (c.deadline > now) continue;
      if (c.state == Connection::State::kDraining) {
        c.Close();  // answered: the client has had its chance to read it
      } else {
        c.Abort();
      }
    }
    std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });

    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    Clock::time_point next = accepting ? Clock::time_point::max() : accept_paused_until;
    for (const Connection& c : connections) {
      fds.push_back(
          {c.fd, static_cast<short>(c.state == Connection::State::kWriting ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (next != Clock::time_point::max()) {
      // Rounded up, so the loop wakes at or after the deadline rather than spinning just before.
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
      timeout_ms = static_cast<int>(std::clamp<decltype(wait)>(wait, 0, 60'000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) break;

    // The connections, in the order their descriptors were added to `fds`.
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short revents = fds[i + 2].revents;
      if (revents == 0 || c.fd < 0) continue;
      if (c.state == Connection::State::kWriting) {
        if ((revents & (POLLOUT | POLLERR | POLLHUP)) != 0) OnWritable(c);
      } else {
        if ((revents & (POLLIN | POLLERR | POLLHUP)) != 0) OnReadable(c);
      }
    }
    std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });

    if (accepting && (fds[1].revents & POLLIN) != 0 && !Accept(connections))
      accept_paused_until = Clock::now() + kAcceptBackoff;
  }
  for (Connection& c : connections) c.Abort();
}

bool MetricsHttpServer::Accept(std::vector<Connection>& connections) {
  // At most one cap's worth per iteration, so a flood of connects cannot starve the connections
  // already open of their turn.
  for (int accepted = 0; accepted < options_.max_connections; ++accepted) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM;
    }
    if (connections.size() >= static_cast<size_t>(options_.max_connections)) {
      // Make room, dropping the connection that matters least: one already answered, else the
      // oldest still sending its request (a scraper sends its request at once, so a slow one is
      // the likeliest culprit), else the oldest being answered.
      auto rank = [](const Connection& c) {
        switch (c.state) {
          case Connection::State::kDraining:
            return 0;
          case Connection::State::kReading:
            return 1;
          case Connection::State::kWriting:
            return 2;
        }
        return 2;
      };
      auto victim = std::min_element(
          connections.begin(), connections.end(), [&](const Connection& a, const Connection& b) {
            return rank(a) != rank(b) ? rank(a) < rank(b) : a.accepted < b.accepted;
          });
      victim->Abort();
      connections.erase(victim);
    }
    Connection c;
    c.fd = fd;
    c.accepted = Clock::now();
    c.deadline = c.accepted + ToChrono(options_.request_timeout);
    connections.push_back(std::move(c));
  }
  return true;
}

void MetricsHttpServer::OnReadable(Connection& c) {
  char buf[kReadChunk];
  // A client sending as fast as it is read would keep a read loop (the drain's, or a large
  // header's) busy for ever: read a bounded amount per wakeup, and poll() comes back for the rest
  // after the other connections have had their turn.
  for (int chunks = 0; c.fd >= 0 && chunks < kMaxReadsPerWakeup; ++chunks) {
    if (c.state == Connection::State::kDraining) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) c.Close();  // the client's FIN (or an error): done
      continue;
    }
    // Never read past the cap: a header that fills it without ending is refused.
    const size_t room = options_.max_header_bytes - c.request.size();
    const ssize_t n = recv(c.fd, buf, std::min(sizeof(buf), room), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      c.Abort();  // closed or failed before a complete request: nothing to answer
      return;
    }
    // The blank line may straddle two reads: search from just before the new bytes.
    const size_t from = c.request.size() < 3 ? 0 : c.request.size() - 3;
    c.request.append(buf, static_cast<size_t>(n));
    const size_t end = c.request.find("\r\n\r\n", from);
    if (end != std::string::npos) {
      c.request.resize(end + 4);  // anything after the header is ignored (and drained later)
      Answer(c);
      return;
    }
    if (c.request.size() >= options_.max_header_bytes) {
      c.response = Response(
          "431 Request Header Fields Too Large", "text/plain",
          absl::StrCat("the request header exceeds ", options_.max_header_bytes, " bytes\n"));
      c.request.clear();
      c.state = Connection::State::kWriting;
      c.deadline = Clock::now() + ToChrono(options_.response_timeout);
      OnWritable(c);
      return;
    }
  }
}

void MetricsHttpServer::Answer(Connection& c) {
  const size_t line_end = c.request.find("\r\n");
  const std::string line = c.request.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    c.response = Response("400 Bad Request", "text/plain", "expected an HTTP/1.x request line\n");
  } else {
    const std::string method = line.substr(0, sp1);
    std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    if (path != "/metrics") {
      c.response = Response("404 Not Found", "text/plain", "metrics are at /metrics\n");
    } else if (method != "GET" && method != "HEAD") {
      c.response = Response("405 Method Not Allowed", "text/plain", "use GET /metrics\n");
    } else {
      c.response = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
      if (method == "HEAD") c.response.resize(c.response.find("\r\n\r\n") + 4);
    }
  }
  c.request.clear();
  c.request.shrink_to_fit();
  c.state = Connection::State::kWriting;
  // From here, not from accept: a render that took its time does not eat into the client's.
  c.deadline = Clock::now() + ToChrono(options_.response_timeout);
  OnWritable(c);  // most responses fit in the socket buffer: usually done without a poll
}

void MetricsHttpServer::OnWritable(Connection& c) {
  while (c.sent < c.response.size()) {
    const ssize_t n =
        send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // wait for POLLOUT
    if (n <= 0) {
      c.Abort();
      return;
    }
    c.sent += static_cast<size_t>(n);
  }
  c.response.clear();
  c.response.shrink_to_fit();
  shutdown(c.fd, SHUT_WR);  // the client sees the end of the response now
  c.state = Connection::State::kDraining;
  c.deadline = std::min(c.deadline, Clock::now() + kLingerTimeout);
}

}  // namespace tost::service
