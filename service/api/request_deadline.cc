#include "service/api/request_deadline.h"

namespace tost::service {

absl::Time DeadlineFromTimespec(gpr_timespec deadline) {
  if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0)
    return absl::InfiniteFuture();
  // The context reports wall-clock deadlines; converting keeps this right for any clock gRPC
  // hands out (the conversion saturates at the infinite future rather than wrapping).
  if (deadline.clock_type != GPR_CLOCK_REALTIME)
    deadline = gpr_convert_clock_type(deadline, GPR_CLOCK_REALTIME);
  if (gpr_time_cmp(deadline, gpr_inf_future(GPR_CLOCK_REALTIME)) == 0)
    return absl::InfiniteFuture();
  // absl::Time spans far more than any int64 count of seconds, so this cannot wrap.
  return absl::FromUnixSeconds(deadline.tv_sec) + absl::Nanoseconds(deadline.tv_nsec);
}

}  // namespace tost::service
