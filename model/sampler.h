// Token sampling: greedy, temperature, top-k, top-p, min-p and a repetition penalty over a bounded
// window of recent tokens, with a counter-based random stream.
//
// The random number for a draw is a pure function of (seed, position): no hidden generator state,
// so a sequence resumed from its exported state, or replayed on another replica, draws exactly the
// same numbers.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tost::model {

// The accepted ranges (ValidateSamplingParams).
inline constexpr float kMinTemperature = 0.01f;
inline constexpr float kMaxTemperature = 100.f;
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.f;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax), else in [kMinTemperature, kMaxTemperature]
  int32_t top_k = 0;         // 0 = disabled
  float top_p = 1.0f;        // nucleus mass in (0, 1]; 1 = disabled
  float min_p = 0.0f;        // drop tokens below min_p × p(most likely); 0 = disabled
  // > 1 discourages tokens in the recent window (CTRL-style); 1 = off; in
  // [kMinRepetitionPenalty, kMaxRepetitionPenalty].
  float repetition_penalty = 1.0f;
  int32_t repetition_window = 64;  // recent tokens the penalty looks at, at most 4096
  uint64_t seed = 0;
};

// Validates ranges; errors name the field.
absl::Status ValidateSamplingParams(const SamplingParams& p);

// A uniform double in [0, 1) determined by (seed, counter): SplitMix64 over a mixed key.
double CounterUniform(uint64_t seed, uint64_t counter);

// Picks a token from `logits` for the draw at `position`. `recent` holds the tokens the repetition
// penalty applies to (the caller keeps at most repetition_window of them). Greedy ties go to the
// lowest id.
int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& p, uint64_t position,
                    absl::Span<const int32_t> recent = {});

// The n most likely tokens under log-softmax of the raw logits, most likely first.
std::vector<std::pair<int32_t, float>> TopLogprobs(absl::Span<const float> logits, int32_t n);

}  // namespace tost::model
