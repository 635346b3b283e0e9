// Everything needed to continue a generation exactly: the model's per-layer TSSA statistics and
// position, the sampler's parameters (its random stream is keyed by seed and position, so it has
// no hidden state), the repetition window, text not yet released, and the pending token.
//
// Invariant: every token of the sequence has been fed to the model except `pending_token`, which
// the next decode step feeds. Keeping the last token unfed (instead of keeping its logits) keeps
// the state a few KB whatever the vocabulary, and makes a resumed session take exactly the same
// code path (a decode step) as an uninterrupted one.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "model/sampling/sampler.h"
#include "model/state/sequence_state.h"
#include "service/engine/constraint_progress.h"
#include "service/generation/generation_limits.h"

namespace tost::service {

// What a state carries besides its fixed-size statistics is bounded by generation_limits.h's stop
// limits (GenerationScheduler::CheckState enforces them, whatever the state's source): stop
// conditions are scanned after every token on the scheduler's thread and copied into every
// snapshot.

struct GenerationState {
  std::string model;
  model::SequenceState sequence;
  int32_t pending_token = -1;  // -1: none (a fresh session before its first prompt)
  model::SamplingParams sampling;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;
  std::deque<int32_t> recent_tokens;  // at most sampling.repetition_window, oldest first
  std::string utf8_pending;           // bytes of an incomplete UTF-8 character
  std::string held_text;              // complete text withheld: it may begin a stop string
  int64_t generated_tokens = 0;       // over the session's life
  // The constraint the output is in the middle of: set from a constrained call's first token
  // until its output is complete (end-of-text accepted), and kept while a call cut it short
  // (max_new_tokens, a stop, a drain, a cancel), so that the next call, here or on another
  // replica, continues under it.
  std::optional<ConstraintProgress> constraint;

  // Bytes this state occupies (the session budget counts exactly this).
  size_t ByteSize() const {
    size_t n = sizeof(*this) + model.size() + sequence.stats.size() * sizeof(float) +
               stop_token_ids.size() * sizeof(int32_t) + recent_tokens.size() * sizeof(int32_t) +
               utf8_pending.size() + held_text.size() +
               (constraint.has_value() ? constraint->ByteSize() : 0);
    for (const auto& s : stop_strings) n += sizeof(s) + s.size();
    return n;
  }

  void Remember(int32_t token) {
    if (sampling.repetition_window <= 0) return;
    recent_tokens.push_back(token);
    while (static_cast<int32_t>(recent_tokens.size()) > sampling.repetition_window)
      recent_tokens.pop_front();
  }
};

}  // namespace tost::service
