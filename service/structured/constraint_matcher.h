// One sequence's progress through a compiled constraint: the tokens the constraint allows next (a
// bitmask over the model's vocabulary), the tokens generated, and whether the output may or did
// end. Not thread-safe: a sequence is stepped by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include <xgrammar/xgrammar.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "service/structured/compiled_constraint.h"

namespace tost::structured {

class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled);

  // 32-bit words FillAllowed writes: ceil(model vocabulary / 32).
  int64_t bitmask_words() const { return compiled_->vocabulary->bitmask_words(); }

  // Bit i of word i/32 is set exactly when token i may come next. End-of-text is set when the
  // output may end here; padding ids past the tokenizer's vocabulary and bits past the model's
  // vocabulary never are; after the output ended nothing is. `bitmask_words` must hold
  // bitmask_words() words (a shorter span is cleared: nothing allowed); words past those are left
  // untouched.
  void FillAllowed(absl::Span<uint32_t> bitmask_words);

  // Advances past `token`. INVALID_ARGUMENT naming the token, its bytes and the position when the
  // constraint does not allow it (the matcher is unchanged), or when it is outside the model's
  // vocabulary; FAILED_PRECONDITION once the output has ended.
  absl::Status Accept(int32_t token);

  // Whether end-of-text would be accepted now: the output so far is complete under the
  // constraint.
  bool CanEnd() const;
  // Whether end-of-text was accepted.
  bool Ended() const;
  // Tokens accepted since the start (or the last Replay), end-of-text included.
  int64_t tokens_accepted() const { return tokens_accepted_; }

  // Restarts from the beginning and accepts `tokens`, the output generated so far: how a sequence
  // resumed elsewhere (another replica, a restored session) rebuilds its progress. On an error
  // (Accept's, naming the position) the matcher is back at the beginning.
  absl::Status Replay(absl::Span<const int32_t> tokens);

 private:
  std::shared_ptr<const CompiledConstraint> compiled_;
  xgrammar::GrammarMatcher matcher_;
  int64_t tokens_accepted_ = 0;
};

}  // namespace tost::structured
