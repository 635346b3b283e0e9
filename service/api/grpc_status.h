// The one place where absl::Status becomes a gRPC status. Codes map one to one (the two enums
// share their numbering); the message is passed through unchanged, since every message already
// names the model, session or field and what was expected.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tost::service {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tost::service
