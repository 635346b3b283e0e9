// The one place where absl::Status becomes a gRPC status. Codes map one to one (the two enums
// share their numbering). The message is passed on whole, since every message already names the
// model, session or field and what was expected; what a client is sent of it is decided where
// the call's request id is known, by the server's interceptor (observability/metrics.cc) through
// ForGrpcClient: bounded, and for INTERNAL, UNKNOWN and DATA_LOSS replaced (base/error_detail.h).
#pragma once

#include <string>
#include <string_view>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "base/error_detail.h"

namespace tost::service {

// The server detail of a status (base/error_detail.h) rides from ToGrpcStatus to the interceptor
// in the gRPC status's binary details, behind this mark; the interceptor logs it and sends the
// client no details. No other code of this server sets binary details.
inline constexpr char kServerDetailMark[] = "tost-server-detail:";

grpc::Status ToGrpcStatus(const absl::Status& status);

struct GrpcClientError {
  grpc::Status status;    // what the client is sent
  bool withheld = false;  // part of the original is not in it: log the original
  std::string detail;     // the server detail, for that log line
};
// What the client of call `request_id` is sent of `status` (ForClient's rules), and what to log.
inline GrpcClientError ForGrpcClient(const grpc::Status& status, std::string_view request_id) {
  if (status.ok()) return {status, false, ""};
  constexpr std::string_view kMark = kServerDetailMark;
  const std::string details = status.error_details();  // a copy: gRPC returns it by value
  std::string detail;
  if (std::string_view(details).substr(0, kMark.size()) == kMark)
    detail = details.substr(kMark.size());
  const absl::StatusCode code = static_cast<absl::StatusCode>(status.error_code());
  const ClientError client = ForClient(absl::Status(code, status.error_message()), request_id);
  if (!client.withheld && detail.empty()) return {status, false, ""};
  return {grpc::Status(status.error_code(), std::string(client.status.message()),
                       detail.empty() ? status.error_details() : std::string()),
          true, std::move(detail)};
}

}  // namespace tost::service
