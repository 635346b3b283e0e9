#include "service/flag_ranges.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tost::service {

absl::Status CheckFlagRanges(absl::Span<const FlagRange> ranges) {
  std::string errors;
  for (const FlagRange& r : ranges) {
    if (r.value >= r.min && r.value <= r.max) continue;
    absl::StrAppend(&errors, errors.empty() ? "" : "\n", "--", r.flag, "=", r.value,
                    ": expected an integer in [", r.min, ", ", r.max, "]",
                    r.note[0] != '\0' ? absl::StrCat(" (", r.note, ")") : "");
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(errors);
}

}  // namespace tost::service
