// Whether a file of mode 000 denies this process: it does an ordinary user and root without
// CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, not root with them (CI runs as root). The cases that
// need the denial skip where it is not, saying so; ctest unprivileged_permission_tests runs them
// with both capabilities dropped (scripts/run-unprivileged.sh) and fails if they skip there.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>

namespace tost::testing {

inline bool ModeZeroDeniesThisProcess() {
  std::string path = (std::filesystem::temp_directory_path() / "tost_mode_zero_XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return false;
  ::fchmod(fd, 0);
  ::close(fd);
  const int again = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const bool denied = again < 0 && errno == EACCES;
  if (again >= 0) ::close(again);
  ::unlink(path.c_str());
  return denied;
}

inline constexpr char kModeZeroSkip[] =
    "mode 000 does not deny this process (root with CAP_DAC_OVERRIDE); ctest "
    "unprivileged_permission_tests runs this case without it";

}  // namespace tost::testing
