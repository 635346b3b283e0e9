// How far a sequence has got under the constraint its output must conform to: plain data, so that
// a generation's state (generation_state.h) carries its constraint into sessions and exported blobs
// without naming the compiler (constraints.h) or XGrammar.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "service/structured/constraint.h"

namespace tost::service {

// A constraint a sequence's output is still under: its spec, and every token of the output since
// it started (drawn, or given as a later call's prompt). A sequence continued elsewhere (a session
// call, a state blob on another replica) recompiles the spec, usually a cache hit, and replays
// `output` to stand exactly where it was: XGrammar's matcher state has no portable form, and the
// output is what determines it. It is dropped once the output is complete (end-of-text accepted).
struct ConstraintProgress {
  structured::Constraint spec;
  std::vector<int32_t> output;

  size_t ByteSize() const {
    size_t n = sizeof(*this) + spec.text.size() + output.size() * sizeof(int32_t);
    for (const auto& c : spec.choices) n += sizeof(c) + c.size();
    return n;
  }
  friend bool operator==(const ConstraintProgress&, const ConstraintProgress&) = default;
};

}  // namespace tost::service
