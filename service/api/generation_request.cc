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
    case FinishReason::kConstraint:
      return tost::v1::FINISH_REASON_CONSTRAINT;
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
  TOST_RETURN_IF_ERROR(CheckStopCounts(stop.stop_size(), stop.stop_token_ids_size()));
  st.stop_strings.assign(stop.stop().begin(), stop.stop().end());
  st.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  return absl::OkStatus();
}

absl::StatusOr<GenerationInput> GenerationInputFromProto(const tost::v1::GenerateRequest& req) {
  GenerationInput in;
  const bool fresh = req.session_id().empty() && req.state().empty();
  if (fresh || req.has_stop()) {
    // Counted before copying, so that a request with a million stop strings copies none of them.
    TOST_RETURN_IF_ERROR(CheckStopCounts(req.stop().stop_size(), req.stop().stop_token_ids_size()));
    in.stop.emplace();
    in.stop->strings.assign(req.stop().stop().begin(), req.stop().stop().end());
    in.stop->token_ids.assign(req.stop().stop_token_ids().begin(),
                              req.stop().stop_token_ids().end());
  }
  if (req.has_prompt_tokens()) {
    in.prompt_tokens = absl::MakeConstSpan(req.prompt_tokens().ids().data(),
                                           static_cast<size_t>(req.prompt_tokens().ids_size()));
  } else {
    in.prompt_text = req.prompt_bytes();
  }
  if (fresh || req.has_sampling()) in.sampling = SamplingFromProto(req.sampling());
  in.max_new_tokens = req.max_new_tokens();
  in.top_logprobs = req.top_logprobs();
  in.logprobs = req.logprobs();
  in.snapshot_every = req.state_every_tokens();
  return in;
}

absl::StatusOr<structured::Constraint> ConstraintFromProto(const tost::v1::Constraint& constraint) {
  structured::Constraint spec;
  switch (constraint.kind_case()) {
    case tost::v1::Constraint::kJsonSchema:
      spec.kind = structured::Constraint::Kind::kJsonSchema;
      spec.text = constraint.json_schema();
      break;
    case tost::v1::Constraint::kJsonObject:
      if (!constraint.json_object()) {
        return absl::InvalidArgumentError(
            "constraint.json_object: expected true (any JSON object), got false; leave "
            "`constraint` unset for unconstrained output");
      }
      spec.kind = structured::Constraint::Kind::kJsonObject;
      break;
    case tost::v1::Constraint::kRegex:
      spec.kind = structured::Constraint::Kind::kRegex;
      spec.text = constraint.regex();
      break;
    case tost::v1::Constraint::kGrammar:
      spec.kind = structured::Constraint::Kind::kGrammar;
      spec.text = constraint.grammar();
      break;
    case tost::v1::Constraint::kChoice:
      spec.kind = structured::Constraint::Kind::kChoice;
      spec.choices.assign(constraint.choice().choices().begin(),
                          constraint.choice().choices().end());
      break;
    case tost::v1::Constraint::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "constraint: expected one of json_schema, json_object, regex, grammar or choice, got "
          "none");
  }
  return spec;
}

absl::Status CheckConstraintUse(const tost::v1::GenerateRequest& req) {
  if (req.has_constraint() && req.clear_constraint()) {
    return absl::InvalidArgumentError(
        "clear_constraint: expected false with `constraint` set (a new constraint already "
        "replaces the state's), got true");
  }
  return absl::OkStatus();
}

void FillSessionInfo(const std::string& id, const GenerationState& st,
                     tost::v1::SessionInfo* info) {
  info->set_session_id(id);
  info->set_model(st.model);
  info->set_position(st.sequence.position + (st.pending_token >= 0 ? 1 : 0));
  info->set_state_bytes(static_cast<int64_t>(st.ByteSize()));
  info->set_constraint_pending(st.constraint.has_value());
}

}  // namespace tost::service
