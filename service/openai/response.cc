#include "service/openai/response.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/utf8.h"
#include "service/openai/error.h"
#include "service/openai/tool_call_stream.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// A token's bytes as a JSON string: bytes that are not a whole character (a token may end inside
// one) are written as \xNN.
std::string TokenString(std::string_view bytes) { return model::EscapeInvalidUtf8(bytes); }

json ByteList(std::string_view bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// Invalid UTF-8 cannot reach here (every text is assembled or escaped above); if it did, it is
// replaced rather than thrown.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

struct ResponseBuilder::Choice {
  std::string text;      // released so far (non-streamed: all of it)
  int64_t chars = 0;     // code points of the token bytes so far (text_offset)
  bool started = false;  // streamed chat: the role chunk is out
  bool finished = false;
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::string state;                      // base64
  std::vector<ToolCall> tool_calls;       // a chat offering tools: the calls parsed out at the end
  std::unique_ptr<ToolCallStream> calls;  // streamed, offering tools: the calls as they come
  // Non-streamed logprobs, per token: completions' four lists, or chat's content entries.
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array(), content = json::array();
};

std::string ResponseId(Endpoint endpoint, std::string_view unique) {
  return absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-",
                      absl::string_view(unique.data(), unique.size()));
}

const char* FinishReasonString(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
    case FinishReason::kStop:
    // The constraint admitted no token at all (a grammar no token of the vocabulary can go on
    // with): the output is a prefix of a complete one. vLLM reports it as "stop", and OpenAI's
    // clients know no other value for an output that ended by itself.
    case FinishReason::kConstraint:
      return "stop";
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    case FinishReason::kDrained:
      return "drained";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "stop";
}

ResponseBuilder::ResponseBuilder(const OpenAiRequest& request, ResponseMeta meta,
                                 const model::Tokenizer& tokenizer)
    : request_(request),
      meta_(std::move(meta)),
      tokenizer_(tokenizer),
      choices_(static_cast<size_t>(std::max(1, request.n))) {}

ResponseBuilder::~ResponseBuilder() = default;

ResponseBuilder::Choice& ResponseBuilder::At(int32_t index) {
  // Out-of-range indices are a front end bug; they land on the nearest choice rather than past
  // the vector.
  const size_t i = static_cast<size_t>(std::clamp<int32_t>(index, 0, choices_.size() - 1));
  return choices_[i];
}

json ResponseBuilder::Envelope(const char* object) const {
  return json{
      {"id", meta_.id}, {"object", object}, {"created", meta_.created}, {"model", meta_.model}};
}

json ResponseBuilder::Usage() const {
  int64_t prompt = 0, completion = 0;
  for (const Choice& c : choices_) {
    // The choices share one prompt (n > 1 runs one generation per choice on it).
    prompt = std::max(prompt, c.prompt_tokens);
    completion += c.generated_tokens;
  }
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

// One token's logprobs in the endpoint's shape; for completions also appended to the choice's
// lists (streamed chunks repeat them per token, the body has them all).
json ResponseBuilder::TokenLogprobs(Choice& c, const TokenEvent& token) const {
  const int32_t n = request_.logprobs.value_or(0);
  // ToGenerationInput asks the engine for every token's own logprob whenever the request wants
  // logprobs; null would only show a token that came without it.
  const json chosen = token.logprob.has_value() ? json(*token.logprob) : json(nullptr);
  const size_t shown = std::min(token.top_logprobs.size(), static_cast<size_t>(n));
  int64_t offset = c.chars;
  if (!token.bytes.empty() && IsContinuation(static_cast<unsigned char>(token.bytes[0])))
    offset = std::max<int64_t>(0, offset - 1);  // the token continues a character begun earlier
  for (unsigned char b : token.bytes) c.chars += IsContinuation(b) ? 0 : 1;
  if (request_.endpoint == Endpoint::kCompletions) {
    json top = json::object();
    for (size_t k = 0; k < shown; ++k) {
      const auto& [id, lp] = token.top_logprobs[k];
      top[TokenString(tokenizer_.TokenBytes(id))] = lp;
    }
    return json{{"tokens", json::array({TokenString(token.bytes)})},
                {"token_logprobs", json::array({chosen})},
                {"top_logprobs", json::array({std::move(top)})},
                {"text_offset", json::array({offset})}};
  }
  json top = json::array();
  for (size_t k = 0; k < shown; ++k) {
    const auto& [id, lp] = token.top_logprobs[k];
    const std::string bytes = tokenizer_.TokenBytes(id);
    top.push_back({{"token", TokenString(bytes)}, {"logprob", lp}, {"bytes", ByteList(bytes)}});
  }
  return json{{"token", TokenString(token.bytes)},
              {"logprob", chosen},
              {"bytes", ByteList(token.bytes)},
              {"top_logprobs", std::move(top)}};
}

json ResponseBuilder::ChoiceLogprobs(const Choice& c) const {
  if (!request_.logprobs.has_value()) return nullptr;
  if (request_.endpoint == Endpoint::kCompletions) {
    return json{{"tokens", c.tokens},
                {"token_logprobs", c.token_logprobs},
                {"top_logprobs", c.top_logprobs},
                {"text_offset", c.text_offset}};
  }
  return json{{"content", c.content}, {"refusal", nullptr}};
}

std::string ResponseBuilder::Echo(const EchoedPrompt& prompt) {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    json lists = {{"tokens", json::array()},
                  {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()},
                  {"text_offset", json::array()}};
    if (request_.logprobs.has_value()) {
      for (const TokenEvent& token : prompt.tokens) {
        json lp = TokenLogprobs(c, token);
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          // The first token has nothing before it: no logprob and no alternatives (null).
          lists[key].push_back(std::string_view(key) == "top_logprobs" && !token.logprob
                                   ? json(nullptr)
                                   : lp[key][0]);
        }
      }
    }
    if (!request_.stream) {
      c.text += prompt.text;
      for (const json& v : lists["tokens"]) c.tokens.push_back(v);
      for (const json& v : lists["token_logprobs"]) c.token_logprobs.push_back(v);
      for (const json& v : lists["top_logprobs"]) c.top_logprobs.push_back(v);
      for (const json& v : lists["text_offset"]) c.text_offset.push_back(v);
      continue;
    }
    json choice = {{"index", i},
                   {"text", prompt.text},
                   {"logprobs", request_.logprobs.has_value() ? std::move(lists) : json(nullptr)},
                   {"finish_reason", nullptr}};
    json chunk = Envelope("text_completion");
    chunk["choices"] = json::array({std::move(choice)});
    if (request_.include_usage) chunk["usage"] = nullptr;
    out += SseEvent(chunk);
  }
  return out;
}

void ResponseBuilder::AddToken(int32_t index, const TokenEvent& token) {
  Choice& c = At(index);
  c.text += token.text;
  if (!request_.logprobs.has_value()) return;
  json lp = TokenLogprobs(c, token);
  if (request_.endpoint == Endpoint::kCompletions) {
    c.tokens.push_back(lp["tokens"][0]);
    c.token_logprobs.push_back(lp["token_logprobs"][0]);
    c.top_logprobs.push_back(lp["top_logprobs"][0]);
    c.text_offset.push_back(lp["text_offset"][0]);
  } else {
    c.content.push_back(std::move(lp));
  }
}

bool ResponseBuilder::ToolMode() const {
  return request_.endpoint == Endpoint::kChatCompletions &&
         request_.tool_choice != ToolChoice::kNone && !call_begin_.empty();
}

std::string ResponseBuilder::CallId(int32_t index, size_t k) const {
  // Unique per response: the response's own id, the choice, the call.
  const std::string_view unique = std::string_view(meta_.id).substr(meta_.id.find('-') + 1);
  return absl::StrCat("call_", absl::string_view(unique.data(), unique.size()), "_", index, "_", k);
}

void ResponseBuilder::ParseCalls(int32_t index, Choice& c) const {
  ParsedToolCalls parsed = ParseToolCalls(request_, call_begin_, c.text);
  if (parsed.calls.empty()) return;
  for (size_t k = 0; k < parsed.calls.size(); ++k) parsed.calls[k].id = CallId(index, k);
  c.text = std::move(parsed.content);
  c.tool_calls = std::move(parsed.calls);
  // A reply cut by max_tokens keeps "length": its complete calls are there, the last one is not.
  if (c.finish_reason != "length") c.finish_reason = "tool_calls";
}

ParsedToolCalls ParseToolCalls(const OpenAiRequest& request, std::string_view call_begin,
                               std::string_view text) {
  ParsedToolCalls out;
  out.content = std::string(text);
  if (request.tool_choice == ToolChoice::kNone) return out;
  // The stream's own reading, so that a streamed reply assembles to exactly this one.
  ToolCallStream stream(request, std::string(call_begin));
  std::vector<ToolCallDelta> deltas = stream.Push(text);
  for (ToolCallDelta& d : stream.Finish()) deltas.push_back(std::move(d));
  const std::vector<std::string>& arguments = stream.complete_arguments();
  if (arguments.empty()) return out;
  std::string content;
  for (const ToolCallDelta& d : deltas) {
    if (d.kind == ToolCallDelta::Kind::kContent) {
      content += d.text;
    } else if (d.kind == ToolCallDelta::Kind::kCallStart && d.call < arguments.size()) {
      out.calls.push_back({"", d.text, arguments[d.call]});
    }
  }
  out.content = std::move(content);
  return out;
}

absl::Status ResponseBuilder::Finish(int32_t index, const GenerationEvent& finished,
                                     std::string_view state_blob) {
  if (!finished.status.ok()) return finished.status;
  if (finished.finish_reason == FinishReason::kCancelled) {
    return absl::CancelledError(absl::StrCat("choice ", index, " on model ", meta_.model,
                                             " was cancelled after ", finished.generated_tokens,
                                             " token(s)"));
  }
  Choice& c = At(index);
  c.finished = true;
  c.text += finished.final_text;
  c.finish_reason = FinishReasonString(finished.finish_reason);
  c.prompt_tokens = finished.prompt_tokens;
  c.generated_tokens = finished.generated_tokens;
  if (ToolMode()) ParseCalls(index, c);
  if (!state_blob.empty()) {
    c.state = absl::Base64Escape(absl::string_view(state_blob.data(), state_blob.size()));
  }
  return absl::OkStatus();
}

std::string ResponseBuilder::Body() const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json body = Envelope(chat ? "chat.completion" : "text_completion");
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}};
    if (chat && !c.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& t : c.tool_calls) {
        calls.push_back({{"id", t.id},
                         {"type", "function"},
                         {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      choice["message"] = {{"role", "assistant"},
                           {"content", c.text.empty() ? json() : json(c.text)},
                           {"refusal", nullptr},
                           {"tool_calls", std::move(calls)}};
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = ChoiceLogprobs(c);
    choice["finish_reason"] = c.finished ? json(c.finish_reason) : json();
    if (!c.state.empty()) choice["state"] = c.state;
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  body["usage"] = Usage();
  if (!request_.session_id.empty()) body["session_id"] = request_.session_id;
  return Dump(body);
}

std::string ResponseBuilder::Token(int32_t index, const TokenEvent& token) {
  Choice& c = At(index);
  if (ToolMode()) {
    c.text += token.text;
    return ToolDeltaChunks(index, c, Calls(c).Push(token.text));
  }
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  json logprobs = nullptr;
  if (request_.logprobs.has_value()) {
    json lp = TokenLogprobs(c, token);
    logprobs = chat ? json{{"content", json::array({std::move(lp)})}, {"refusal", nullptr}}
                    : std::move(lp);
  }
  if (token.text.empty() && logprobs.is_null() && (!chat || c.started)) return {};
  json choice = {{"index", index}};
  if (chat) {
    json delta = json::object();
    if (!c.started) delta["role"] = "assistant";
    delta["content"] = token.text;
    choice["delta"] = std::move(delta);
    c.started = true;
  } else {
    choice["text"] = token.text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  json chunk = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array({std::move(choice)});
  if (request_.include_usage) chunk["usage"] = nullptr;
  return SseEvent(chunk);
}

absl::StatusOr<std::string> ResponseBuilder::FinishChunk(int32_t index,
                                                         const GenerationEvent& finished,
                                                         std::string_view state_blob) {
  if (ToolMode()) return ToolFinishChunks(index, finished, state_blob);
  // The text released at the end is recorded by Finish: Token() never saw it.
  const size_t before = At(index).text.size();
  if (absl::Status s = Finish(index, finished, state_blob); !s.ok()) return s;
  Choice& c = At(index);
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  const std::string tail = c.text.substr(before);
  json choice = {{"index", index}};
  if (chat) {
    json delta = json::object();
    if (!c.started) delta["role"] = "assistant";
    if (!tail.empty() || !c.started) delta["content"] = tail;
    choice["delta"] = std::move(delta);
    c.started = true;
  } else {
    choice["text"] = tail;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = c.finish_reason;
  if (!c.state.empty()) choice["state"] = c.state;
  json chunk = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array({std::move(choice)});
  if (request_.include_usage) chunk["usage"] = nullptr;
  if (!request_.session_id.empty()) chunk["session_id"] = request_.session_id;
  return SseEvent(chunk);
}

ToolCallStream& ResponseBuilder::Calls(Choice& c) const {
  if (c.calls == nullptr) c.calls = std::make_unique<ToolCallStream>(request_, call_begin_);
  return *c.calls;
}

json ResponseBuilder::ToolChunk(int32_t index, json delta, json finish_reason) const {
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", std::move(finish_reason)}};
  json chunk = Envelope("chat.completion.chunk");
  chunk["choices"] = json::array({std::move(choice)});
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::string ResponseBuilder::ToolDeltaChunks(int32_t index, Choice& c,
                                             const std::vector<ToolCallDelta>& deltas) {
  // OpenAI's deltas: content; a call's index, id, type and name with empty arguments; then its
  // arguments in fragments. The choice's first chunk carries the role.
  std::string out;
  for (const ToolCallDelta& d : deltas) {
    json delta = json::object();
    if (!c.started) delta["role"] = "assistant";
    if (d.kind == ToolCallDelta::Kind::kContent) {
      delta["content"] = d.text;
    } else if (d.kind == ToolCallDelta::Kind::kCallStart) {
      if (!c.started) delta["content"] = nullptr;
      delta["tool_calls"] = json::array({{{"index", d.call},
                                          {"id", CallId(index, d.call)},
                                          {"type", "function"},
                                          {"function", {{"name", d.text}, {"arguments", ""}}}}});
    } else {
      delta["tool_calls"] =
          json::array({{{"index", d.call}, {"function", {{"arguments", d.text}}}}});
    }
    c.started = true;
    out += SseEvent(ToolChunk(index, std::move(delta), nullptr));
  }
  return out;
}

absl::StatusOr<std::string> ResponseBuilder::ToolFinishChunks(int32_t index,
                                                              const GenerationEvent& finished,
                                                              std::string_view state_blob) {
  // The text released at the end goes through the calls' stream before the reply's end does.
  Choice& c = At(index);
  std::vector<ToolCallDelta> deltas;
  if (finished.status.ok()) {
    deltas = Calls(c).Push(finished.final_text);
    for (ToolCallDelta& d : Calls(c).Finish()) deltas.push_back(std::move(d));
  }
  // Finish reads the whole text the same way (ParseToolCalls): finish_reason "tool_calls" when a
  // call completed, as the stream's.
  if (absl::Status s = Finish(index, finished, state_blob); !s.ok()) return s;
  std::string out = ToolDeltaChunks(index, c, deltas);
  json delta = json::object();
  if (!c.started) {
    delta["role"] = "assistant";
    delta["content"] = "";
    c.started = true;
  }
  json last = ToolChunk(index, std::move(delta), c.finish_reason);
  if (!c.state.empty()) last["choices"][0]["state"] = c.state;
  if (!request_.session_id.empty()) last["session_id"] = request_.session_id;
  out += SseEvent(last);
  return out;
}

std::string ResponseBuilder::End() const {
  std::string out;
  if (request_.include_usage) {
    json chunk = Envelope(request_.endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk"
                                                                          : "text_completion");
    chunk["choices"] = json::array();
    chunk["usage"] = Usage();
    out = SseEvent(chunk);
  }
  out += kSseDone;
  return out;
}

std::string SseEvent(const json& data) { return absl::StrCat("data: ", Dump(data), "\n\n"); }

std::string ErrorEvent(const absl::Status& status, std::string_view param) {
  return absl::StrCat(
      "data: ", OpenAiErrorBody(status, absl::string_view(param.data(), param.size())), "\n\n");
}

namespace {

bool ServedLanguageModel(const ModelEntry& m) {
  return m.load_status.ok() && m.generator != nullptr &&
         m.config.architecture == model::Architecture::kLanguage;
}

json ModelObject(const ModelEntry& m) {
  return {{"id", m.name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "tost-serve"},
          {"tost",
           {{"version", m.config.version},
            {"context_length", m.config.language.context_length},
            {"chat", m.config.chat_template.has_value()}}}};
}

}  // namespace

std::string ModelsListBody(const std::vector<ModelEntry>& models) {
  json data = json::array();
  for (const ModelEntry& m : models) {
    if (ServedLanguageModel(m)) data.push_back(ModelObject(m));
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

std::optional<std::string> ModelBody(const std::vector<ModelEntry>& models,
                                     const std::string& name) {
  for (const ModelEntry& m : models) {
    if (m.name == name && ServedLanguageModel(m)) return Dump(ModelObject(m));
  }
  return std::nullopt;
}

std::string TokenizeBody(const std::vector<int32_t>& tokens, int64_t max_model_len) {
  return Dump(json{{"count", tokens.size()},
                   {"max_model_len", max_model_len},
                   {"tokens", tokens},
                   {"token_strs", nullptr}});
}

std::string DetokenizeBody(std::string_view text) {
  return Dump(json{{"prompt", TokenString(text)}});
}

// The end-of-text token as text; null when it has no bytes (a special token, as tost-austen's): a
// client encoding "" back to it would find no token.
static json EosToken(const model::Tokenizer& tokenizer) {
  const int64_t eos = tokenizer.eos_token_id();
  if (eos < 0) return nullptr;
  const std::string bytes = tokenizer.TokenBytes(static_cast<int32_t>(eos));
  return bytes.empty() ? json() : json(TokenString(bytes));
}

std::string TokenizerInfoBody(const model::ModelConfig& config, const model::Tokenizer& tokenizer) {
  return Dump(json{{"tokenizer_class", tokenizer.type()},
                   {"eos_token", EosToken(tokenizer)},
                   {"bos_token", nullptr},
                   {"pad_token", nullptr},
                   {"model_max_length", config.language.context_length},
                   {"vocab_size", tokenizer.vocab_size()}});
}

}  // namespace tost::service::openai
