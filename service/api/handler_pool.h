// Threads for unary handlers served on gRPC's callback API. A handler may block (Classify waits for
// its batch, ModelInfer likewise), so it must not run on gRPC's few callback threads, where one
// waiting call would hold up every stream. Like gRPC's synchronous server, the pool gives every
// call a thread at once: it starts one more whenever none is idle (up to `max_threads`; past that,
// calls wait in order, at most `max_queued` of them, and Schedule refuses more). Unlike the
// synchronous server (Debian's gRPC 1.51), it does not stall: that server held unary calls ~100 ms
// every 1.1 s, whatever the load. A thread idle for `idle_timeout` exits, so
// the threads a burst started (and their stacks) do not stay once it is over.
//
// The server admits generation calls on two such pools (AdmissionPools below), so that a call that
// needs no shared store never waits for a thread behind calls that wait on the store.
#pragma once

#include <deque>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tost::service {

class HandlerPool {
 public:
  // `thread_name`: what its threads are called (base/thread_name.h: 15 bytes are kept).
  HandlerPool(std::string thread_name, int max_threads, int max_queued,
              absl::Duration idle_timeout = absl::Seconds(10));
  // Runs every task already scheduled, then joins the threads.
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // False (and `task` dropped) when every thread is busy and `max_queued` tasks already wait.
  [[nodiscard]] bool Schedule(std::function<void()> task);

  int threads() const;  // running now
  // Tasks running now, and tasks waiting for a thread.
  struct Load {
    int running = 0;
    int queued = 0;
  };
  Load load() const;

  // RESOURCE_EXHAUSTED for `what` (a method, a route) that Schedule refused: the limits it met,
  // and a second to wait before retrying (which the HTTP front end sends as Retry-After).
  absl::Status Refusal(std::string_view what) const;

 private:
  void Work(std::list<std::thread>::iterator self);
  void JoinExited();

  const std::string thread_name_;
  const int max_threads_;
  const int max_queued_;
  const absl::Duration idle_timeout_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // threads in Work
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::list<std::thread> exited_ ABSL_GUARDED_BY(mu_);  // left Work, to be joined
};

// Where the server (server.cc) admits calls, on two bounded pools. A store that stops answering (a
// paused Redis) holds each call that checks a session out, or reads or writes a stored response,
// for up to --session_store_timeout_ms; on one pool enough of them took every thread, and a
// stateless call waited in the queue behind them. So:
//   - `stateless` ("admit") starts every generation call: it parses the request (computing, never
//     waiting, and off gRPC's callback threads and the HTTP I/O threads, where a parse would hold
//     up the other calls) and admits at once a call that needs no store: a fresh prompt, or a state
//     blob's continuation, which brings its own state;
//   - `store` ("admit-store") takes the call once its parsed request names stored state (a session
//     id, a previous_response_id, a conversation), before it touches the store; and the session
//     RPCs, the stored responses' and conversations' routes, and a finished response's writes.
// Which pool is decided from the parsed request, so a call never guesses wrong. Each pool refuses
// past its queue (RESOURCE_EXHAUSTED, HTTP 429 with Retry-After): a stuck store fills the store
// pool, and stateless calls keep their threads. With the in-memory store nothing waits on either.
struct AdmissionPools {
  HandlerPool& stateless;
  HandlerPool& store;
};

}  // namespace tost::service
