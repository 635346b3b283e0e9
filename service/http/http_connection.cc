// A connection's state machine (everything here runs on its strand): read a request's header and
// body against their deadlines, hand it to its handler through an HttpExchange, write the answer or
// the stream, then wait idle for the next request or close. Plain TCP and TLS share the code; the
// stream type is the template argument.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/http/http_server.h"
#include "service/http/internal/core.h"
#include "service/http/internal/request.h"
#include "service/http/internal/tls.h"
#include "service/observability/logging.h"

namespace tost::http {

using internal::Absl;
using service::Log;
using service::LogLevel;
using service::NewRequestId;

namespace {

// Once answered and closing, a connection waits at most this long for the client's FIN while
// discarding what it still sends: closing with unread input makes the kernel reset the
// connection, which can destroy the answer (a 431, say) before the client has read it.
constexpr auto kLingerTimeout = std::chrono::seconds(1);
// What one read of a waiting connection takes at most (the next request's first bytes, bytes a
// client sends while its answer is prepared).
constexpr size_t kReadChunk = 4096;

std::chrono::milliseconds Ms(int64_t ms) { return std::chrono::milliseconds(ms); }

LogLevel LevelFor(int status) {
  if (status >= 500 && status != 503) return LogLevel::kError;
  if (status >= 400) return LogLevel::kWarning;
  return LogLevel::kInfo;
}

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

  void DoAddLogField(const HttpExchange* from, std::string key, std::string value) override {
    // Posted before the answer, so it runs before the line is written; one from an earlier
    // request's exchange (added after its answer) finds another exchange current, or none.
    if (!in_request_ || from != current_exchange_) return;
    log_fields_.emplace_back(std::move(key), std::move(value));
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
    if constexpr (kTls) tls_peer_ = internal::ReadTlsPeer(stream_.native_handle());
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
    HttpRequest r = internal::ParseRequest(message, peer_);
    r.tls_client_subject = tls_peer_.subject;
    r.tls_client_identity = tls_peer_.identity;
    const HttpRouter::Match match = core_->router.Find(r.method, r.path);
    r.route = match.route;
    r.path_params = match.path_params;
    BeginRequest(r);
    if (std::optional<HttpResponse> refusal = internal::RouteRefusal(*core_, match, r)) {
      return Answer(std::move(r), *std::move(refusal));
    }
    auto exchange = MakeExchange(std::move(r));
    weak_exchange_ = exchange;
    current_exchange_ = exchange.get();
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
    log_fields_.clear();
    request_.method = r.method;
    request_.path = r.path;
    request_.request_id = r.request_id;
    request_.trace_id = r.trace_id;
    request_.span_id = r.span_id;
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
    current_exchange_ = nullptr;
    core_->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    const absl::Duration elapsed = absl::Now() - started_;
    if (core_->options.observer != nullptr) {
      core_->options.observer->OnRequestFinished(request_, status, elapsed);
    }
    if (core_->options.log_requests) {
      std::vector<service::LogField> fields = {{"request_id", request_.request_id},
                                               {"server", core_->options.name},
                                               {"method", request_.method},
                                               {"path", request_.path},
                                               {"status", status},
                                               {"duration_ms", absl::ToDoubleMilliseconds(elapsed)},
                                               {"peer", request_.peer}};
      if (!request_.trace_id.empty()) {
        fields.push_back({"trace_id", request_.trace_id});
        fields.push_back({"span_id", request_.span_id});
      }
      for (const auto& [key, value] : log_fields_) fields.push_back({key, value});
      Log(LevelFor(status), "http", fields);
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
  internal::TlsPeer tls_peer_;  // empty without TLS or a client certificate
  // The request being handled.
  HttpRequest request_;  // what the log and the observer need of it (no headers, no body)
  absl::Time started_;
  bool in_request_ = false;
  bool keep_alive_ = true;
  bool answering_ = false;
  int status_ = 0;
  std::weak_ptr<HttpExchange> weak_exchange_;
  // The request's exchange while it is in progress (compared, never followed: it may be gone), and
  // the access-log fields its handler added.
  const HttpExchange* current_exchange_ = nullptr;
  std::vector<std::pair<std::string, std::string>> log_fields_;
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

}  // namespace

namespace internal {

void StartConnection(const std::shared_ptr<HttpServer::Core>& core, Strand strand,
                     tcp::socket socket, uint64_t id) {
  auto start = [&](auto c) {
    {
      absl::MutexLock lock(&core->mu);
      core->connections.emplace(id, c);
    }
    net::post(c->strand(), [c] { c->Run(); });
  };
  if (core->ssl) {
    start(std::make_shared<Connection<beast::ssl_stream<beast::tcp_stream>>>(
        core, std::move(strand), std::move(socket), id));
  } else {
    start(std::make_shared<Connection<beast::tcp_stream>>(core, std::move(strand),
                                                          std::move(socket), id));
  }
}

}  // namespace internal
}  // namespace tost::http
