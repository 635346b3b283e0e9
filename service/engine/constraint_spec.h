// What a request asks its output to conform to, and how far a sequence has got under it: plain
// data, so that a generation's state (generation_state.h) can carry its constraint into sessions
// and exported blobs without naming the compiler (constraints.h) or XGrammar.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tost::service {

// A constraint as the request gave it (structured::Constraint, without its header).
struct ConstraintSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kGrammar, kChoice };
  Kind kind = Kind::kJsonObject;
  std::string text;                  // the schema, the regex or the grammar
  std::vector<std::string> choices;  // kChoice

  friend bool operator==(const ConstraintSpec&, const ConstraintSpec&) = default;
};

// A constraint a sequence's output is still under: its spec, and every token of the output since
// it started (drawn, or given as a later call's prompt). A sequence continued elsewhere (a session
// call, a state blob on another replica) recompiles the spec, usually a cache hit, and replays
// `output` to stand exactly where it was: XGrammar's matcher state has no portable form, and the
// output is what determines it. It is dropped once the output is complete (end-of-text accepted).
struct ConstraintProgress {
  ConstraintSpec spec;
  std::vector<int32_t> output;

  size_t ByteSize() const {
    size_t n = sizeof(*this) + spec.text.size() + output.size() * sizeof(int32_t);
    for (const auto& c : spec.choices) n += sizeof(c) + c.size();
    return n;
  }
  friend bool operator==(const ConstraintProgress&, const ConstraintProgress&) = default;
};

}  // namespace tost::service
