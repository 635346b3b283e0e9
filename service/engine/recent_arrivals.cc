#include "service/engine/recent_arrivals.h"

#include <utility>

namespace tost::service {

void RecentArrivals::Note(std::string_view tenant, int32_t priority, absl::Time at) {
  Latest& latest = by_priority_[priority];
  if (latest.last.at != absl::InfinitePast() && latest.last.tenant != tenant) {
    latest.last_of_another = std::move(latest.last);
  }
  latest.last.tenant.assign(tenant);
  latest.last.at = at;
}

namespace {

bool ArrivedSince(absl::Time at, absl::Time since) {
  return at != absl::InfinitePast() && at >= since;  // InfinitePast: no arrival
}

}  // namespace

bool RecentArrivals::PrecedingSince(std::string_view tenant, int32_t priority,
                                    absl::Time since) const {
  for (const auto& [p, latest] : by_priority_) {
    if (p > priority) break;
    if (p < priority) {
      if (ArrivedSince(latest.last.at, since)) return true;
      continue;
    }
    // The same priority: only another tenant's call. The latest arrival of a tenant other than
    // `tenant` is `last` when its tenant differs, and otherwise `last_of_another`.
    const Arrival& other = latest.last.tenant != tenant ? latest.last : latest.last_of_another;
    return ArrivedSince(other.at, since);
  }
  return false;
}

}  // namespace tost::service
