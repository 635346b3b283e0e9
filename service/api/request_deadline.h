// The client's gRPC deadline in the form the batcher and the scheduler take.
#pragma once

#include <grpc/support/time.h>
#include <grpcpp/server_context.h>

#include "absl/time/time.h"

namespace tost::service {

// A gRPC deadline as an absl::Time, saturating: gpr's infinite future (no deadline) and any
// instant past absl's range become InfiniteFuture. The protocol lets a client ask for up to
// 99,999,999 hours (about 11,400 years), beyond what std::chrono::system_clock's nanoseconds hold
// (year 2262), so the context's chrono deadline() wraps such a deadline into the past; the raw
// seconds and nanoseconds do not.
absl::Time DeadlineFromTimespec(gpr_timespec deadline);

// absl::InfiniteFuture() when the call has no deadline.
inline absl::Time RequestDeadline(const grpc::ServerContextBase& context) {
  return DeadlineFromTimespec(context.raw_deadline());
}

}  // namespace tost::service
