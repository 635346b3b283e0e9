// Token sampling: greedy, temperature, top-k, top-p, with a counter-based random stream.
//
// The random number for a draw is a pure function of (seed, position): no hidden generator state,
// so a sequence resumed from its exported state, or replayed on another replica, draws exactly the
// same numbers.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tost::model {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = disabled
  float top_p = 1.0f;        // nucleus mass in (0, 1]; 1 = disabled
  uint64_t seed = 0;
};

// Validates ranges; errors name the field.
absl::Status ValidateSamplingParams(const SamplingParams& p);

// A uniform double in [0, 1) determined by (seed, counter): SplitMix64 over a mixed key.
double CounterUniform(uint64_t seed, uint64_t counter);

// Picks a token from `logits` for the draw at `position`. Ties in greedy mode go to the lowest id.
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& p, uint64_t position);

}  // namespace tost::model
