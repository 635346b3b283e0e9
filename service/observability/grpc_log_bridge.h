// gRPC core's own log lines (transport errors such as chttp2's "Error parsing metadata", which
// quote a client's header bytes, and GRPC_TRACE output) written by the server's Log() instead of
// gRPC's default logger: escaped like every other line, one JSON object with --log_format=json,
// and under the same lock, so they never interleave with the server's lines.
// A client's grpc-timeout "1S<newline><forged line>" then gives one line (in text; JSON alike):
//   <ts> ERROR "Error parsing metadata: ...value=1S\n<forged line>" source=hpack_parser.cc:1218
//     component=grpc
#pragma once

#include <string_view>

namespace tost::service {

// Installs the bridge (gpr_set_log_function). gRPC keeps deciding which lines are written:
// GRPC_VERBOSITY (DEBUG, INFO, ERROR or NONE; ERROR when unset, as with gRPC's own logger) and
// GRPC_TRACE work as documented by gRPC. Call once at startup, after SetLogFormat and before any
// gRPC object exists.
void RouteGrpcLogsToServerLog();

// gRPC 1.51's TCP listener stops for good after one accept() error other than EAGAIN or
// ECONNABORTED (tcp_server_posix.cc logs "Failed accept4: <reason>" and never re-arms the listening
// socket; later releases retry on EMFILE, earlier ones behaved alike). Running out of file
// descriptors once, in a connection flood, left a replica that answered its open connections and
// nothing else: readiness cannot say so (a probe cannot connect), and compose does not restart an
// unhealthy container. True for exactly that line (an ERROR: seen at every GRPC_VERBOSITY but
// NONE).
bool IsListenerFailureLine(std::string_view file, std::string_view message);

// Called once, on gRPC's thread, the first time IsListenerFailureLine() sees its line, with the
// line's message (the accept() error). The server drains and exits so that its supervisor starts a
// replacement. Must be async-signal-light: record the reason and wake another thread. Set before
// the gRPC server starts; nullptr removes it.
using ListenerFailureHandler = void (*)(std::string_view message);
void SetListenerFailureHandler(ListenerFailureHandler handler);

}  // namespace tost::service
