// The response side of the OpenAI-compatible API: the JSON of non-streamed completions and chat
// completions, the server-sent-event chunks of streamed ones, and GET /v1/models, all built from
// the engine's GenerationEvents. Pure: no HTTP, no gRPC, no LibTorch.
//
// How a front end drives it, per request (choices 0..n-1 are one engine job each):
//   - each kToken event of choice i: AddToken(i, event.token) (non-streamed) or
//     Token(i, event.token), whose chunks it writes as they come (streamed);
//   - each choice's kFinished event: Finish(i, event, state_blob), where state_blob is the encoded
//     final state (SessionCodec::Encode) when the request set return_state, else empty. A failed or
//     cancelled job returns its status instead: the front end answers with OpenAiErrorBody (or, in
//     a stream already begun, writes ErrorEvent) and stops;
//   - at the end: Body() (non-streamed), or End() (streamed: the usage chunk when asked, then
//     "data: [DONE]").
// Every text this writes is valid UTF-8: generated text comes from the engine's TextStream
// (service/engine/text_stream.h), which releases complete characters only, and the bytes of a
// token that splits a character are written with \xNN escapes in the logprobs' "token" strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "model/text/tokenizer.h"
#include "service/engine/engine.h"
#include "service/engine/generation_scheduler.h"
#include "service/openai/request.h"
#include "service/openai/tool_call_stream.h"

namespace tost::service::openai {

// What every response and chunk of one request repeats.
struct ResponseMeta {
  std::string id;       // ResponseId(...)
  int64_t created = 0;  // Unix seconds
  std::string model;    // the model that served it
};

// "cmpl-<unique>" or "chatcmpl-<unique>", as OpenAI's ids look.
std::string ResponseId(Endpoint endpoint, std::string_view unique);

// OpenAI's finish_reason: "stop" (a stop string or id, end of text, or a constraint that admitted
// no further token, as vLLM reports it), "length" (max_tokens or the context window; a constrained
// output is then incomplete), and "drained" (a ToST value: the server shut down mid-generation;
// return_state or the session holds the state to resume from). "cancelled" is never written: Finish
// refuses.
const char* FinishReasonString(FinishReason reason);

// A completion's echoed prompt (echo: true): its text, and when the request asks for logprobs
// each of its tokens as a TokenEvent (bytes, logprob and top_logprobs; the first token has neither,
// as OpenAI's legacy completions showed it: null).
struct EchoedPrompt {
  std::string text;
  std::vector<TokenEvent> tokens;
};

class ResponseBuilder {
 public:
  // `request` and `tokenizer` (the model's, for the alternatives' bytes) outlive the builder.
  ResponseBuilder(const OpenAiRequest& request, ResponseMeta meta,
                  const model::Tokenizer& tokenizer);
  ~ResponseBuilder();

  // A chat that offers tools (tool_choice not "none"): the model's call marker
  // (chat_template.tools.call_begin), which must be set before any token. The reply's calls are
  // then parsed out of its text (ParseToolCalls) into message.tool_calls with finish_reason
  // "tool_calls"; streamed, they go out in OpenAI's deltas as they are generated (ToolCallStream:
  // the content before the marker, each call's id and name, then its arguments in fragments),
  // without per-token logprobs.
  void set_call_begin(std::string call_begin) { call_begin_ = std::move(call_begin); }

  // Prompt tokens the engine found cached (prompt_tokens_details.cached_tokens); 0 by default.
  void set_cached_tokens(int64_t n) { cached_tokens_ = n; }

  // echo: every choice starts with the prompt. Call once, before any token. Non-streamed: the
  // prompt is recorded in each choice; streamed: the returned chunks (one per choice) carry it.
  std::string Echo(const EchoedPrompt& prompt);

  // Non-streamed: record, then Body() once every choice finished.
  void AddToken(int32_t index, const TokenEvent& token);
  absl::Status Finish(int32_t index, const GenerationEvent& finished,
                      std::string_view state_blob = {});
  std::string Body() const;

  // Streamed: each returns the SSE bytes to write ("" when there is nothing to send yet). A chat
  // choice's first chunk carries delta.role "assistant".
  std::string Token(int32_t index, const TokenEvent& token);
  absl::StatusOr<std::string> FinishChunk(int32_t index, const GenerationEvent& finished,
                                          std::string_view state_blob = {});
  std::string End() const;

 private:
  struct Choice;
  Choice& At(int32_t index);
  nlohmann::json Envelope(const char* object) const;
  nlohmann::json Usage() const;
  nlohmann::json TokenLogprobs(Choice& c, const TokenEvent& token) const;
  nlohmann::json ChoiceLogprobs(const Choice& c) const;

  bool ToolMode() const;
  std::string CallId(int32_t index, size_t k) const;
  void ParseCalls(int32_t index, Choice& c) const;
  ToolCallStream& Calls(Choice& c) const;
  nlohmann::json ToolChunk(int32_t index, nlohmann::json delta, nlohmann::json finish_reason) const;
  std::string ToolDeltaChunks(int32_t index, Choice& c, const std::vector<ToolCallDelta>& deltas);
  absl::StatusOr<std::string> ToolFinishChunks(int32_t index, const GenerationEvent& finished,
                                               std::string_view state_blob);

  const OpenAiRequest& request_;
  std::string call_begin_;
  const ResponseMeta meta_;
  const model::Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
  int64_t cached_tokens_ = 0;
};

// "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& data);
// An error in a stream already begun: "data: {"error": {...}}\n\n" (OpenAiErrorBody's shape).
std::string ErrorEvent(const absl::Status& status, std::string_view param = "");
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created": 0,
// "owned_by": "tost-serve", "tost": {"version", "context_length", "chat"}}]}, the served language
// models only: every model listed can serve /v1/completions (and /v1/chat/completions when "chat"
// is true). Classifiers are the tost.v1 and KServe APIs' and would only fail here.
std::string ModelsListBody(const std::vector<ModelEntry>& models);

// The calls in a chat reply, read as a stream reads them (ToolCallStream): for a required or named
// tool_choice the whole text is the constrained JSON array of {"name", "arguments"}; for "auto"
// they follow `call_begin` (the text before it is the content), as an array or one object. The
// calls are those complete before anything that does not read as one (a name the request did not
// offer, arguments that are not JSON, a cut by max_tokens); with none, the whole text is content.
// Each call's arguments come back as the model wrote them without the whitespace between JSON
// tokens.
struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls ParseToolCalls(const OpenAiRequest& request, std::string_view call_begin,
                               std::string_view text);

// GET /v1/models/{id}: the one model's object, as ModelsListBody lists it; nullopt when `name` is
// not a served language model.
std::optional<std::string> ModelBody(const std::vector<ModelEntry>& models,
                                     const std::string& name);

// vLLM's tokenizer routes: POST /tokenize {"count", "max_model_len", "tokens", "token_strs": null},
// POST /detokenize {"prompt"}, and GET /tokenizer_info {"tokenizer_class", "eos_token",
// "bos_token", "pad_token", "model_max_length", "vocab_size"} (the tokens as text, \xNN where a
// token's bytes are not whole characters; null where the tokenizer has none).
std::string TokenizeBody(const std::vector<int32_t>& tokens, int64_t max_model_len);
std::string DetokenizeBody(std::string_view text);
std::string TokenizerInfoBody(const model::ModelConfig& config, const model::Tokenizer& tokenizer);

}  // namespace tost::service::openai
