// The request bodies of the OpenAI-compatible API, POST /v1/completions and
// POST /v1/chat/completions, parsed and validated into OpenAiRequest, and OpenAiRequest turned into
// the protocol-neutral GenerationInput that BuildGenerationRequest
// (service/generation/generation_input.h) makes an engine job of. Pure: no HTTP, no gRPC, no
// LibTorch; fuzzed (tests/fuzz).
//
// Every refusal is INVALID_ARGUMENT whose message starts with the field's path ("stop[2]",
// "messages[1].content[0].type"), says what was expected and what came, and carries the path as
// the error body's "param" (error.h). Every field of OpenAI's request schemas is either honoured
// or, when it asks for what this server cannot do, refused by name (docs/api.md lists them; the
// integration test test_openai_fields.py walks the openai package's schemas against that list);
// fields outside those schemas and vLLM's extensions read here are ignored, as OpenAI's servers
// ignore them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "service/generation/generation_input.h"
#include "service/generation/generation_limits.h"
#include "service/openai/chat_template.h"
#include "service/openai/client_identifiers.h"
#include "service/openai/json_fields.h"
#include "service/structured/constraint.h"

namespace tost::service::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// OpenAI's limit on "stop"; the other limits are every front end's (generation_limits.h).
inline constexpr int32_t kMaxStop = 4;
// Functions a chat request may offer (OpenAI allows 128).
inline constexpr size_t kMaxTools = 128;

// Whether and how the reply calls the request's tools: "none" (never; the default without tools),
// "auto" (the model answers in text or calls; the default with tools), "required" (at least one
// call), or a named function (a call of it). Required and named calls are constrained by the
// functions' JSON schemas (ToolCallSchema).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// OpenAI's limits on logit_bias: at most 300 ids, each bias in [-100, 100].
inline constexpr size_t kMaxLogitBias = 300;
inline constexpr double kMaxLogitBiasValue = 100.0;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // /v1/completions: the prompt as text or as token ids (exactly one is set).
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_tokens;
  // /v1/chat/completions: the messages, rendered by the model's chat template.
  std::vector<ChatMessage> messages;
  // The chat's tools (at most kMaxTools), how they are to be called, and whether a reply may hold
  // several calls (parallel_tool_calls; false: at most one).
  std::vector<ToolFunction> tools;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed: the function
  bool parallel_tool_calls = true;
  // /v1/completions' echo: the reply starts with the prompt, its tokens with their logprobs when
  // logprobs are asked for (the first token's null). Not with session_id or state (the prompt's
  // context would be the state's).
  bool echo = false;
  // max_tokens or max_completion_tokens, >= 1 (0 with echo: the prompt scored, nothing generated);
  // unset: the server's default.
  std::optional<int32_t> max_tokens;
  std::string max_tokens_field = "max_tokens";  // which of the two the request used
  std::optional<float> temperature;             // unset: 1, OpenAI's default
  std::optional<float> top_p;                   // unset: 1
  // vLLM's sampling extensions. top_k: unset, 0 or -1: off; min_p in [0, 1); repetition_penalty
  // in [model::kMinRepetitionPenalty, model::kMaxRepetitionPenalty] (1: off).
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs, ids distinct and sorted, at most
  // kMaxLogitBias; ids are checked against the model's vocabulary when the call is built.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Unset: the HTTP routes draw a random one (unseeded requests vary, as OpenAI's do);
  // ToGenerationInput alone uses 0.
  std::optional<uint64_t> seed;
  // At most kMaxStop, each 1..kMaxStopStringBytes bytes; unset when the request has no "stop" (null
  // included), so that a continued generation keeps its state's.
  std::optional<std::vector<std::string>> stop;
  // vLLM's stop_token_ids: generation ends after one of them (the token is part of the output).
  // Unset when absent or null, as "stop".
  std::optional<std::vector<int32_t>> stop_token_ids;
  // Alternatives per token to report: completions "logprobs", chat "top_logprobs" (with
  // "logprobs": true). Unset: no logprobs at all; 0: the chosen tokens' only.
  std::optional<int32_t> logprobs;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // ToST extensions: continue a server-held session, or a state blob (decoded from base64);
  // return_state asks for each choice's final state as base64.
  std::string session_id;
  std::optional<std::string> state;
  bool return_state = false;
  int32_t priority = 0;  // vLLM's: lower runs sooner (the engine bounds it)
  // user, safety_identifier (to the access log) and prompt_cache_key (client_identifiers.h).
  ClientIdentifiers identifiers;
  // What the output must conform to: response_format {"type": "json_object"} or {"type":
  // "json_schema", ...}, or one of vLLM's guided_json, guided_regex, guided_grammar and
  // guided_choice (at most one source per request). Unset: unconstrained. Its shape is checked
  // here; the schema, regex or grammar itself is the engine's compiler's to judge
  // (Engine::CompileConstraint), whose errors the routes report under `constraint_field`.
  std::optional<structured::Constraint> constraint;
  // The field the constraint came from, as errors name it: "response_format",
  // "response_format.json_schema.schema", "guided_json", "guided_regex", "guided_grammar" or
  // "guided_choice". Empty without a constraint.
  std::string constraint_field;
};

// Parses a request body. The body must be valid UTF-8 (refused with its byte offset) and JSON.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, std::string_view body);
inline absl::StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body) {
  return ParseOpenAiRequest(Endpoint::kCompletions, body);
}
inline absl::StatusOr<OpenAiRequest> ParseChatCompletionRequest(std::string_view body) {
  return ParseOpenAiRequest(Endpoint::kChatCompletions, body);
}

// The JSON schema a required or named tool call's output must satisfy: a JSON array of
// {"name": <a function's name>, "arguments": <valid under its parameters>} (one for a named
// function or with parallel_tool_calls false), each function's schema moved under "$defs" with its
// own "$ref"s rebased there, so a recursive schema stays recursive in itself.
std::string ToolCallSchema(const OpenAiRequest& request);

// Each function ToolCallSchema calls, as the field naming its parameters
// ("tools[i].function.parameters") and those parameters alone as a JSON-schema constraint: what a
// refusal of the whole call schema is narrowed down with.
std::vector<std::pair<std::string, structured::Constraint>> ToolParameterConstraints(
    const OpenAiRequest& request);

// Whether the request sets a sampling parameter (temperature, top_p, seed, top_k, min_p,
// repetition_penalty): a continued generation then takes the request's, with defaults for the rest.
bool SetsSampling(const OpenAiRequest& request);

// How BuildGenerationRequest's errors name this request's fields.
GenerationFieldNames FieldNames(const OpenAiRequest& request);

// The request as a GenerationInput for `config`'s model: the chat rendered through its template
// (its stop strings first), the sampling parameters with OpenAI's defaults, the stop strings. The
// input's prompt is a view into `request` or, for a chat, into `*prompt_storage`, which holds the
// rendered prompt: both must outlive the input. A continued generation (session_id or state) keeps
// its state's sampling parameters unless the request sets one (SetsSampling; then the others take
// their defaults), and its stop strings unless the request sets "stop" (a chat
// always sets its template's, except under a constraint: the constraint ends the reply, and the
// template's stop strings, such as a closing quote, could cut a JSON output short, so a
// constrained chat stops on the request's own "stop" alone). A continued chat renders only the
// messages it sends: the earlier turns are in the state already. Logprobs ask the engine for each
// token's own and for exactly the alternatives the request shows.
absl::StatusOr<GenerationInput> ToGenerationInput(const OpenAiRequest& request,
                                                  const model::ModelConfig& config,
                                                  std::string* prompt_storage);

// vLLM's tokenizer routes, which evaluation harnesses (lm-evaluation-harness's remote tokenizer)
// tokenize through: POST /tokenize {"model"?, "prompt", "add_special_tokens"?} and POST /detokenize
// {"model"?, "tokens"}. An empty model names the server's only language model. This server's
// tokenizers add no special tokens, so add_special_tokens changes nothing and is only type-checked.
struct TokenizeRequest {
  std::string model;
  std::string prompt;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body);

}  // namespace tost::service::openai
