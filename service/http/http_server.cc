#include "service/http/http_server.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/thread_name.h"
#include "service/observability/logging.h"

namespace tost::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Strand = net::strand<net::io_context::executor_type>;
using Clock = std::chrono::steady_clock;

namespace {

// Once answered and closing, a connection waits at most this long for the client's FIN while
// discarding what it still sends: closing with unread input makes the kernel reset the
// connection, which can destroy the answer (a 431, say) before the client has read it.
constexpr auto kLingerTimeout = std::chrono::seconds(1);
// After accept() fails for want of descriptors the listening socket stays ready; this long without
// accepting keeps the acceptor from spinning on it.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// What one read of a waiting connection takes at most (the next request's first bytes, bytes a
// client sends while its answer is prepared).
constexpr size_t kReadChunk = 4096;

// Debian's Abseil has its own string_view type.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::chrono::milliseconds Ms(int64_t ms) { return std::chrono::milliseconds(ms); }

HttpResponse DefaultErrorResponse(int status, std::string_view message) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = absl::StrCat(Absl(message), "\n");
  return r;
}

// Identity the way gRPC reports a TLS peer: its first DNS subject alternative name, else its
// common name.
std::string CertificateIdentity(X509* cert) {
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  std::string identity;
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && identity.empty(); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type == GEN_DNS) {
        const unsigned char* data = ASN1_STRING_get0_data(name->d.dNSName);
        identity.assign(reinterpret_cast<const char*>(data),
                        static_cast<size_t>(ASN1_STRING_length(name->d.dNSName)));
      }
    }
    GENERAL_NAMES_free(names);
  }
  if (!identity.empty()) return identity;
  char cn[256] = {0};
  const int n =
      X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  return n > 0 ? std::string(cn, static_cast<size_t>(n)) : std::string();
}

service::LogLevel LevelFor(int status) {
  using service::LogLevel;
  if (status >= 500 && status != 503) return LogLevel::kError;
  if (status >= 400) return LogLevel::kWarning;
  return LogLevel::kInfo;
}

}  // namespace

using service::IsValidRequestId;
using service::Log;
using service::LogLevel;
using service::NewRequestId;

HttpResponse MakeResponse(int status, std::string body, std::string content_type) {
  HttpResponse r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

std::string_view HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Router

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

// ---------------------------------------------------------------------------------------------
// Shared state

namespace internal {
class ConnectionBase;
}

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

  std::vector<std::shared_ptr<internal::ConnectionBase>> Live() ABSL_LOCKS_EXCLUDED(mu);
  void Accept(const std::shared_ptr<Core>& self);
  void OnAccepted(const std::shared_ptr<Core>& self, Strand strand, tcp::socket socket);
  HttpResponse Error(int status, std::string_view message) const {
    return options.error_response ? options.error_response(status, message)
                                  : DefaultErrorResponse(status, message);
  }
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

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// HttpExchange

HttpExchange::HttpExchange(std::shared_ptr<internal::ConnectionBase> connection,
                           HttpRequest request, size_t stream_buffer_bytes)
    : connection_(std::move(connection)),
      request_(std::move(request)),
      stream_buffer_bytes_(stream_buffer_bytes) {}

HttpExchange::~HttpExchange() {
  State state;
  {
    absl::MutexLock lock(&mu_);
    state = state_;
  }
  if (state == State::kNew) {
    HttpResponse r;
    r.status = 500;
    r.content_type = "text/plain; charset=utf-8";
    r.body = "the handler ended without an answer\n";
    connection_->Post(
        [c = connection_.get(), r = std::move(r)]() mutable { c->DoRespond(std::move(r)); });
  } else if (state == State::kStreaming) {
    connection_->Post([c = connection_.get()] { c->DoFinish(); });
  }
}

bool HttpExchange::Respond(HttpResponse response) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) return false;
    state_ = State::kAnswered;
  }
  connection_->Post(
      [c = connection_.get(), r = std::move(response)]() mutable { c->DoRespond(std::move(r)); });
  return true;
}

bool HttpExchange::StartStream(int status, HttpHeaders headers, std::string content_type) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) return false;
    state_ = State::kStreaming;
  }
  connection_->Post([c = connection_.get(), status, h = std::move(headers),
                     t = std::move(content_type)]() mutable {
    c->DoStartStream(status, std::move(h), std::move(t));
  });
  return true;
}

bool HttpExchange::Write(std::string chunk) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kStreaming || cancelled()) return false;
  }
  if (chunk.empty()) return true;  // an empty chunk would end the stream
  buffered_bytes_.fetch_add(chunk.size(), std::memory_order_acq_rel);
  connection_->Post([c = connection_.get(), chunk = std::move(chunk)]() mutable {
    c->DoWrite(std::move(chunk));
  });
  return true;
}

bool HttpExchange::HasRoom() const { return buffered_bytes() < stream_buffer_bytes_; }

void HttpExchange::OnWritable(std::function<void()> callback) {
  bool now = false;
  {
    absl::MutexLock lock(&mu_);
    now = cancelled() || HasRoom();
    if (!now) on_writable_.push_back(std::move(callback));
  }
  // Checked again in Drained() under the lock, so a drain between the check and the push still
  // finds the callback.
  if (now) connection_->Post(std::move(callback));
}

void HttpExchange::Finish() {
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kStreaming) return;
    state_ = State::kFinished;
  }
  connection_->Post([c = connection_.get()] { c->DoFinish(); });
}

void HttpExchange::Abort() { connection_->Abort(); }

void HttpExchange::OnCancel(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled()) {
      on_cancel_.push_back(std::move(callback));
      return;
    }
  }
  connection_->Post(std::move(callback));
}

void HttpExchange::Cancel() {
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_.exchange(true)) return;
    run = std::move(on_cancel_);
    for (auto& w : on_writable_) run.push_back(std::move(w));
    on_writable_.clear();
  }
  for (auto& fn : run) fn();
}

void HttpExchange::Drained(size_t bytes) {
  buffered_bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
  std::vector<std::function<void()>> run;
  {
    absl::MutexLock lock(&mu_);
    if (buffered_bytes() > stream_buffer_bytes_ / 2) return;
    run = std::move(on_writable_);
    on_writable_.clear();
  }
  for (auto& fn : run) fn();
}

// ---------------------------------------------------------------------------------------------
// A connection over a plain or TLS stream. Everything below runs on the connection's strand.

template <class Stream>
class Connection final : public internal::ConnectionBase {
 public:
  Connection(std::shared_ptr<HttpServer::Core> core, Strand strand, tcp::socket socket, uint64_t id)
      : ConnectionBase(core, std::move(strand), id),
        stream_(MakeStream(*core, std::move(socket))) {}

  void Run() {
    if (core_->stopped.load(std::memory_order_acquire)) return DoAbort();
    header_deadline_ = accepted_ + Ms(core_->options.read_header_timeout_ms);
    boost::system::error_code ec;
    Socket().set_option(tcp::no_delay(true), ec);  // stream events go out as written
    const auto endpoint = Socket().remote_endpoint(ec);
    if (!ec) peer_ = absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
    if constexpr (kTls) {
      Lowest().expires_at(header_deadline_);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = Self()](boost::system::error_code ec) {
                                if (ec) return self->DoAbort();
                                self->ReadTlsPeer();
                                self->StartHeader(/*first=*/true);
                              });
    } else {
      StartHeader(/*first=*/true);
    }
  }

  void DoAbort() override {
    if (phase_ == Phase::kClosed) return;
    boost::system::error_code ec;
    // Reset, so the kernel drops the connection's buffers at once.
    Socket().set_option(net::socket_base::linger(true, 0), ec);
    Close();
  }

  void DoCloseIfIdle() override {
    if (phase_ == Phase::kIdle && buffer_.size() == 0) Close();
  }

  void DoRespond(HttpResponse r) override {
    if (phase_ != Phase::kBusy || answering_) return;
    answering_ = true;
    const bool close = ShouldClose();
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(r.status), 11);
    FillHeaders(*res, r.status, r.headers, r.content_type, close);
    res->content_length(r.body.size());
    if (request_.method != "HEAD") res->body() = std::move(r.body);
    status_ = r.status;
    Lowest().expires_after(Ms(core_->options.write_timeout_ms));
    bhttp::async_write(stream_, *res,
                       [self = Self(), res, close](boost::system::error_code ec, size_t) {
                         self->OnAnswered(ec, close);
                       });
  }

  void DoStartStream(int status, HttpHeaders headers, std::string content_type) override {
    if (phase_ != Phase::kBusy || answering_) return;
    answering_ = true;
    streaming_ = true;
    stream_close_ = ShouldClose();
    status_ = status;
    stream_header_.emplace(static_cast<bhttp::status>(status), 11);
    headers.emplace_back("Cache-Control", "no-cache");
    FillHeaders(*stream_header_, status, headers, content_type, stream_close_);
    stream_header_->chunked(true);
    serializer_.emplace(*stream_header_);
    writing_ = true;
    Lowest().expires_after(Ms(core_->options.write_timeout_ms));
    bhttp::async_write_header(stream_, *serializer_,
                              [self = Self()](boost::system::error_code ec, size_t) {
                                self->writing_ = false;
                                if (ec) return self->OnStreamFailed(ec);
                                self->Pump();
                              });
  }

  void DoWrite(std::string chunk) override {
    if (!streaming_ || stream_failed_) {
      if (auto e = weak_exchange_.lock()) DrainedExchange(*e, chunk.size());
      return;
    }
    pending_ += chunk;
    if (!writing_) Pump();
  }

  void DoFinish() override {
    if (!streaming_ || finish_requested_) return;
    finish_requested_ = true;
    if (!writing_) Pump();
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  static Stream MakeStream(HttpServer::Core& core, tcp::socket socket) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *core.ssl);
    } else {
      return Stream(std::move(socket));
    }
  }
  std::shared_ptr<Connection> Self() {
    return std::static_pointer_cast<Connection>(shared_from_this());
  }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  tcp::socket& Socket() { return Lowest().socket(); }

  void ReadTlsPeer() {
    if constexpr (kTls) {
      X509* cert = SSL_get1_peer_certificate(stream_.native_handle());
      if (cert == nullptr) return;
      char line[512] = {0};
      X509_NAME_oneline(X509_get_subject_name(cert), line, sizeof(line));
      tls_subject_ = line;
      tls_identity_ = CertificateIdentity(cert);
      X509_free(cert);
    }
  }

  bool ShouldClose() const {
    return !core_->options.keep_alive || !keep_alive_ ||
           core_->draining.load(std::memory_order_acquire);
  }

  template <class Message>
  void FillHeaders(Message& m, int status, const HttpHeaders& headers,
                   const std::string& content_type, bool close) {
    (void)status;
    m.set(bhttp::field::content_type, content_type);
    for (const auto& [name, value] : headers) m.set(name, value);
    m.set("x-request-id", request_.request_id);
    m.keep_alive(!close);
  }

  // --- reading ---------------------------------------------------------------------------------

  // The next request: the first is read against the deadline set at accept; later ones wait idle
  // for their first byte, then get the header timeout from there.
  void StartHeader(bool first) {
    if (first || buffer_.size() > 0) return ReadHeader(first);
    if (core_->draining.load(std::memory_order_acquire)) return Close();
    phase_ = Phase::kIdle;
    Lowest().expires_after(Ms(core_->options.idle_timeout_ms));
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = Self()](boost::system::error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->buffer_.commit(n);
                              self->ReadHeader(/*first=*/false);
                            });
  }

  void ReadHeader(bool first) {
    phase_ = Phase::kReading;
    parser_.emplace();
    parser_->header_limit(
        static_cast<std::uint32_t>(std::min<size_t>(core_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(core_->options.max_body_bytes);
    if (first) {
      Lowest().expires_at(header_deadline_);
    } else {
      Lowest().expires_after(Ms(core_->options.read_header_timeout_ms));
    }
    started_ = absl::Now();
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = Self()](boost::system::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // A read that ended without a request: answered with `status` where the client can read it.
  void Refused(boost::system::error_code ec) {
    if (ec == bhttp::error::header_limit) {
      Reject(431, absl::StrCat("the request header exceeds ", core_->options.max_header_bytes,
                               " bytes (request line and fields)"));
    } else if (ec == bhttp::error::body_limit) {
      Reject(413,
             absl::StrCat("the request body exceeds ", core_->options.max_body_bytes, " bytes"));
    } else if (ec == beast::error::timeout) {
      DoAbort();  // too slow: nothing to answer
    } else if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
               ec == net::error::connection_reset || ec == net::error::operation_aborted ||
               ec == bhttp::error::partial_message || ec == net::error::bad_descriptor) {
      DoAbort();  // closed before a complete request
    } else {
      Reject(400, absl::StrCat("expected an HTTP/1.x request, got a malformed one (", ec.message(),
                               ")"));
    }
  }

  void OnHeader(boost::system::error_code ec) {
    if (ec) {
      Refused(ec);
      return;
    }
    if (parser_->is_done()) return Dispatch();
    auto& req = parser_->get();
    Lowest().expires_after(Ms(core_->options.read_body_timeout_ms));
    if (absl::EqualsIgnoreCase(Absl(req[bhttp::field::expect]), "100-continue")) {
      auto cont =
          std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, 11);
      bhttp::async_write(stream_, *cont,
                         [self = Self(), cont](boost::system::error_code ec, size_t) {
                           if (ec) return self->DoAbort();
                           self->ReadBody();
                         });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = Self()](boost::system::error_code ec, size_t) {
                        if (ec) {
                          self->Refused(ec);
                          return;
                        }
                        self->Dispatch();
                      });
  }

  // --- handling --------------------------------------------------------------------------------

  void Dispatch() {
    auto message = parser_->release();
    parser_.reset();
    keep_alive_ = message.keep_alive();
    HttpRequest r;
    r.method = std::string(message.method_string());
    const std::string_view target = message.target();
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& field : message) {
      r.headers.emplace_back(absl::AsciiStrToLower(Absl(field.name_string())),
                             std::string(field.value()));
    }
    r.body = std::move(message.body());
    const std::string_view id = r.Header("x-request-id");
    r.request_id = IsValidRequestId(id) ? std::string(id) : NewRequestId();
    r.peer = peer_;
    const std::string_view auth = r.Header("authorization");
    if (absl::StartsWithIgnoreCase(Absl(auth), "bearer ")) {
      r.bearer_token = std::string(absl::StripAsciiWhitespace(Absl(auth.substr(7))));
    }
    r.tls_client_subject = tls_subject_;
    r.tls_client_identity = tls_identity_;

    const HttpRouter& router = core_->router;
    HttpRouter::Match match = router.Find(r.method, r.path);
    r.route = match.route;
    BeginRequest(r);
    if (!match.is_public && router.authenticator()) {
      absl::StatusOr<std::string> caller = router.authenticator()(r);
      if (!caller.ok()) {
        const int status =
            caller.status().code() == absl::StatusCode::kPermissionDenied ? 403 : 401;
        HttpResponse e = core_->Error(status, std::string_view(caller.status().message().data(),
                                                               caller.status().message().size()));
        if (status == 401) e.headers.emplace_back("WWW-Authenticate", "Bearer");
        return Answer(std::move(r), std::move(e));
      }
      r.caller = *std::move(caller);
    }
    if (match.handler == nullptr) {
      HttpResponse e =
          match.status == 405
              ? core_->Error(405, absl::StrCat(r.path, " takes ", match.allow, ", got ", r.method))
              : core_->Error(404, absl::StrCat("no route for ", r.path));
      if (match.status == 405) e.headers.emplace_back("Allow", match.allow);
      return Answer(std::move(r), std::move(e));
    }
    auto exchange = MakeExchange(std::move(r));
    weak_exchange_ = exchange;
    StartWatch();
    (*match.handler)(std::move(exchange));
  }

  void BeginRequest(const HttpRequest& r) {
    phase_ = Phase::kBusy;
    answering_ = false;
    streaming_ = false;
    finish_requested_ = false;
    stream_failed_ = false;
    status_ = 0;
    request_ = {};
    request_.method = r.method;
    request_.path = r.path;
    request_.request_id = r.request_id;
    request_.route = r.route;
    request_.peer = r.peer;
    core_->in_flight.fetch_add(1, std::memory_order_acq_rel);
    in_request_ = true;
    if (core_->options.observer != nullptr) core_->options.observer->OnRequestStarted(r);
  }

  // An answer of the server's own, without an exchange.
  void Answer(HttpRequest r, HttpResponse response) {
    (void)r;
    DoRespond(std::move(response));
  }

  // Reads while the request is handled: the client's disconnect cancels the exchange, and bytes of
  // a pipelined next request are kept (up to the header limit; then TCP holds the rest back).
  void StartWatch() {
    if (watching_ || phase_ != Phase::kBusy) return;
    if (buffer_.size() >= core_->options.max_header_bytes) return;
    watching_ = true;
    Lowest().expires_never();
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = Self()](boost::system::error_code ec, size_t n) {
                              self->watching_ = false;
                              if (!ec) self->buffer_.commit(n);
                              if (self->after_watch_) {
                                auto next = std::move(self->after_watch_);
                                self->after_watch_ = nullptr;
                                return next();
                              }
                              if (ec) {
                                // EOF may be a half-close: the answer is still written, but
                                // the work behind it may stop.
                                self->CancelCurrent();
                                return;
                              }
                              self->StartWatch();
                            });
  }

  // Runs `next` once no watch read is pending.
  void AfterWatch(std::function<void()> next) {
    if (!watching_) return next();
    after_watch_ = std::move(next);
    boost::system::error_code ec;
    Socket().cancel(ec);
  }

  void CancelCurrent() {
    if (auto e = weak_exchange_.lock()) CancelExchange(*e);
  }

  void OnAnswered(boost::system::error_code ec, bool close) {
    if (ec) {
      EndRequest(499);
      CancelCurrent();
      return DoAbort();
    }
    EndRequest(status_);
    Next(close);
  }

  void Next(bool close) {
    AfterWatch([self = Self(), close] {
      if (self->phase_ == Phase::kClosed) return;
      if (close) return self->CloseGracefully();
      self->StartHeader(/*first=*/false);
    });
  }

  // 499: the client went away (or was cut off) before its answer was written; the exchange is
  // cancelled so the work behind it can stop.
  void EndRequest(int status) {
    if (!in_request_) return;
    in_request_ = false;
    if (status == 499) CancelCurrent();
    weak_exchange_.reset();
    core_->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    const absl::Duration elapsed = absl::Now() - started_;
    if (core_->options.observer != nullptr) {
      core_->options.observer->OnRequestFinished(request_, status, elapsed);
    }
    if (core_->options.log_requests) {
      Log(LevelFor(status), "http",
          {{"request_id", request_.request_id},
           {"server", core_->options.name},
           {"method", request_.method},
           {"path", request_.path},
           {"status", status},
           {"duration_ms", absl::ToDoubleMilliseconds(elapsed)},
           {"peer", request_.peer}});
    }
  }

  // --- streams ---------------------------------------------------------------------------------

  void Pump() {
    if (stream_failed_ || writing_) return;
    if (!pending_.empty()) {
      out_ = std::move(pending_);
      pending_.clear();
      writing_ = true;
      Lowest().expires_after(Ms(core_->options.write_timeout_ms));
      net::async_write(stream_, bhttp::make_chunk(net::buffer(out_)),
                       [self = Self()](boost::system::error_code ec, size_t) {
                         self->writing_ = false;
                         const size_t bytes = self->out_.size();
                         self->out_.clear();
                         if (auto e = self->weak_exchange_.lock()) DrainedExchange(*e, bytes);
                         if (ec) return self->OnStreamFailed(ec);
                         self->Pump();
                       });
      return;
    }
    if (!finish_requested_) return;
    writing_ = true;
    Lowest().expires_after(Ms(core_->options.write_timeout_ms));
    net::async_write(stream_, bhttp::make_chunk_last(),
                     [self = Self()](boost::system::error_code ec, size_t) {
                       self->writing_ = false;
                       self->streaming_ = false;
                       self->serializer_.reset();
                       self->stream_header_.reset();
                       if (ec) return self->OnStreamFailed(ec);
                       self->EndRequest(self->status_);
                       self->Next(self->stream_close_);
                     });
  }

  void OnStreamFailed(boost::system::error_code) {
    stream_failed_ = true;
    if (auto e = weak_exchange_.lock()) DrainedExchange(*e, pending_.size());
    pending_.clear();
    EndRequest(499);
    CancelCurrent();
    DoAbort();
  }

  // --- closing ---------------------------------------------------------------------------------

  void CloseGracefully() {
    phase_ = Phase::kIdle;  // answered: the first to go at the connection cap
    if constexpr (kTls) {
      Lowest().expires_after(kLingerTimeout);
      stream_.async_shutdown([self = Self()](boost::system::error_code) { self->Close(); });
    } else {
      boost::system::error_code ec;
      Socket().shutdown(tcp::socket::shutdown_send, ec);
      Lowest().expires_after(kLingerTimeout);
      Discard();
    }
  }

  void Discard() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = Self()](boost::system::error_code ec, size_t) {
                              if (ec) return self->Close();  // the client's FIN, or the timeout
                              self->Discard();
                            });
  }

  void Reject(int status, std::string message) {
    HttpRequest r;
    r.method = parser_ && parser_->is_header_done() ? std::string(parser_->get().method_string())
                                                    : std::string("-");
    r.path = parser_ && parser_->is_header_done() ? std::string(parser_->get().target()) : "-";
    r.path = r.path.substr(0, r.path.find('?'));
    r.request_id = NewRequestId();
    r.peer = peer_;
    parser_.reset();
    keep_alive_ = false;
    BeginRequest(r);
    Answer(std::move(r), core_->Error(status, message));
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    if (in_request_) EndRequest(499);
    CancelCurrent();
    boost::system::error_code ec;
    Socket().close(ec);
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Clock::time_point header_deadline_;
  std::string peer_;
  std::string tls_subject_;
  std::string tls_identity_;
  // The request being handled.
  HttpRequest request_;  // what the log and the observer need of it (no headers, no body)
  absl::Time started_;
  bool in_request_ = false;
  bool keep_alive_ = true;
  bool answering_ = false;
  int status_ = 0;
  std::weak_ptr<HttpExchange> weak_exchange_;
  bool watching_ = false;
  std::function<void()> after_watch_;
  // The stream, if the answer is one.
  bool streaming_ = false;
  bool stream_close_ = false;
  bool finish_requested_ = false;
  bool stream_failed_ = false;
  bool writing_ = false;
  std::optional<bhttp::response<bhttp::empty_body>> stream_header_;
  std::optional<bhttp::response_serializer<bhttp::empty_body>> serializer_;
  std::string pending_;  // queued by Write(), not yet being written
  std::string out_;      // being written
};

// ---------------------------------------------------------------------------------------------
// Server

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
  std::shared_ptr<internal::ConnectionBase> connection;
  if (ssl) {
    auto c = std::make_shared<Connection<beast::ssl_stream<beast::tcp_stream>>>(
        self, std::move(strand), std::move(socket), id);
    connection = c;
    {
      absl::MutexLock lock(&mu);
      connections.emplace(id, connection);
    }
    net::post(c->strand(), [c] { c->Run(); });
  } else {
    auto c = std::make_shared<Connection<beast::tcp_stream>>(self, std::move(strand),
                                                             std::move(socket), id);
    connection = c;
    {
      absl::MutexLock lock(&mu);
      connections.emplace(id, connection);
    }
    net::post(c->strand(), [c] { c->Run(); });
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpRouter router) {
  if (absl::Status s = ValidateHttpServerOptions(options); !s.ok()) return s;
  auto core = std::make_shared<Core>(std::move(options), std::move(router));
  const HttpServerOptions& o = core->options;
  if (!o.tls_cert_file.empty()) {
    auto cert = model::ReadFileToString(o.tls_cert_file);
    if (!cert.ok()) return cert.status();
    auto key = model::ReadFileToString(o.tls_key_file);
    if (!key.ok()) return key.status();
    core->ssl.emplace(net::ssl::context::tls_server);
    auto& ctx = *core->ssl;
    ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                    net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                    net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
    boost::system::error_code ec;
    ctx.use_certificate_chain(net::buffer(*cert), ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.name, " server: tls_cert_file ", o.tls_cert_file,
          ": expected a PEM certificate chain, got one OpenSSL refuses: ", ec.message()));
    }
    ctx.use_private_key(net::buffer(*key), net::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.name, " server: tls_key_file ", o.tls_key_file,
                       ": expected the PEM private key of tls_cert_file, got one OpenSSL refuses: ",
                       ec.message()));
    }
    if (!o.tls_client_ca_file.empty()) {
      auto ca = model::ReadFileToString(o.tls_client_ca_file);
      if (!ca.ok()) return ca.status();
      ctx.add_certificate_authority(net::buffer(*ca), ec);
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            o.name, " server: tls_client_ca_file ", o.tls_client_ca_file,
            ": expected a PEM CA certificate, got one OpenSSL refuses: ", ec.message()));
      }
      ctx.set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
    }
  }

  boost::system::error_code ec;
  tcp::resolver resolver(core->ioc);
  auto results = resolver.resolve(o.address, std::to_string(o.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(o.name, " server: address \"", o.address,
                                                   "\" does not resolve: ", ec.message()));
  }
  std::string error = "no address";
  bool bound = false;
  for (const auto& entry : results) {
    tcp::acceptor& a = core->acceptor;
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

bool HttpServer::tls() const { return core_->ssl.has_value(); }

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
