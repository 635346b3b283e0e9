// gRPC core's own log lines (transport errors such as chttp2's "Error parsing metadata", which
// quote a client's header bytes, and GRPC_TRACE output) written by the server's Log() instead of
// gRPC's default logger: escaped like every other line, one JSON object with --log_format=json,
// and under the same lock, so they never interleave with the server's lines.
// A client's grpc-timeout "1S<newline><forged line>" then gives one line (in text; JSON alike):
//   <ts> ERROR "Error parsing metadata: ...value=1S\n<forged line>" source=hpack_parser.cc:1218
//     component=grpc
#pragma once

namespace tost::service {

// Installs the bridge (gpr_set_log_function). gRPC keeps deciding which lines are written:
// GRPC_VERBOSITY (DEBUG, INFO, ERROR or NONE; ERROR when unset, as with gRPC's own logger) and
// GRPC_TRACE work as documented by gRPC. Call once at startup, after SetLogFormat and before any
// gRPC object exists.
void RouteGrpcLogsToServerLog();

}  // namespace tost::service
