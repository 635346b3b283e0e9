#include "service/open_files_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tost::service {

absl::StatusOr<OpenFilesLimit> RaiseOpenFilesLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(
        absl::StrCat("reading the open-files limit (RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  OpenFilesLimit result;
  result.soft_before = limit.rlim_cur;
  result.hard = limit.rlim_max == RLIM_INFINITY ? kUnlimitedOpenFilesCap : limit.rlim_max;
  result.soft = limit.rlim_cur;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < result.hard) {
    rlimit raised = limit;
    raised.rlim_cur = result.hard;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("raising the open-files soft limit from ",
                                                        limit.rlim_cur, " to its hard limit ",
                                                        result.hard, ": ", std::strerror(errno)));
    }
    result.soft = result.hard;
  }
  return result;
}

}  // namespace tost::service
