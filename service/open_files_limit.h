// The process's open-file limit, raised at start-up. Every connection costs the server a file
// descriptor, and the default soft limit (1,024 on many distributions, whatever the container
// runtime sets elsewhere) is reached by a few hundred clients and their proxies; gRPC 1.51 stops
// accepting for good when it is (see observability/grpc_log_bridge.h). The hard limit is what the
// operator allows, so the soft one is raised to it, as nginx's worker_rlimit_nofile and Go's
// runtime do.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace tost::service {

struct OpenFilesLimit {
  uint64_t soft_before = 0;  // the soft limit the process started with
  uint64_t soft = 0;         // the soft limit now
  uint64_t hard = 0;         // the hard limit (unlimited reads as kUnlimitedOpenFiles' cap)
};

// An unlimited hard limit cannot be a soft RLIMIT_NOFILE (the kernel caps it at fs.nr_open): the
// soft limit goes to this, Linux's default fs.nr_open.
inline constexpr uint64_t kUnlimitedOpenFilesCap = uint64_t{1} << 20;

// Raises the soft RLIMIT_NOFILE to the hard limit. An error names the limits it tried.
absl::StatusOr<OpenFilesLimit> RaiseOpenFilesLimit();

}  // namespace tost::service
