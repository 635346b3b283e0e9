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

absl::StatusOr<ResolvedFlag> ResolveRenamedFlag(const RenamedFlag& f) {
  if (!f.old_given) return ResolvedFlag{f.value, ""};
  if (f.given && f.value != f.old_value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", f.old_flag, "=", f.old_value, " and --", f.flag, "=", f.value, " disagree: --",
        f.old_flag, " is the old name of --", f.flag, "; give only --", f.flag));
  }
  return ResolvedFlag{
      f.old_value,
      absl::StrCat("--", f.old_flag, " is deprecated: it is the old name of --", f.flag,
                   " (same meaning); write --", f.flag, "=", f.old_value, " instead")};
}

}  // namespace tost::service
