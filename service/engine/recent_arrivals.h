// Who has called a scheduler lately, to tell whether a running prefill should give way. A job's
// prompt is fed in whole chunks while nobody it must not delay is around; once a call that would
// go before it (another tenant's at the same priority, or any more urgent one) has arrived within
// a window, its prefill is fed in short pieces, so that the next such call waits for one piece and
// not for a chunk. Calls that arrive one at a time (an interactive tenant beside a batch one) are
// seen between their requests this way, when none of them is in the scheduler.
//
// Memory: two entries per priority value seen (the front ends bound priorities by a flag), not
// one per tenant.
//
// Thread-safety: none; the scheduler guards it with its lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/time/time.h"

namespace tost::service {

class RecentArrivals {
 public:
  // A call of `tenant` at `priority` arrived at `at` (arrivals come in time order).
  void Note(std::string_view tenant, int32_t priority, absl::Time at);
  // Whether a call that goes before a job of (`tenant`, `priority`) arrived at or after `since`:
  // one at a lower priority value, or another tenant's at the same one.
  bool PrecedingSince(std::string_view tenant, int32_t priority, absl::Time since) const;

 private:
  struct Arrival {
    std::string tenant;
    absl::Time at = absl::InfinitePast();
  };
  // Per priority value: the latest arrival, and the latest of a tenant other than its tenant.
  struct Latest {
    Arrival last;
    Arrival last_of_another;
  };
  std::map<int32_t, Latest> by_priority_;
};

}  // namespace tost::service
