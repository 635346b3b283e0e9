// tost_constraint_compiler: compiles one constraint for tost_server (compile_worker.h) under the
// limits the server gives it, and answers whether it compiled. Not a tool for people: it reads the
// server's binary request on stdin and writes a binary answer on stdout.
//
//   tost_constraint_compiler --memory_bytes=N --cpu_seconds=N --parent_pid=N <request >answer
//   tost_constraint_compiler --handshake    prints the protocol it speaks, for the server's check
//
// Exit codes: 0 answered (the answer says whether it compiled), 2 a bad command line or a limit
// it could not set, kWorkerExitOutOfMemory an allocation past --memory_bytes.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "service/structured/compile_worker.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/grammar_vocabulary.h"

namespace {

// A sanitizer's runtime maps terabytes of shadow memory at start: under an address-space limit
// it could not run at all. A sanitizer build's worker is bounded by its deadline and CPU time.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kLimitAddressSpace = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kLimitAddressSpace = false;
#else
constexpr bool kLimitAddressSpace = true;
#endif
#else
constexpr bool kLimitAddressSpace = true;
#endif

using tost::structured::CompileConstraint;
using tost::structured::DecodeWorkerRequest;
using tost::structured::EncodeWorkerAnswer;
using tost::structured::GrammarVocabulary;
using tost::structured::WorkerRequest;

int Usage(std::string_view why) {
  std::fprintf(stderr,
               "tost_constraint_compiler: %.*s\n"
               "usage: tost_constraint_compiler --memory_bytes=N --cpu_seconds=N --parent_pid=N\n"
               "       tost_constraint_compiler --handshake\n"
               "(started by tost_server, which writes its request on stdin)\n",
               static_cast<int>(why.size()), why.data());
  return 2;
}

bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool ReadAll(int fd, std::string* out) {
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buffer, static_cast<size_t>(n));
  }
}

bool SetLimit(int resource, rlim_t soft, rlim_t hard) {
  const rlimit limit{.rlim_cur = soft, .rlim_max = hard};
  return setrlimit(resource, &limit) == 0;
}

absl::Status Compile(const std::string& input) {
  absl::StatusOr<WorkerRequest> request = DecodeWorkerRequest(input);
  // The server sent the request: one it cannot read is the server's fault, not its caller's.
  if (!request.ok()) return absl::InternalError(request.status().message());
  absl::StatusOr<std::shared_ptr<GrammarVocabulary>> vocabulary =
      GrammarVocabulary::FromTokens(std::move(request->tokens), request->model_vocab_size,
                                    request->eos_token_id, request->model_name);
  if (!vocabulary.ok()) return absl::InternalError(vocabulary.status().message());
  return CompileConstraint(*vocabulary, request->constraint, request->max_bytes).status();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t memory_bytes = -1, cpu_seconds = -1, parent_pid = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](std::string_view flag, int64_t* out) {
      return arg.substr(0, flag.size()) == flag &&
             absl::SimpleAtoi(absl::string_view(arg.data() + flag.size(), arg.size() - flag.size()),
                              out) &&
             *out > 0;
    };
    if (arg == "--handshake") {
      return WriteAll(STDOUT_FILENO, tost::structured::kCompileWorkerHandshake) ? 0 : 1;
    }
    if (!value("--memory_bytes=", &memory_bytes) && !value("--cpu_seconds=", &cpu_seconds) &&
        !value("--parent_pid=", &parent_pid)) {
      return Usage(absl::StrCat("unknown or malformed argument: ", std::string(arg)));
    }
  }
  if (memory_bytes < 0 || cpu_seconds < 0 || parent_pid < 0) {
    return Usage("--memory_bytes, --cpu_seconds and --parent_pid are required");
  }
  // Killed with the server thread that started it: a server killed mid-compile leaves no worker
  // compiling behind it. A server gone before this line is seen as a parent other than its own.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent_pid) return 2;
  // No core file from the CPU limit's SIGXCPU; past the soft CPU limit SIGXCPU ends it, past the
  // hard one the kernel's SIGKILL.
  if (!SetLimit(RLIMIT_CORE, 0, 0) ||
      !SetLimit(RLIMIT_CPU, static_cast<rlim_t>(cpu_seconds),
                static_cast<rlim_t>(cpu_seconds + 1)) ||
      (kLimitAddressSpace && !SetLimit(RLIMIT_AS, static_cast<rlim_t>(memory_bytes),
                                       static_cast<rlim_t>(memory_bytes)))) {
    std::fprintf(stderr, "tost_constraint_compiler: setrlimit: %s\n", std::strerror(errno));
    return 2;
  }
  // An allocation past the address-space limit ends the worker with a code the server reads as
  // "past its memory bound", rather than a std::bad_alloc that XGrammar's code might turn into a
  // compile error (or that a noexcept frame would turn into an abort).
  std::set_new_handler([] { _exit(tost::structured::kWorkerExitOutOfMemory); });
  std::string input;
  if (!ReadAll(STDIN_FILENO, &input)) return 2;
  const absl::Status status = Compile(input);
  return WriteAll(STDOUT_FILENO, EncodeWorkerAnswer(status)) ? 0 : 1;
}
