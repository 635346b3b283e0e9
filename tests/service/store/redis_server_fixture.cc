#include "tests/service/store/redis_server_fixture.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

#ifndef TOST_REDIS_SERVER_BIN
#define TOST_REDIS_SERVER_BIN "/usr/bin/redis-server"
#endif

namespace tost::store::testing {
namespace {

constexpr int kPortAttempts = 5;
constexpr absl::Duration kStopTimeout = absl::Seconds(10);
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

// A port nothing listens on right now: bound to 127.0.0.1:0, read back, released. Another process
// may take it before redis-server binds it; Start retries then.
absl::StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::string why = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("finding a free port on 127.0.0.1: ", why));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A redis.conf argument in double quotes (sdssplitargs' escapes), so passwords may hold anything.
std::string Quoted(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[static_cast<unsigned char>(c) >> 4]);
      out.push_back(kHex[static_cast<unsigned char>(c) & 15]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

enum class Ping { kAnswered, kNotYet };

// One PING: answered (PONG, or NOAUTH from a store with a password) or not yet (refused, LOADING).
Ping PingOnce(int port) {
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, {0, 200 * 1000});
  if (c == nullptr) return Ping::kNotYet;
  Ping result = Ping::kNotYet;
  if (c->err == 0 && redisSetTimeout(c, {0, 500 * 1000}) == REDIS_OK) {
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
    if (reply != nullptr) {
      absl::string_view text(reply->str == nullptr ? "" : reply->str, reply->len);
      if ((reply->type == REDIS_REPLY_STATUS && text == "PONG") ||
          (reply->type == REDIS_REPLY_ERROR && absl::StartsWith(text, "NOAUTH"))) {
        result = Ping::kAnswered;
      }
      freeReplyObject(reply);
    }
  }
  redisFree(c);
  return result;
}

}  // namespace

std::string RedisServerBinary() {
  const char* env = std::getenv("TOST_REDIS_SERVER_BIN");
  return env != nullptr && *env != '\0' ? env : TOST_REDIS_SERVER_BIN;
}

absl::StatusOr<std::unique_ptr<RedisServerProcess>> RedisServerProcess::Start(
    RedisServerOptions options) {
  std::string binary = RedisServerBinary();
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected an executable redis-server at ", binary,
                     " (set TOST_REDIS_SERVER_BIN, or run scripts/install-deps.sh), got: ",
                     std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string dir_template = (tmp / "tost-redis-XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("mkdtemp ", dir_template, " for redis-server: ", std::strerror(errno)));
  }
  std::unique_ptr<RedisServerProcess> server(
      new RedisServerProcess(std::move(options), dir_template));
  absl::Status last;
  for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
    absl::StatusOr<int> port = FreePort();
    if (!port.ok()) return port.status();
    server->port_ = *port;
    if (absl::Status s = server->WriteConfig(); !s.ok()) return s;
    if (absl::Status s = server->Spawn(); !s.ok()) return s;
    last = server->WaitUntilAnswering();
    if (last.ok()) return server;
    bool port_lost = absl::StrContains(server->LogTail(), "Address already in use");
    server->Kill();
    if (!port_lost) break;
  }
  return last;
}

RedisServerProcess::~RedisServerProcess() {
  Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string RedisServerProcess::url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

std::string RedisServerProcess::LogTail() const {
  return absl::StrCat("--- redis.log (end) ---\n", Tail(dir_ + "/redis.log", 2000),
                      "--- stdout/stderr (end) ---\n", Tail(dir_ + "/stdout.log", 1000));
}

absl::Status RedisServerProcess::WriteConfig() const {
  std::string conf = absl::StrCat(
      "port ", port_, "\nbind 127.0.0.1\ndir ", Quoted(dir_), "\nlogfile ",
      Quoted(dir_ + "/redis.log"), "\ndaemonize no\nsave \"\"\nappendonly ",
      options_.appendonly ? "yes" : "no", "\nappendfsync ", options_.appendfsync, "\n");
  if (!options_.requirepass.empty()) {
    absl::StrAppend(&conf, "requirepass ", Quoted(options_.requirepass), "\n");
  }
  if (!options_.acl_user.empty()) {
    absl::StrAppend(&conf, "user ", Quoted(options_.acl_user), " on ",
                    Quoted(absl::StrCat(">", options_.acl_password)), " ~* &* +@all\n");
  }
  for (const std::string& line : options_.extra_config) absl::StrAppend(&conf, line, "\n");
  std::ofstream out(dir_ + "/redis.conf", std::ios::trunc);
  out << conf;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing ", dir_, "/redis.conf failed"));
  return absl::OkStatus();
}

absl::Status RedisServerProcess::Spawn() {
  // Everything the child needs is prepared before fork: between fork and exec it may only make
  // async-signal-safe calls.
  std::string binary = RedisServerBinary();
  std::string conf = dir_ + "/redis.conf";
  std::string out = dir_ + "/stdout.log";
  char* argv[] = {binary.data(), conf.data(), nullptr};
  int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out_fd < 0)
    return absl::InternalError(absl::StrCat("open ", out, ": ", std::strerror(errno)));
  long max_fd = sysconf(_SC_OPEN_MAX);
  if (max_fd < 0) max_fd = 1024;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(out_fd);
    return absl::InternalError(absl::StrCat("fork for redis-server: ", std::strerror(err)));
  }
  if (pid == 0) {
    // Dies with the thread that started it, even when the test binary crashes or is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    // None of the test's sockets (client connections among them) may live on in the server.
    if (close_range(3, ~0U, 0) != 0) {
      for (long fd = 3; fd < max_fd; ++fd) close(static_cast<int>(fd));
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv);
    _exit(127);
  }
  close(out_fd);
  pid_ = pid;
  paused_ = false;
  return absl::OkStatus();
}

absl::Status RedisServerProcess::WaitUntilAnswering() {
  absl::Time deadline = absl::Now() + options_.start_timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return absl::FailedPreconditionError(
          absl::StrCat("redis-server on port ", port_, " exited (status ", status,
                       ") before answering PING; expected it to serve\n", LogTail()));
    }
    if (PingOnce(port_) == Ping::kAnswered) return absl::OkStatus();
    absl::SleepFor(kPollInterval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("redis-server on port ", port_, " did not answer PING within ",
                   absl::FormatDuration(options_.start_timeout), "\n", LogTail()));
}

void RedisServerProcess::Reap() {
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = 0;
  paused_ = false;
}

absl::Status RedisServerProcess::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  if (paused_) kill(pid_, SIGCONT);  // a stopped process handles SIGTERM once continued
  absl::Time deadline = absl::Now() + kStopTimeout;
  while (absl::Now() < deadline) {
    pid_t done = waitpid(pid_, nullptr, WNOHANG);
    if (done == pid_ || (done < 0 && errno == ECHILD)) {
      pid_ = 0;
      paused_ = false;
      return absl::OkStatus();
    }
    absl::SleepFor(kPollInterval);
  }
  int port = port_;
  Kill();
  return absl::DeadlineExceededError(
      absl::StrCat("redis-server on port ", port, " did not exit within ",
                   absl::FormatDuration(kStopTimeout), " of SIGTERM; killed it\n", LogTail()));
}

void RedisServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Reap();
}

absl::Status RedisServerProcess::Restart() {
  if (absl::Status s = Stop(); !s.ok()) return s;
  if (absl::Status s = Spawn(); !s.ok()) return s;
  absl::Status s = WaitUntilAnswering();
  if (!s.ok()) Kill();
  return s;
}

void RedisServerProcess::Pause() {
  if (pid_ > 0 && kill(pid_, SIGSTOP) == 0) paused_ = true;
}

void RedisServerProcess::Resume() {
  if (pid_ > 0 && kill(pid_, SIGCONT) == 0) paused_ = false;
}

}  // namespace tost::store::testing
