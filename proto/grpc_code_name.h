// A gRPC status code's canonical name ("OK", "RESOURCE_EXHAUSTED", ...): the server's metric
// labels, the CLI's messages and the load generator's error counts all spell codes this way.
#pragma once

#include <grpcpp/support/status.h>

namespace tost {

// "UNRECOGNIZED" for a value outside the 17 codes gRPC defines.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace tost
