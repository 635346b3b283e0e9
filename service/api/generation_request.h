// Turning tost.v1 generation messages into engine requests and back: sampling parameters, stop
// conditions, prompts, finish reasons and session descriptions. Shared by Generate and the session
// RPCs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "model/sampling/sampler.h"
#include "model/text/tokenizer.h"
#include "service/api/request_input.h"
#include "service/engine/generation_scheduler.h"
#include "service/engine/generation_state.h"
#include "tost/v1/tost.pb.h"

namespace tost::service {

tost::v1::FinishReason ToProto(FinishReason r);

// Proto defaults (0) mean "disabled" or "the default": top_p 1, repetition_penalty 1, window 64.
// Not validated here: GenerationScheduler::CheckState validates every state, whatever its source.
model::SamplingParams SamplingFromProto(const tost::v1::SamplingParams& p);

// Copies the stop conditions into `st`, refusing more strings or ids than a state may hold before
// copying them; their contents (lengths, vocabulary) are GenerationScheduler::CheckState's.
absl::Status ApplyStop(const tost::v1::StopConditions& stop, GenerationState& st);

// The prompt as token ids (prompt_tokens as given, prompt_bytes through the tokenizer), at most
// limits.max_prompt_bytes of either. FAILED_PRECONDITION for text sent to a model without a text
// tokenizer.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const tost::v1::GenerateRequest& req,
                                                  const model::Tokenizer& tokenizer,
                                                  const ServiceLimits& limits);

void FillSessionInfo(const std::string& id, const GenerationState& st, tost::v1::SessionInfo* info);

}  // namespace tost::service
