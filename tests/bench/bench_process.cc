#include "tests/bench/bench_process.h"

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tost::bench {
namespace {

int64_t StatusField(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + ":");
  if (at == std::string::npos) return -1;
  std::istringstream in(text.substr(at + key.size() + 1));
  int64_t kib = -1;
  in >> kib;
  return kib * 1024;
}

}  // namespace

MemoryStatus ReadMemoryStatus() {
  std::ifstream in("/proc/self/status");
  std::stringstream text;
  text << in.rdbuf();
  return MemoryStatus{StatusField(text.str(), "VmRSS"), StatusField(text.str(), "VmHWM")};
}

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

void ConfigureAllocator(AllocatorMode mode) {
  if (mode == AllocatorMode::kRetain) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);  // as size_t: never trim
  } else {
    mallopt(M_MMAP_MAX, 1 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  }
}

void ReleaseFreeMemory() { malloc_trim(0); }

std::map<std::string, double> RunChild(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> argv;
  std::string self = "/proc/self/exe";
  argv.push_back(self.data());
  std::vector<std::string> copies = args;
  for (std::string& a : copies) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec: the parent has OpenMP threads.
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string args_text;
  for (const std::string& a : args) args_text += " " + a;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("child" + args_text + " failed (" +
                             (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                                : "signal " + std::to_string(WTERMSIG(status))) +
                             "); output:\n" + output);
  }
  const size_t at = output.rfind("RESULT");
  if (at == std::string::npos)
    throw std::runtime_error("child" + args_text + " printed no RESULT line:\n" + output);
  std::istringstream line(output.substr(at + 6, output.find('\n', at) - at - 6));
  std::map<std::string, double> values;
  std::string item;
  while (line >> item) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) values[item.substr(0, eq)] = std::stod(item.substr(eq + 1));
  }
  return values;
}

std::string ResultLine(const std::map<std::string, double>& values) {
  std::ostringstream out;
  out.precision(17);
  out << "RESULT";
  for (const auto& [k, v] : values) out << ' ' << k << '=' << v;
  return out.str();
}

}  // namespace tost::bench
