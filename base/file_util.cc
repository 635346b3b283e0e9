#include "base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tost::model {
namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "a file of unknown type";
}

absl::Status ErrnoStatus(int err, const std::string& path, const char* action,
                         const std::string& what) {
  const std::string msg = absl::StrCat(path, ": cannot ", action, " the ", what, ": ",
                                       std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ELOOP:
    case ENAMETOOLONG:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::DataLossError(msg);
  }
}

absl::Status CheckStat(const struct stat& st, const std::string& path, uint64_t max_bytes,
                       const std::string& what) {
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": expected the ", what, " to be a regular file, found ", FileTypeName(st.st_mode)));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": the ", what, " holds ", st.st_size,
                                                     " bytes, more than its limit of ", max_bytes,
                                                     " bytes"));
  }
  return absl::OkStatus();
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

uint64_t MaxWeightsFileBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return uint64_t{1} << 40;  // unknown: no tighter bound
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            const std::string& what) {
  // stat first: opening a device can itself have effects, and opening a FIFO for reading blocks
  // until a writer comes.
  struct stat named {};
  if (::stat(path.c_str(), &named) != 0) return ErrnoStatus(errno, path, "examine", what);
  if (absl::Status st = CheckStat(named, path, max_bytes, what); !st.ok()) return st;
  // O_NONBLOCK: should a FIFO take the file's place after the stat, the open returns at once and
  // the fstat below refuses it.
  int raw_fd = -1;
  do {
    raw_fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  } while (raw_fd < 0 && errno == EINTR);
  if (raw_fd < 0) return ErrnoStatus(errno, path, "open", what);
  const ScopedFd fd(raw_fd);
  struct stat opened {};
  if (::fstat(fd.get(), &opened) != 0) return ErrnoStatus(errno, path, "examine", what);
  if (absl::Status st = CheckStat(opened, path, max_bytes, what); !st.ok()) return st;
  if (opened.st_dev != named.st_dev || opened.st_ino != named.st_ino) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": the ", what, " was replaced while it was being opened"));
  }
  const auto size = static_cast<uint64_t>(opened.st_size);
  std::string out;
  try {
    out.resize(size);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": no memory for the ", size, " bytes of the ", what));
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": the ", what, "'s ", size, " bytes cannot be held in memory"));
  }
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd.get(), out.data() + got, size - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, path, "read", what);
    }
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  if (got != size) {
    return absl::DataLossError(absl::StrCat(path, ": the ", what, " ended after ", got,
                                            " bytes, but its size is ", size,
                                            " (was it truncated while being read?)"));
  }
  // One byte more must not be there: a file that grew while read, or a regular-looking file whose
  // size says nothing (those of /proc say 0), is refused rather than read in part.
  char extra = 0;
  ssize_t n = 0;
  do {
    n = ::read(fd.get(), &extra, 1);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, path, "read", what);
  if (n > 0) {
    return absl::DataLossError(absl::StrCat(path, ": the ", what, " holds more than the ", size,
                                            " bytes its size says (is it growing, or not a plain "
                                            "file on disk?)"));
  }
  return out;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error while reading ", path));
  return std::move(buffer).str();
}

}  // namespace tost::model
