#include "service/observability/grpc_log_bridge.h"

#include <grpc/support/log.h>

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

// Called by gpr_log on whatever thread logs, only for lines gRPC's verbosity lets through (it
// filters before calling). Log() is safe from any thread and formats outside its lock.
void WriteGrpcLine(gpr_log_func_args* args) {
  std::string_view file = args->file != nullptr ? args->file : "";
  // The file name as gRPC's own logger shows it: its build paths say nothing to an operator.
  if (const size_t slash = file.rfind('/'); slash != std::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  Log(LevelOf(args->severity), args->message != nullptr ? args->message : "",
      {{"source", absl::StrCat(std::string(file), ":", args->line)}, {"component", "grpc"}});
}

}  // namespace

void RouteGrpcLogsToServerLog() { gpr_set_log_function(&WriteGrpcLine); }

}  // namespace tost::service
