#include "service/structured/compile_worker.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/error_detail.h"
#include "base/little_endian.h"

extern char** environ;

namespace tost::structured {
namespace {

constexpr char kRequestMagic[] = "tost-constraint-compile-request-1";
constexpr char kAnswerMagic[] = "tost-constraint-compile-answer-1";
// An answer is a status: its message is the compiler's reason (bounded) and ours. More than this
// is not an answer, and is not read further.
constexpr size_t kMaxAnswerBytes = 64 * 1024;
// How often a wait looks at `cancel`.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);
// A handshake is a start and a line of output.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

void PutInt(std::string& out, int64_t v) {
  base::AppendLittleEndian(out, static_cast<uint64_t>(v), 8);
}

void PutBytes(std::string& out, std::string_view bytes) {
  PutInt(out, static_cast<int64_t>(bytes.size()));
  out.append(bytes.data(), bytes.size());
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}

  bool Int(int64_t* v) {
    if (rest_.size() < 8) return false;
    *v = static_cast<int64_t>(base::ReadLittleEndian(rest_.data(), 8));
    rest_.remove_prefix(8);
    return true;
  }
  bool Bytes(std::string* out) {
    int64_t n = 0;
    if (!Int(&n) || n < 0 || static_cast<uint64_t>(n) > rest_.size()) return false;
    out->assign(rest_.data(), static_cast<size_t>(n));
    rest_.remove_prefix(static_cast<size_t>(n));
    return true;
  }
  bool Magic(std::string_view magic) {
    if (rest_.substr(0, magic.size()) != magic) return false;
    rest_.remove_prefix(magic.size());
    return true;
  }
  size_t left() const { return rest_.size(); }

 private:
  std::string_view rest_;
};

absl::Status Cut(const char* what) {
  return absl::InvalidArgumentError(
      absl::StrCat("compile worker request: expected ", what, ", received too few bytes"));
}

constexpr Constraint::Kind kKinds[] = {
    Constraint::Kind::kJsonSchema, Constraint::Kind::kJsonObject, Constraint::Kind::kRegex,
    Constraint::Kind::kGrammar,    Constraint::Kind::kChoice,     Constraint::Kind::kStructuralTag};

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

// How a worker run ended: its wait status and what the parent saw and did.
struct Run {
  std::string output;  // what it wrote, up to kMaxAnswerBytes
  int wait_status = 0;
  bool killed_at_deadline = false;
  bool cancelled = false;
  bool output_too_long = false;
  int poll_errno = 0;  // poll failed: this errno
  int64_t max_rss_bytes = 0;
};

// Spawns `path` with `args` (argv[0] is path), its stdin and stdout one end of a socket pair and
// its stderr /dev/null, sends it `input` and reads its output to end of file, and reaps it; it is
// killed at `deadline`, when `cancel` turns true, or when it writes more than kMaxAnswerBytes.
// UNAVAILABLE when it could not be started.
absl::StatusOr<Run> RunWorker(const std::string& path, const std::vector<std::string>& args,
                              std::string_view input, absl::Time deadline,
                              const std::atomic<bool>* cancel) {
  int sockets[2];
  // Close-on-exec: another thread's spawn must not carry this worker's socket into its child,
  // where it would keep the worker's end open after the worker is gone.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    return absl::UnavailableError(
        absl::StrCat("starting a constraint compile worker: socketpair: ", ErrnoText(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDOUT_FILENO);
  // The server's log may be JSON lines: nothing of the worker's goes into it.
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  // Nothing else of the server's: a descriptor opened without close-on-exec (a listening socket
  // by a library) would stay open in the worker.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // The server's threads may block signals (a signal-waiting thread) or ignore SIGPIPE: the worker
  // starts with none blocked and the signals its limits send at their default (ending it).
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal : {SIGPIPE, SIGXCPU, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, path.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(sockets[1]);
  const int fd = sockets[0];
  if (spawned != 0) {
    close(fd);
    // The path is the server's: the log's, not the client's.
    return WithServerDetail(absl::UnavailableError(absl::StrCat(
                                "starting a constraint compile worker: ", ErrnoText(spawned))),
                            absl::StrCat("compile worker: ", path));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  Run run;
  size_t sent = 0;
  bool sending = true;
  bool ended = false;  // end of its output: it exited (or closed its stdout)
  while (!ended) {
    if (cancel != nullptr && cancel->load()) {
      run.cancelled = true;
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      run.killed_at_deadline = true;
      break;
    }
    if (sending && sent == input.size()) {
      shutdown(fd, SHUT_WR);  // end of file: the request is whole
      sending = false;
    }
    pollfd poll_fd{
        .fd = fd, .events = static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), .revents = 0};
    const absl::Duration wait = std::min(deadline - now, kCancelPoll);
    const int ready = poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    if (ready < 0 && errno != EINTR) {
      run.poll_errno = errno;  // cannot happen on a valid descriptor; killed and reaped below
      break;
    }
    if (ready <= 0) continue;
    if (sending && (poll_fd.revents & (POLLOUT | POLLERR))) {
      const ssize_t n = send(fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        sending = false;  // it closed its end: it ended, and its wait status says how
      }
    }
    if (poll_fd.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n > 0) {
        run.output.append(buffer, static_cast<size_t>(n));
        if (run.output.size() > kMaxAnswerBytes) {
          run.output_too_long = true;
          break;
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ended = true;
      }
    }
  }
  close(fd);
  // Its output ended: it is exiting. Reaped without blocking until the deadline (a worker that
  // closed its output and went on would otherwise hold this thread), then killed.
  bool reaped = false;
  rusage usage{};
  while (ended && !reaped) {
    const pid_t done = wait4(pid, &run.wait_status, WNOHANG, &usage);
    if (done == pid) {
      reaped = true;
    } else if (done < 0 && errno != EINTR) {
      break;
    } else if (absl::Now() >= deadline) {
      run.killed_at_deadline = true;
      break;
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (!reaped) {
    kill(pid, SIGKILL);
    while (wait4(pid, &run.wait_status, 0, &usage) < 0 && errno == EINTR) {
    }
  }
  run.max_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux counts KiB
  return run;
}

}  // namespace

absl::Status ValidateCompileWorkerOptions(const CompileWorkerOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError(
        "compile worker path: expected the tost_constraint_compiler executable, received \"\"");
  }
  if (options.kill_ms < 1 || options.kill_ms > 600'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile worker kill_ms: expected 1 to 600000, received ", options.kill_ms));
  }
  if (options.memory_bytes < kMinCompileWorkerMemoryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile worker memory_bytes: expected at least 16 MiB (",
                     kMinCompileWorkerMemoryBytes, "), received ", options.memory_bytes));
  }
  return absl::OkStatus();
}

std::string EncodeWorkerRequest(const GrammarVocabulary& vocabulary, const Constraint& constraint,
                                int64_t max_bytes) {
  std::string out(kRequestMagic);
  PutBytes(out, vocabulary.model_name());
  PutInt(out, vocabulary.model_vocab_size());
  PutInt(out, vocabulary.eos_token_id());
  PutInt(out, static_cast<int64_t>(vocabulary.tokens().size()));
  for (const std::string& token : vocabulary.tokens()) PutBytes(out, token);
  PutBytes(out, KindName(constraint.kind));
  PutBytes(out, constraint.text);
  PutInt(out, static_cast<int64_t>(constraint.choices.size()));
  for (const std::string& choice : constraint.choices) PutBytes(out, choice);
  PutInt(out, max_bytes);
  return out;
}

absl::StatusOr<WorkerRequest> DecodeWorkerRequest(std::string_view bytes) {
  Reader in(bytes);
  if (!in.Magic(kRequestMagic)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile worker request: expected it to start \"", kRequestMagic,
                     "\", received something else"));
  }
  WorkerRequest request;
  int64_t eos = 0;
  int64_t count = 0;
  if (!in.Bytes(&request.model_name)) return Cut("the model name");
  if (!in.Int(&request.model_vocab_size)) return Cut("the model's vocabulary size");
  if (!in.Int(&eos)) return Cut("the end-of-text id");
  if (eos < 0 || eos > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compile worker request: expected an end-of-text id in [0, 2^31), received ", eos));
  }
  request.eos_token_id = static_cast<int32_t>(eos);
  // Each token takes at least its 8-byte length: a count past that is not in the request.
  if (!in.Int(&count) || count < 0 || static_cast<uint64_t>(count) > in.left() / 8) {
    return Cut("the token count and that many tokens");
  }
  request.tokens.resize(static_cast<size_t>(count));
  for (std::string& token : request.tokens) {
    if (!in.Bytes(&token)) return Cut("every token's bytes");
  }
  std::string kind;
  if (!in.Bytes(&kind)) return Cut("the constraint's kind");
  const auto* found = std::find_if(std::begin(kKinds), std::end(kKinds),
                                   [&](Constraint::Kind k) { return kind == KindName(k); });
  if (found == std::end(kKinds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile worker request: expected a constraint kind, received \"",
                     kind.substr(0, 32), "\""));
  }
  request.constraint.kind = *found;
  if (!in.Bytes(&request.constraint.text)) return Cut("the constraint's text");
  if (!in.Int(&count) || count < 0 || static_cast<uint64_t>(count) > in.left() / 8) {
    return Cut("the choice count and that many choices");
  }
  request.constraint.choices.resize(static_cast<size_t>(count));
  for (std::string& choice : request.constraint.choices) {
    if (!in.Bytes(&choice)) return Cut("every choice's bytes");
  }
  if (!in.Int(&request.max_bytes)) return Cut("the compiled form's bound");
  if (in.left() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compile worker request: expected its end, received ", in.left(), " more bytes"));
  }
  return request;
}

std::string EncodeWorkerAnswer(const absl::Status& status) {
  std::string out(kAnswerMagic);
  PutInt(out, static_cast<int64_t>(status.code()));
  PutBytes(out, std::string_view(status.message().data(), status.message().size()));
  // Its payloads too (what the server logs beside the message a client reads).
  std::vector<std::pair<std::string, std::string>> payloads;
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    payloads.emplace_back(std::string(type_url), std::string(payload));
  });
  PutInt(out, static_cast<int64_t>(payloads.size()));
  for (const auto& [type_url, payload] : payloads) {
    PutBytes(out, type_url);
    PutBytes(out, payload);
  }
  return out;
}

absl::Status DecodeWorkerAnswer(std::string_view bytes, absl::Status* answer) {
  Reader in(bytes);
  int64_t code = 0;
  int64_t payloads = 0;
  std::string message;
  const auto not_an_answer = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "compile worker answer: expected \"", kAnswerMagic,
        "\", a status code, a message and payloads, received ", bytes.size(), " other bytes"));
  };
  if (!in.Magic(kAnswerMagic) || !in.Int(&code) || !in.Bytes(&message) || !in.Int(&payloads) ||
      code < 0 || code > static_cast<int64_t>(absl::StatusCode::kUnauthenticated) || payloads < 0 ||
      static_cast<uint64_t>(payloads) > in.left() / 16) {
    return not_an_answer();
  }
  absl::Status status(static_cast<absl::StatusCode>(code), message);
  for (int64_t i = 0; i < payloads; ++i) {
    std::string type_url, payload;
    if (!in.Bytes(&type_url) || !in.Bytes(&payload)) return not_an_answer();
    // An OK status keeps no payload: there is none to carry.
    if (!status.ok()) status.SetPayload(type_url, absl::Cord(payload));
  }
  if (in.left() != 0) return not_an_answer();
  *answer = std::move(status);
  return absl::OkStatus();
}

WorkerResult CompileInWorker(const CompileWorkerOptions& options,
                             const GrammarVocabulary& vocabulary, const Constraint& constraint,
                             int64_t max_bytes, const std::atomic<bool>* cancel) {
  WorkerResult result;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options.kill_ms);
  const int64_t cpu_seconds = (options.kill_ms + 999) / 1000 + 1;
  const std::string what = absl::StrCat("constraint ", KindName(constraint.kind), " for model ",
                                        vocabulary.model_name());
  absl::StatusOr<Run> run = RunWorker(
      options.path,
      {absl::StrCat("--memory_bytes=", options.memory_bytes),
       absl::StrCat("--cpu_seconds=", cpu_seconds), absl::StrCat("--parent_pid=", getpid())},
      EncodeWorkerRequest(vocabulary, constraint, max_bytes), deadline, cancel);
  if (!run.ok()) {
    result.status = run.status();
    return result;
  }
  result.max_rss_bytes = run->max_rss_bytes;
  const int wait_status = run->wait_status;
  const int signal = WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
  const std::string retry =
      "; simplify it (fewer properties, patterns, alternatives or bounded repetitions), as "
      "retrying gets the same answer";
  if (run->cancelled) {
    result.status = absl::CancelledError(absl::StrCat(
        "compiling the ", what, ": the server is shutting down, and the compile was stopped"));
  } else if (run->output_too_long) {
    result.status = absl::InternalError(
        absl::StrCat("compiling the ", what, ": the compile worker wrote more than ",
                     kMaxAnswerBytes, " bytes, which is no answer of its protocol"));
  } else if (run->poll_errno != 0) {
    result.status = absl::InternalError(absl::StrCat(
        "compiling the ", what, ": waiting for the compile worker: ", ErrnoText(run->poll_errno)));
  } else if (run->killed_at_deadline || signal == SIGXCPU || signal == SIGKILL) {
    // SIGKILL it was not sent by this thread: the CPU-time limit's hard edge (or the system's
    // out-of-memory killer); either way the compile wanted more than a compile is given.
    result.past_bound = true;
    result.status = absl::InvalidArgumentError(
        absl::StrCat(what, ": its compile ran past ", options.kill_ms,
                     " ms (--constraint_compile_kill_ms) and was stopped", retry));
  } else if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kWorkerExitOutOfMemory) {
    result.past_bound = true;
    result.status = absl::InvalidArgumentError(absl::StrCat(
        what, ": its compile needed more than the ", options.memory_bytes >> 20,
        " MiB a compile may use (--constraint_compile_memory_mb) and was stopped", retry));
  } else if (signal != 0) {
    result.status = absl::InternalError(absl::StrCat("compiling the ", what,
                                                     ": the compile worker ended on signal ",
                                                     signal, " (", strsignal(signal), ")"));
  } else if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    result.status = absl::InternalError(
        absl::StrCat("compiling the ", what, ": the compile worker exited with code ",
                     WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1, " without answering"));
  } else {
    if (absl::Status read = DecodeWorkerAnswer(run->output, &result.status); !read.ok()) {
      result.status =
          absl::InternalError(absl::StrCat("compiling the ", what, ": ", read.message()));
    }
  }
  return result;
}

absl::StatusOr<std::string> FindCompileWorker(const std::string& configured) {
  std::string path = configured;
  if (path.empty()) {
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self));
    if (n <= 0 || n >= static_cast<ssize_t>(sizeof(self))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "finding ", kCompileWorkerName,
          " beside this executable: /proc/self/exe: ", n < 0 ? ErrnoText(errno) : "no path"));
    }
    const std::string exe(self, static_cast<size_t>(n));
    path = absl::StrCat(exe.substr(0, exe.rfind('/') + 1), kCompileWorkerName);
  }
  if (access(path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the constraint compile worker ", path, ": ", ErrnoText(errno)));
  }
  // It answers as this build's worker: one of another version beside the server would misread
  // the requests.
  absl::StatusOr<Run> run =
      RunWorker(path, {"--handshake"}, "", absl::Now() + kHandshakeTimeout, nullptr);
  if (!run.ok()) return absl::FailedPreconditionError(run.status().message());
  if (!WIFEXITED(run->wait_status) || WEXITSTATUS(run->wait_status) != 0 ||
      run->output != kCompileWorkerHandshake) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the constraint compile worker ", path, ": expected it to answer --handshake with \"",
        absl::StripSuffix(kCompileWorkerHandshake, "\n"), "\" and exit 0, received ",
        run->output.size(), " bytes and wait status ", run->wait_status));
  }
  return path;
}

}  // namespace tost::structured
