// A generation request as every front end asks it (prompt, sampling, stops, counts), in no
// protocol's types, and the checks and conversions that make an engine job of it against the
// server's limits and the model's tokenizer. Errors name the fields through GenerationFieldNames:
// the engine's own messages name none, so each front end's caller reads the names it sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/sampling/sampler.h"
#include "service/api/request_input.h"
#include "service/engine/generation_scheduler.h"
#include "service/engine/generation_state.h"
#include "service/generation/generation_limits.h"

namespace tost::service {

struct StopInput {
  std::vector<std::string> strings;
  std::vector<int32_t> token_ids;
};

// One generation as a front end asks for it. The prompt is a view into the front end's request
// (which may be as large as the request limit; it is copied only once its size has been checked):
// the front end keeps it alive until BuildGenerationRequest returns.
struct GenerationInput {
  // The prompt: token ids when set, else `prompt_text` through the model's tokenizer.
  std::optional<absl::Span<const int32_t>> prompt_tokens;
  std::string_view prompt_text;
  // Unset: a continued state keeps its own (a fresh state gets model::SamplingParams' defaults).
  std::optional<model::SamplingParams> sampling;
  // Unset: a continued state keeps its own (a fresh state gets none).
  std::optional<StopInput> stop;
  int32_t max_new_tokens = 0;  // 0: the server's default (ServiceLimits::default_max_new_tokens)
  int32_t top_logprobs = 0;    // per token, the n most likely alternatives
  bool logprobs = false;       // each token's own logprob; top_logprobs > 0 implies it
  int32_t snapshot_every = 0;  // publish the state every k tokens (0: only at the end)
  // (token id, bias) pairs, ids distinct, added to the logits of this call's draws
  // (model::TokenDraw::logit_bias); not kept in the state. Ids must be in the model's vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// This server's bound on a prompt_cache_key (OpenAI documents none); a key is held in memory with
// the tokens of its group's last prompt.
inline constexpr size_t kMaxPromptCacheKeyChars = 256;

// How the front end's request names the fields, for error messages (tost.v1's by default).
struct GenerationFieldNames {
  std::string model = "model";
  std::string max_new_tokens = "max_new_tokens";
  std::string prompt_tokens = "prompt_tokens";
  std::string prompt_text = "prompt_bytes";
  std::string stop = "stop";
  std::string stop_token_ids = "stop_token_ids";
  std::string top_logprobs = "top_logprobs";
  std::string snapshot_every = "state_every_tokens";
  std::string logit_bias = "logit_bias";
  std::string prompt_cache_key = "prompt_cache_key";
};

// The seed of choice `index` of a request with several choices (which start from the same prompt,
// and would otherwise draw the same tokens): choice 0 keeps the request's seed.
uint64_t ChoiceSeed(uint64_t seed, int32_t index);

// INVALID_ARGUMENT when a request carries more stop strings or ids than a state may hold: checked
// on the counts alone, before a front end copies any of them.
absl::Status CheckStopCounts(size_t strings, size_t token_ids,
                             const GenerationFieldNames& names = {});

// Copies the stop conditions into `st`, refusing more strings or ids than a state may hold before
// copying them; their contents (lengths, vocabulary) are GenerationScheduler::CheckState's.
absl::Status ApplyStopInput(const StopInput& stop, GenerationState& st,
                            const GenerationFieldNames& names = {});

// The prompt as token ids, at most limits.max_prompt_bytes of either form. FAILED_PRECONDITION for
// text sent to a model without a text tokenizer.
absl::StatusOr<std::vector<int32_t>> PromptTokenIds(const GenerationInput& in,
                                                    const model::Tokenizer& tokenizer,
                                                    const ServiceLimits& limits,
                                                    const GenerationFieldNames& names = {});

// The engine job for `in`, once the front end holds a place in the scheduler (Reserve: a full
// scheduler refuses before the prompt is tokenised). `continued` is the state of a session or a
// state blob being continued; nullopt starts a fresh one. Checks, in order: the stop counts, the
// max_new_tokens range [0, limits.max_new_tokens], the top_logprobs range [0, kMaxTopLogprobs], a
// snapshot interval >= 0, the logit biases' ids within the model's vocabulary, the prompt's size,
// and a prompt that is not empty unless the state has a pending token to feed. The state's own
// contents are left to Submit (CheckState). The caller sets `persistent` and `deadline`.
absl::StatusOr<GenerationRequest> BuildGenerationRequest(const GenerationInput& in,
                                                         const GenerationScheduler& scheduler,
                                                         std::optional<GenerationState> continued,
                                                         const ServiceLimits& limits,
                                                         const GenerationFieldNames& names = {});

}  // namespace tost::service
