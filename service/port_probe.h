// Start-up check that a TCP port is free before the server binds it.
//
// gRPC listens with SO_REUSEPORT (the loading responder and the server share the port during the
// hand-over), and the kernel lets any other process of the same user that also sets it bind the
// same port: a second tost_server would start "successfully" and take a share of the first one's
// new connections, so sessions made on one answer NOT_FOUND on the other. Binding a probe socket
// without SO_REUSEPORT fails while anything listens there, which turns that into a start-up error.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace tost::service {

// OK when every address `host` resolves to can bind `port` right now (SO_REUSEADDR only, so
// connections of an earlier process still in TIME_WAIT do not count). FAILED_PRECONDITION naming
// `flag`, the address and "in use" when something listens there; port 0 (any free port) is always
// OK. `flag` is how the port was given (e.g. "--port"), for the message.
absl::Status CheckPortFree(const std::string& host, int port, const std::string& flag);

}  // namespace tost::service
