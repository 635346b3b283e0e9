// Start-up range checks of tost_server's numeric flags, named as the operator typed them.
//
// Each option also has a validator where it is used (the scheduler, the batcher, the session
// store), but those name their own fields ("max_active_jobs") and only check what their code needs;
// a flag that is in range for its consumer can still make every request of its kind fail (a
// negative --max_prompt_bytes refuses every prompt). The flag layer states each flag's accepted
// range once and refuses the start with the flag's name, its value and that range.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tost::service {

struct FlagRange {
  const char* flag;  // without the dashes: "max_new_tokens"
  int64_t value;
  int64_t min;
  int64_t max;
  // What the edge values mean, when one is special ("0 = never"); empty for none.
  const char* note = "";
};

// OK when every value lies in its [min, max]; otherwise INVALID_ARGUMENT listing every flag out of
// range, one per line: "--max_new_tokens=-1: expected an integer in [1, 1048576]".
absl::Status CheckFlagRanges(absl::Span<const FlagRange> ranges);

// A flag that was renamed, with both names still accepted: deployments written for the old name
// keep starting, and the operator is told the new one.
struct RenamedFlag {
  const char* flag;  // the current name, without the dashes
  int64_t value;
  bool given;  // on the command line
  const char* old_flag;
  int64_t old_value;
  bool old_given;
};

struct ResolvedFlag {
  int64_t value;
  std::string warning;  // non-empty when the old name was used: what to write instead
};

// The current name's value, or the old name's when only that one was given; INVALID_ARGUMENT when
// both were given with different values (which one the operator meant is unknowable).
absl::StatusOr<ResolvedFlag> ResolveRenamedFlag(const RenamedFlag& flag);

}  // namespace tost::service
