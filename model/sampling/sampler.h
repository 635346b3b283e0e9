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

// How one row of a batched decode step picks its token.
struct TokenDraw {
  SamplingParams params;
  uint64_t position = 0;             // the draw's counter (where the new token sits)
  absl::Span<const int32_t> recent;  // the repetition penalty's window (see SampleToken)
  int32_t top_logprobs = 0;          // alternatives to report, most likely first
  // Report the drawn token's own logprob (DrawnToken::logprob); top_logprobs > 0 implies it.
  bool logprobs = false;
  // Constrained generation: bit i of word i/32 set means id i may be drawn; ids whose bit is clear,
  // and ids past the words' 32 * size() bits, get a logit of -infinity before anything else (the
  // repetition penalty, the draw, and the logprobs, which are then those of the constrained
  // distribution: a forbidden alternative's is -infinity). Empty: unconstrained. The caller keeps
  // at least one defined id allowed (a row that allows none draws garbage).
  absl::Span<const uint32_t> allowed = {};
  // Added to the logits of their ids after `allowed` masks them (a forbidden id stays forbidden)
  // and before anything else: the repetition penalty, the draw and the logprobs, which are then
  // those of the biased distribution. Ids outside the logits are ignored; each id at most once
  // (the caller checks both). OpenAI's logit_bias; empty: none.
  absl::Span<const std::pair<int32_t, float>> logit_bias = {};

  bool wants_logprob() const { return logprobs || top_logprobs > 0; }
};

// Sets logits[i] to -infinity for every id `allowed` does not allow (TokenDraw::allowed); an empty
// `allowed` leaves the logits as they are.
void MaskDisallowed(absl::Span<const uint32_t> allowed, absl::Span<float> logits);

// Adds each (id, bias) of `bias` to logits[id] (TokenDraw::logit_bias); ids outside `logits` are
// skipped.
void ApplyLogitBias(absl::Span<const std::pair<int32_t, float>> bias, absl::Span<float> logits);

// What comes back of one row: all a step needs to leave the device.
struct DrawnToken {
  int32_t id = -1;
  // The first id below the defined vocabulary whose logit is not finite, or -1. When set, `id`
  // and `top_logprobs` mean nothing: the model overflowed.
  int64_t nonfinite_id = -1;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // log-softmax of the raw logits
  // The drawn id's log-softmax of the raw logits, normalised as top_logprobs are, when the draw
  // asked for it (TokenDraw::wants_logprob); 0 otherwise. A sampled token is often not among the
  // alternatives, so it cannot be looked up there.
  float logprob = 0.f;
};

// Draws row b's token from logits [draws.size(), vocab] row-major. Ids at or past
// `defined_vocab` (a vocabulary padded for the hardware) are never drawn nor offered as
// alternatives. The reference for the batched draw on a model's device (device_sampler.h).
std::vector<DrawnToken> DrawTokens(absl::Span<const float> logits, int64_t defined_vocab,
                                   absl::Span<const TokenDraw> draws);

// Prompt scoring (OpenAI's echo with logprobs): for each i in [1, tokens.size()), how likely
// tokens[i] was after the tokens before it, read from row i - 1 of `logits` ([tokens.size(), vocab]
// row-major, one forward over the whole prompt). Entry i - 1: id tokens[i], its log-softmax over
// the ids below `defined_vocab` (as DrawnToken::logprob), the top_n most likely of those ids, and
// nonfinite_id as DrawTokens reports it. A token at or past defined_vocab gets -infinity.
std::vector<DrawnToken> ScoreTokens(absl::Span<const float> logits, int64_t defined_vocab,
                                    absl::Span<const int32_t> tokens, int32_t top_n);

}  // namespace tost::model
