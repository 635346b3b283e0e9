// The client's gRPC deadline in the form the batcher and the scheduler take.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>

#include "absl/time/time.h"

namespace tost::service {

// absl::InfiniteFuture() when the call has no deadline (gRPC reports time_point::max()).
inline absl::Time RequestDeadline(const grpc::ServerContextBase& context) {
  return context.deadline() == std::chrono::system_clock::time_point::max()
             ? absl::InfiniteFuture()
             : absl::FromChrono(context.deadline());
}

}  // namespace tost::service
