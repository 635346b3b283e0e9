// A real redis-server for tests: started on 127.0.0.1 on a free port in a temporary directory of
// its own, and stopped, killed, restarted on the same port and data (AOF reload), or paused (a
// store that accepts connections but never answers). Never outlives the test: the destructor kills
// and reaps it, and the child dies with the thread that started it (PR_SET_PDEATHSIG) should the
// test binary crash. For the Redis client's tests and for the session store's built on it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tost::store::testing {

struct RedisServerOptions {
  std::string requirepass;  // the default user's password; empty: none
  // An ACL user allowed every command, key and channel (Redis 6 AUTH user password); empty: none.
  std::string acl_user;
  std::string acl_password;
  bool appendonly = false;                           // the AOF that Restart() reloads
  std::string appendfsync = "everysec";              // always | everysec | no
  std::vector<std::string> extra_config;             // more redis.conf lines, verbatim
  absl::Duration start_timeout = absl::Seconds(10);  // until it answers PING
};

// The redis-server binary: $TOST_REDIS_SERVER_BIN when set, else the build's default (CMake's
// TOST_REDIS_SERVER_BIN, /usr/bin/redis-server).
std::string RedisServerBinary();

class RedisServerProcess {
 public:
  // Starts the server and returns once it answers PING (NOAUTH counts: it is answering). A port
  // lost to another process between choosing and binding it is retried on another port.
  static absl::StatusOr<std::unique_ptr<RedisServerProcess>> Start(RedisServerOptions options = {});
  ~RedisServerProcess();
  RedisServerProcess(const RedisServerProcess&) = delete;
  RedisServerProcess& operator=(const RedisServerProcess&) = delete;

  int port() const { return port_; }
  // redis://127.0.0.1:PORT, without credentials.
  std::string url() const;
  const std::string& dir() const { return dir_; }  // its working directory (AOF, log)
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // SIGTERM (Redis flushes its AOF and exits), then waits for it; SIGKILL after 10 s.
  absl::Status Stop();
  // SIGKILL, then reaps it: a crash, the AOF as far as it was written.
  void Kill();
  // Stops it if running, then starts it again on the same port and directory (the AOF is reloaded
  // when appendonly) and waits until it answers.
  absl::Status Restart();
  // SIGSTOP / SIGCONT: while paused the kernel still accepts connections and data, nothing answers.
  void Pause();
  void Resume();

  // The end of the server's log and of its stdout/stderr, for failure messages.
  std::string LogTail() const;

 private:
  RedisServerProcess(RedisServerOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  absl::Status WriteConfig() const;
  absl::Status Spawn();
  // OK once it answers; FAILED_PRECONDITION when it exited (log says why), DEADLINE_EXCEEDED.
  absl::Status WaitUntilAnswering();
  void Reap();

  const RedisServerOptions options_;
  const std::string dir_;
  int port_ = 0;
  pid_t pid_ = 0;
  bool paused_ = false;
};

}  // namespace tost::store::testing
