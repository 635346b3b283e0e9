// Turning tost.v1 generation messages into engine requests and back: sampling parameters, stop
// conditions, prompts, finish reasons and session descriptions. Shared by Generate and the session
// RPCs. The checks themselves are protocol-neutral (generation_input.h): this file only converts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "model/sampling/sampler.h"
#include "model/text/tokenizer.h"
#include "service/api/request_input.h"
#include "service/engine/constraints.h"
#include "service/engine/generation_scheduler.h"
#include "service/engine/generation_state.h"
#include "service/generation/generation_input.h"
#include "tost/v1/tost.pb.h"

namespace tost::service {

tost::v1::FinishReason ToProto(FinishReason r);

// Proto defaults (0) mean "disabled" or "the default": top_p 1, repetition_penalty 1, window 64.
// Not validated here: GenerationScheduler::CheckState validates every state, whatever its source.
model::SamplingParams SamplingFromProto(const tost::v1::SamplingParams& p);

// Copies the stop conditions into `st`, refusing more strings or ids than a state may hold before
// copying them; their contents (lengths, vocabulary) are GenerationScheduler::CheckState's.
absl::Status ApplyStop(const tost::v1::StopConditions& stop, GenerationState& st);

// The request as the protocol-neutral GenerationInput, with the proto's defaults made explicit: a
// fresh generation (no session_id, no state) always gets the request's sampling parameters and
// stop conditions (proto defaults included), a continued one only those the request sets. Refuses
// more stop strings or ids than a state may hold (CheckStopCounts) before copying any; called once
// the request holds a place in the scheduler, like the rest of BuildGenerationRequest's checks.
absl::StatusOr<GenerationInput> GenerationInputFromProto(const tost::v1::GenerateRequest& req);

// The request's constraint (GenerateRequest.constraint) as the one constraint type:
// INVALID_ARGUMENT naming the field when no kind is set or json_object is false. Its contents
// are the compiler's to check (Engine::CompileConstraint).
absl::StatusOr<structured::Constraint> ConstraintFromProto(const tost::v1::Constraint& constraint);

// INVALID_ARGUMENT when `req` both sets a constraint and asks to clear the state's.
absl::Status CheckConstraintUse(const tost::v1::GenerateRequest& req);

void FillSessionInfo(const std::string& id, const GenerationState& st, tost::v1::SessionInfo* info);

}  // namespace tost::service
