#include "service/generation/generation_input.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"

namespace tost::service {

uint64_t ChoiceSeed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // SplitMix64's finaliser over (seed, index): well-separated streams for neighbouring seeds.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

absl::Status CheckStopCounts(size_t strings, size_t token_ids, const GenerationFieldNames& names) {
  // Counts only: the limits on the contents are GenerationScheduler::CheckState's.
  if (strings > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.stop, ": at most ", kMaxStopStrings, " strings, got ", strings));
  }
  if (token_ids > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat(names.stop_token_ids, ": at most ",
                                                   kMaxStopTokenIds, " ids, got ", token_ids));
  }
  return absl::OkStatus();
}

absl::Status ApplyStopInput(const StopInput& stop, GenerationState& st,
                            const GenerationFieldNames& names) {
  TOST_RETURN_IF_ERROR(CheckStopCounts(stop.strings.size(), stop.token_ids.size(), names));
  st.stop_strings = stop.strings;
  st.stop_token_ids = stop.token_ids;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptTokenIds(const GenerationInput& in,
                                                    const model::Tokenizer& tokenizer,
                                                    const ServiceLimits& limits,
                                                    const GenerationFieldNames& names) {
  if (in.prompt_tokens.has_value()) {
    if (static_cast<int64_t>(in.prompt_tokens->size()) > limits.max_prompt_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(names.prompt_tokens, " holds ", in.prompt_tokens->size(),
                       " ids, more than the limit of ", limits.max_prompt_bytes));
    }
    return std::vector<int32_t>(in.prompt_tokens->begin(), in.prompt_tokens->end());
  }
  if (static_cast<int64_t>(in.prompt_text.size()) > limits.max_prompt_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.prompt_text, " holds ", in.prompt_text.size(),
                     " bytes, more than the limit of ", limits.max_prompt_bytes));
  }
  if (!in.prompt_text.empty() && !tokenizer.encodes_text()) {
    return absl::FailedPreconditionError(
        absl::StrCat(names.prompt_text,
                     ": this model has no text tokenizer (config.json tokenizer.type \"none\"): "
                     "send the prompt as ",
                     names.prompt_tokens));
  }
  return tokenizer.Encode(in.prompt_text);
}

absl::StatusOr<GenerationRequest> BuildGenerationRequest(const GenerationInput& in,
                                                         const GenerationScheduler& scheduler,
                                                         std::optional<GenerationState> continued,
                                                         const ServiceLimits& limits,
                                                         const GenerationFieldNames& names) {
  const bool fresh = !continued.has_value();
  GenerationState state;
  if (fresh) {
    state = scheduler.NewState(in.sampling.value_or(model::SamplingParams{}));
  } else {
    state = *std::move(continued);
    if (in.sampling.has_value()) state.sampling = *in.sampling;
  }
  if (in.stop.has_value()) {
    TOST_RETURN_IF_ERROR(ApplyStopInput(*in.stop, state, names));
  } else if (fresh) {
    TOST_RETURN_IF_ERROR(ApplyStopInput(StopInput{}, state, names));
  }
  // 0 asks for the default, which never exceeds the server's ceiling.
  const int32_t max_new = in.max_new_tokens == 0
                              ? std::min(limits.default_max_new_tokens, limits.max_new_tokens)
                              : in.max_new_tokens;
  if (max_new < 0 || max_new > limits.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(names.max_new_tokens, " must be in [0, ",
                                                   limits.max_new_tokens, "], got ", max_new));
  }
  if (in.top_logprobs < 0 || in.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(names.top_logprobs, " must be in [0, ",
                                                   kMaxTopLogprobs, "], got ", in.top_logprobs));
  }
  if (in.snapshot_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.snapshot_every, " must be >= 0, got ", in.snapshot_every));
  }
  const int64_t vocab = scheduler.model().config().language.vocab_size;
  for (const auto& [id, bias] : in.logit_bias) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          names.logit_bias, ": expected token ids of model ", QuoteClientText(state.model),
          "'s vocabulary (0 to ", vocab - 1, "), got ", id));
    }
  }
  GenerationRequest request;
  TOST_ASSIGN_OR_RETURN(request.prompt,
                        PromptTokenIds(in, scheduler.model().tokenizer(), limits, names));
  if (request.prompt.empty() && state.pending_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt is empty: send ", names.prompt_text, " or ", names.prompt_tokens));
  }
  request.state = std::move(state);
  request.max_new_tokens = max_new;
  request.top_logprobs = in.top_logprobs;
  request.logprobs = in.logprobs;
  request.snapshot_every = in.snapshot_every;
  request.logit_bias = in.logit_bias;
  return request;
}

}  // namespace tost::service
