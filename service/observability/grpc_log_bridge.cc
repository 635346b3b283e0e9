#include "service/observability/grpc_log_bridge.h"

#include <grpc/support/log.h>

#include <atomic>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "service/observability/logging.h"

namespace tost::service {
namespace {

LogLevel LevelOf(gpr_log_severity severity) {
  switch (severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      return LogLevel::kDebug;
    case GPR_LOG_SEVERITY_INFO:
      return LogLevel::kInfo;
    case GPR_LOG_SEVERITY_ERROR:
      return LogLevel::kError;
  }
  return LogLevel::kError;
}

std::atomic<ListenerFailureHandler> listener_failure_handler{nullptr};
std::atomic<bool> listener_failure_reported{false};

std::string_view BaseName(std::string_view file) {
  if (const size_t slash = file.rfind('/'); slash != std::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  return file;
}

// Called by gpr_log on whatever thread logs, only for lines gRPC's verbosity lets through (it
// filters before calling). Log() is safe from any thread and formats outside its lock.
void WriteGrpcLine(gpr_log_func_args* args) {
  // The file name as gRPC's own logger shows it: its build paths say nothing to an operator.
  const std::string_view file = BaseName(args->file != nullptr ? args->file : "");
  const std::string_view message = args->message != nullptr ? args->message : "";
  Log(LevelOf(args->severity), message,
      {{"source", absl::StrCat(std::string(file), ":", args->line)}, {"component", "grpc"}});
  if (IsListenerFailureLine(file, message) && !listener_failure_reported.exchange(true)) {
    if (ListenerFailureHandler handler = listener_failure_handler.load()) handler(message);
  }
}

}  // namespace

void RouteGrpcLogsToServerLog() { gpr_set_log_function(&WriteGrpcLine); }

bool IsListenerFailureLine(std::string_view file, std::string_view message) {
  return BaseName(file) == "tcp_server_posix.cc" && message.starts_with("Failed accept4");
}

void SetListenerFailureHandler(ListenerFailureHandler handler) {
  listener_failure_handler.store(handler);
  listener_failure_reported.store(false);
}

}  // namespace tost::service
