#include "service/http/http_server.h"

#include "service/http/internal/core.h"

namespace tost::http {

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

void HttpExchange::AddLogField(std::string key, std::string value) {
  connection_->Post(
      [c = connection_.get(), from = this, k = std::move(key), v = std::move(value)]() mutable {
        c->DoAddLogField(from, std::move(k), std::move(v));
      });
}

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

}  // namespace tost::http
