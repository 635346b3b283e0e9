// The fixed limits on what one generation request may ask, in one place: the tost.v1 parser, the
// OpenAI parser, the generation call and the engine's scheduler all read them here, so that no two
// front ends accept different ranges by accident. Limits an operator sets (prompt bytes, new
// tokens) are flags, in ServiceLimits (service/api/request_input.h).
//
// Header only, and nothing but the model's own sampling ranges: the engine includes it without
// linking the generation layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/sampling/sampler.h"

namespace tost::service {

// Choices generated side by side for one request ("n"); each is a job holding a scheduler place.
inline constexpr int32_t kMaxChoicesPerRequest = 16;
// Alternatives reported per token (OpenAI's "top_logprobs" range, tost.v1 top_logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

// Stop conditions a state may hold (a session carries them from call to call).
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr size_t kMaxStopTokenIds = 64;

// Sampling temperature: what the sampler accepts, for every front end ...
inline constexpr float kMinSamplingTemperature = model::kMinTemperature;
inline constexpr float kMaxSamplingTemperature = model::kMaxTemperature;
// ... and the narrower range OpenAI's API documents and its clients expect to be refused past
// (400 for temperature 2.5), which the OpenAI routes keep.
inline constexpr double kOpenAiMaxTemperature = 2.0;

}  // namespace tost::service
