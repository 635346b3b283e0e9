#include "service/port_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tost::service {

absl::Status CheckPortFree(const std::string& host, int port, const std::string& flag) {
  if (port == 0) return absl::OkStatus();
  // gRPC takes IPv6 literals in brackets ("[::]:8500"); the resolver wants them bare.
  absl::string_view view = host;
  if (absl::ConsumePrefix(&view, "[")) absl::ConsumeSuffix(&view, "]");
  const std::string bare(view);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          getaddrinfo(bare.empty() ? nullptr : bare.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the address \"", host, "\" to listen on: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;  // an address family this host lacks (IPv6 off): gRPC skips it too
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const int rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    const int err = errno;
    close(fd);
    if (rc != 0 && err == EADDRINUSE) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, "=", port, ": port in use on ", host,
                       " (another process, perhaps another tost_server, listens there); stop it "
                       "or choose another ",
                       flag));
    }
    if (rc != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, "=", port, ": cannot listen on ", host, ": ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

}  // namespace tost::service
