#include "service/api/generation_request.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tost::service {

tost::v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return tost::v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return tost::v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return tost::v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
      return tost::v1::FINISH_REASON_CANCELLED;
    case FinishReason::kContext:
      return tost::v1::FINISH_REASON_CONTEXT;
    case FinishReason::kDrained:
      return tost::v1::FINISH_REASON_DRAINED;
  }
  return tost::v1::FINISH_REASON_UNSPECIFIED;
}

model::SamplingParams SamplingFromProto(const tost::v1::SamplingParams& p) {
  model::SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0.f ? 1.f : p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() == 0.f ? 1.f : p.repetition_penalty();
  s.repetition_window = p.repetition_window() == 0 ? 64 : p.repetition_window();
  s.seed = p.seed();
  return s;
}

absl::Status ApplyStop(const tost::v1::StopConditions& stop, GenerationState& st) {
  // Counts only, before copying: the limits themselves are GenerationScheduler::CheckState's.
  if (static_cast<size_t>(stop.stop_size()) > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most ", kMaxStopStrings, " strings, got ", stop.stop_size()));
  }
  if (static_cast<size_t>(stop.stop_token_ids_size()) > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: at most ", kMaxStopTokenIds,
                                                   " ids, got ", stop.stop_token_ids_size()));
  }
  st.stop_strings.assign(stop.stop().begin(), stop.stop().end());
  st.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const tost::v1::GenerateRequest& req,
                                                  const model::Tokenizer& tokenizer,
                                                  const ServiceLimits& limits) {
  if (req.has_prompt_tokens()) {
    if (req.prompt_tokens().ids_size() > limits.max_prompt_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_tokens holds ", req.prompt_tokens().ids_size(),
                       " ids, more than the limit of ", limits.max_prompt_bytes));
    }
    return std::vector<int32_t>(req.prompt_tokens().ids().begin(), req.prompt_tokens().ids().end());
  }
  if (static_cast<int64_t>(req.prompt_bytes().size()) > limits.max_prompt_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_bytes holds ", req.prompt_bytes().size(),
                                                   " bytes, more than the limit of ",
                                                   limits.max_prompt_bytes));
  }
  if (!req.prompt_bytes().empty() && !tokenizer.encodes_text()) {
    return absl::FailedPreconditionError(
        "prompt_bytes: this model has no text tokenizer (config.json tokenizer.type \"none\"): "
        "send the prompt as prompt_tokens");
  }
  return tokenizer.Encode(req.prompt_bytes());
}

void FillSessionInfo(const std::string& id, const GenerationState& st,
                     tost::v1::SessionInfo* info) {
  info->set_session_id(id);
  info->set_model(st.model);
  info->set_position(st.sequence.position + (st.pending_token >= 0 ? 1 : 0));
  info->set_state_bytes(static_cast<int64_t>(st.ByteSize()));
}

}  // namespace tost::service
