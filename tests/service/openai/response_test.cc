// Response JSON, SSE chunks and the model list of the OpenAI-compatible API, against literal
// expected documents (parsed back and compared as JSON), and the UTF-8 safety of streamed chunks
// when tokens split characters.
#include "service/openai/response.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/utf8.h"
#include "model/text/tokenizer.h"
#include "service/engine/text_stream.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

const model::ByteTokenizer kBytes(260, 256);
const ResponseMeta kMeta{"cmpl-1", 1700000000, "lm"};

OpenAiRequest Parsed(Endpoint endpoint, const std::string& body) {
  auto r = ParseOpenAiRequest(endpoint, body);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest{};
}

TokenEvent Tok(char c, std::optional<float> logprob = std::nullopt,
               std::vector<std::pair<int32_t, float>> top = {}) {
  TokenEvent t;
  t.id = static_cast<unsigned char>(c);
  t.bytes = std::string(1, c);
  t.text = t.bytes;
  t.logprob = logprob;
  t.top_logprobs = std::move(top);
  return t;
}

GenerationEvent Final(FinishReason reason, int32_t prompt, int32_t generated,
                      std::string final_text = "") {
  GenerationEvent e;
  e.kind = GenerationEvent::Kind::kFinished;
  e.finish_reason = reason;
  e.prompt_tokens = prompt;
  e.generated_tokens = generated;
  e.final_text = std::move(final_text);
  return e;
}

// The data: payloads of an SSE byte string, checking the framing.
std::vector<std::string> Events(const std::string& sse) {
  std::vector<std::string> out;
  if (sse.empty()) return out;
  EXPECT_EQ(sse.substr(sse.size() - 2), "\n\n");
  for (absl::string_view e : absl::StrSplit(sse.substr(0, sse.size() - 2), "\n\n")) {
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    out.emplace_back(e.substr(6));
  }
  return out;
}

TEST(OpenAiResponse, CompletionBody) {
  const OpenAiRequest r = Parsed(Endpoint::kCompletions, R"({"model": "lm", "prompt": "x"})");
  ResponseBuilder b(r, kMeta, kBytes);
  b.AddToken(0, Tok('H'));
  b.AddToken(0, Tok('i'));
  ASSERT_TRUE(b.Finish(0, Final(FinishReason::kLength, 3, 2, "!")).ok());
  b.set_cached_tokens(1);
  EXPECT_EQ(json::parse(b.Body()), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "lm",
    "choices": [{"index": 0, "text": "Hi!", "logprobs": null, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
              "prompt_tokens_details": {"cached_tokens": 1}}})"));
}

TEST(OpenAiResponse, CompletionLogprobsAndStateAndChoices) {
  const OpenAiRequest r =
      Parsed(Endpoint::kCompletions,
             R"({"model": "lm", "prompt": "x", "logprobs": 1, "n": 2, "return_state": true})");
  ResponseBuilder b(r, kMeta, kBytes);
  b.AddToken(0, Tok('a', -0.5f, {{'a', -0.5f}}));
  b.AddToken(0, Tok('c', -3.75f, {{'d', -0.25f}}));  // not among the alternatives: its own value
  b.AddToken(1, Tok('b', -1.5f, {{'a', -0.5f}}));
  ASSERT_TRUE(b.Finish(1, Final(FinishReason::kEos, 4, 1), "\x01\x02").ok());
  ASSERT_TRUE(b.Finish(0, Final(FinishReason::kStop, 4, 2), "\xff").ok());
  EXPECT_EQ(json::parse(b.Body()), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "lm",
    "choices": [
      {"index": 0, "text": "ac", "finish_reason": "stop", "state": "/w==",
       "logprobs": {"tokens": ["a", "c"], "token_logprobs": [-0.5, -3.75],
                    "top_logprobs": [{"a": -0.5}, {"d": -0.25}], "text_offset": [0, 1]}},
      {"index": 1, "text": "b", "finish_reason": "stop", "state": "AQI=",
       "logprobs": {"tokens": ["b"], "token_logprobs": [-1.5],
                    "top_logprobs": [{"a": -0.5}], "text_offset": [0]}}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
              "prompt_tokens_details": {"cached_tokens": 0}}})"));
}

TEST(OpenAiResponse, ChatBodyWithLogprobs) {
  const OpenAiRequest r = Parsed(Endpoint::kChatCompletions, R"({"model": "lm",
      "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 1,
      "session_id": "s1"})");
  ResponseBuilder b(r, {"chatcmpl-1", 5, "lm"}, kBytes);
  b.AddToken(0, Tok('O', -0.125f, {{'O', -0.125f}}));
  ASSERT_TRUE(b.Finish(0, Final(FinishReason::kContext, 2, 1)).ok());
  EXPECT_EQ(json::parse(b.Body()), json::parse(R"({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "lm",
    "session_id": "s1",
    "choices": [{"index": 0, "finish_reason": "length",
      "message": {"role": "assistant", "content": "O", "refusal": null},
      "logprobs": {"refusal": null, "content": [{"token": "O", "logprob": -0.125, "bytes": [79],
        "top_logprobs": [{"token": "O", "logprob": -0.125, "bytes": [79]}]}]}}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3,
              "prompt_tokens_details": {"cached_tokens": 0}}})"));
}

TEST(OpenAiResponse, FailedAndCancelledChoicesReturnTheirStatus) {
  const OpenAiRequest r = Parsed(Endpoint::kCompletions, R"({"model": "lm", "prompt": "x"})");
  ResponseBuilder b(r, kMeta, kBytes);
  GenerationEvent failed = Final(FinishReason::kLength, 1, 0);
  failed.status = absl::DeadlineExceededError("past its deadline");
  EXPECT_EQ(b.Finish(0, failed).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b.Finish(0, Final(FinishReason::kCancelled, 1, 0)).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(b.FinishChunk(0, failed).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(OpenAiResponse, FinishReasons) {
  EXPECT_STREQ(FinishReasonString(FinishReason::kStop), "stop");
  EXPECT_STREQ(FinishReasonString(FinishReason::kEos), "stop");
  EXPECT_STREQ(FinishReasonString(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonString(FinishReason::kContext), "length");
  EXPECT_STREQ(FinishReasonString(FinishReason::kDrained), "drained");
  EXPECT_EQ(ResponseId(Endpoint::kChatCompletions, "ab"), "chatcmpl-ab");
  EXPECT_EQ(ResponseId(Endpoint::kCompletions, "ab"), "cmpl-ab");
}

TEST(OpenAiStream, ChatChunks) {
  const OpenAiRequest r = Parsed(Endpoint::kChatCompletions, R"({"model": "lm",
      "messages": [{"role": "user", "content": "x"}], "stream": true,
      "stream_options": {"include_usage": true}})");
  ResponseBuilder b(r, {"chatcmpl-9", 7, "lm"}, kBytes);
  std::vector<std::string> events = Events(b.Token(0, Tok('H')));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({"id": "chatcmpl-9",
      "object": "chat.completion.chunk", "created": 7, "model": "lm", "usage": null,
      "choices": [{"index": 0, "delta": {"role": "assistant", "content": "H"}, "logprobs": null,
                   "finish_reason": null}]})"));
  events = Events(b.Token(0, Tok('i')));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"], json::parse(R"({"content": "i"})"));
  TokenEvent held = Tok('x');
  held.text.clear();  // a token whose text the engine holds back
  EXPECT_EQ(b.Token(0, held), "");
  auto fin = b.FinishChunk(0, Final(FinishReason::kStop, 1, 3, "x"));
  ASSERT_TRUE(fin.ok()) << fin.status();
  events = Events(*fin);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({"id": "chatcmpl-9",
      "object": "chat.completion.chunk", "created": 7, "model": "lm", "usage": null,
      "choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": null,
                   "finish_reason": "stop"}]})"));
  const std::string end = b.End();
  events = Events(end);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({"id": "chatcmpl-9",
      "object": "chat.completion.chunk", "created": 7, "model": "lm", "choices": [],
      "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 0}}})"));
  EXPECT_EQ(events[1], "[DONE]");
  EXPECT_TRUE(absl::EndsWith(end, "data: [DONE]\n\n"));
}

TEST(OpenAiStream, ChatChoiceWithNoTokensStillSaysItsRole) {
  const OpenAiRequest r = Parsed(Endpoint::kChatCompletions, R"({"model": "lm",
      "messages": [{"role": "user", "content": "x"}], "stream": true, "n": 2})");
  ResponseBuilder b(r, kMeta, kBytes);
  auto fin = b.FinishChunk(1, Final(FinishReason::kEos, 1, 0));
  ASSERT_TRUE(fin.ok());
  const json chunk = json::parse(Events(*fin)[0]);
  EXPECT_EQ(chunk["choices"][0], json::parse(R"({"index": 1,
      "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": "stop"})"));
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(b.End(), "data: [DONE]\n\n");
}

TEST(OpenAiStream, CompletionChunksWithLogprobsAndState) {
  const OpenAiRequest r = Parsed(Endpoint::kCompletions, R"({"model": "lm", "prompt": "x",
      "stream": true, "logprobs": 0, "return_state": true})");
  ResponseBuilder b(r, kMeta, kBytes);
  std::vector<std::string> events = Events(b.Token(0, Tok('a', -0.5f)));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({"id": "cmpl-1", "object": "text_completion",
      "created": 1700000000, "model": "lm",
      "choices": [{"index": 0, "text": "a", "finish_reason": null,
        "logprobs": {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{}],
                     "text_offset": [0]}}]})"));
  auto fin = b.FinishChunk(0, Final(FinishReason::kDrained, 1, 1), "ST");
  ASSERT_TRUE(fin.ok());
  EXPECT_EQ(json::parse(Events(*fin)[0])["choices"][0], json::parse(R"({"index": 0, "text": "",
      "logprobs": null, "finish_reason": "drained", "state": "U1Q="})"));
  EXPECT_EQ(b.End(), "data: [DONE]\n\n");
}

// Byte-level tokens that split characters: every chunk is valid UTF-8 JSON, the text reassembles
// exactly, and the logprobs' token strings escape the partial bytes.
TEST(OpenAiStream, ChunksAreValidUtf8WhenTokensSplitCharacters) {
  const OpenAiRequest r = Parsed(Endpoint::kChatCompletions, R"({"model": "lm",
      "messages": [{"role": "user", "content": "x"}], "stream": true, "logprobs": true})");
  ResponseBuilder b(r, kMeta, kBytes);
  const std::string text = "h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80!";  // hé€😀!
  TextStream stream({});
  std::string streamed;
  for (char c : text) {
    TokenEvent t;
    t.id = static_cast<unsigned char>(c);
    t.bytes = std::string(1, c);
    t.text = stream.Push(t.bytes).text;  // what the scheduler publishes for this token
    t.logprob = -1.f;
    for (const std::string& e : Events(b.Token(0, t))) {
      EXPECT_EQ(model::FirstInvalidUtf8(e), std::nullopt) << e;
      const json chunk = json::parse(e);
      streamed += chunk["choices"][0]["delta"]["content"].get<std::string>();
      const json& lp = chunk["choices"][0]["logprobs"]["content"][0];
      EXPECT_EQ(lp["bytes"], json::array({static_cast<int>(static_cast<unsigned char>(c))}));
      if (static_cast<unsigned char>(c) >= 0x80) {
        EXPECT_TRUE(absl::StartsWith(lp["token"].get<std::string>(), "\\x")) << lp;
      }
    }
  }
  EXPECT_EQ(streamed, text);
  // An engine text with invalid bytes (never published, but the chunk stays valid either way).
  TokenEvent bad = Tok('z');
  bad.text = "\xff";
  const std::string chunk = b.Token(0, bad);
  EXPECT_EQ(model::FirstInvalidUtf8(chunk), std::nullopt);
  EXPECT_NO_THROW(json::parse(Events(chunk)[0]));
}

TEST(OpenAiStream, TextOffsetsCountCharacters) {
  const OpenAiRequest r =
      Parsed(Endpoint::kCompletions, R"({"model": "lm", "prompt": "x", "logprobs": 0})");
  ResponseBuilder b(r, kMeta, kBytes);
  for (char c : std::string("a\xc3\xa9z")) b.AddToken(0, Tok(c));
  ASSERT_TRUE(b.Finish(0, Final(FinishReason::kLength, 1, 4)).ok());
  EXPECT_EQ(json::parse(b.Body())["choices"][0]["logprobs"]["text_offset"],
            json::parse("[0, 1, 1, 2]"));
}

TEST(OpenAiStream, ErrorEvent) {
  const std::string e = ErrorEvent(absl::ResourceExhaustedError("full"), "");
  EXPECT_EQ(json::parse(Events(e)[0]), json::parse(R"({"error": {"message": "full",
      "type": "rate_limit_error", "param": null, "code": "resource_exhausted"}})"));
}

TEST(OpenAiModels, ListsServedLanguageModels) {
  std::vector<ModelEntry> models(4);
  models[0].name = "austen";
  models[0].config.architecture = model::Architecture::kLanguage;
  models[0].config.version = "7";
  models[0].config.language.context_length = 1024;
  models[0].config.chat_template = model::ChatTemplate{};
  models[0].generator = reinterpret_cast<const GenerativeModel*>(&models);  // only compared to null
  models[1].name = "digits";                                                // a classifier
  models[1].config.architecture = model::Architecture::kVision;
  models[2].name = "broken";  // did not load
  models[2].config.architecture = model::Architecture::kLanguage;
  models[2].load_status = absl::InternalError("no weights");
  models[3].name = "plain";
  models[3].config.architecture = model::Architecture::kLanguage;
  models[3].config.language.context_length = 64;
  models[3].generator = models[0].generator;
  EXPECT_EQ(json::parse(ModelsListBody(models)), json::parse(R"({"object": "list", "data": [
      {"id": "austen", "object": "model", "created": 0, "owned_by": "tost-serve",
       "tost": {"version": "7", "context_length": 1024, "chat": true}},
      {"id": "plain", "object": "model", "created": 0, "owned_by": "tost-serve",
       "tost": {"version": "1", "context_length": 64, "chat": false}}]})"));
}

// echo: the prompt first, its first token without a logprob or alternatives (null), the
// generated tokens' offsets after the prompt's characters.
TEST(ResponseBuilder, EchoPutsThePromptFirst) {
  const OpenAiRequest r =
      Parsed(Endpoint::kCompletions,
             R"({"model": "lm", "prompt": "ab", "echo": true, "logprobs": 1, "max_tokens": 1})");
  ResponseBuilder b(r, kMeta, kBytes);
  EchoedPrompt prompt;
  prompt.text = "ab";
  prompt.tokens = {Tok('a'), Tok('b', -0.5f, {{'c', -0.25f}})};
  EXPECT_EQ(b.Echo(prompt), "");  // non-streamed: nothing to write yet
  b.AddToken(0, Tok('c', -1.f, {{'c', -1.f}}));
  ASSERT_TRUE(b.Finish(0, Final(FinishReason::kLength, 2, 1)).ok());
  const json choice = json::parse(b.Body())["choices"][0];
  EXPECT_EQ(choice["text"], "abc");
  EXPECT_EQ(choice["logprobs"], json::parse(R"({
      "tokens": ["a", "b", "c"], "token_logprobs": [null, -0.5, -1.0],
      "top_logprobs": [null, {"c": -0.25}, {"c": -1.0}], "text_offset": [0, 1, 2]})"));

  const OpenAiRequest streamed = Parsed(
      Endpoint::kCompletions,
      R"({"model": "lm", "prompt": "ab", "echo": true, "max_tokens": 0, "stream": true, "n": 2})");
  ResponseBuilder s(streamed, kMeta, kBytes);
  const std::vector<std::string> events = Events(s.Echo(prompt));
  ASSERT_EQ(events.size(), 2u);  // one chunk per choice
  for (size_t i = 0; i < 2; ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["choices"][0]["index"], i);
    EXPECT_EQ(chunk["choices"][0]["text"], "ab");
    EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());
  }
}

TEST(OpenAiBodies, ModelTokenizeDetokenizeAndTokenizerInfo) {
  EXPECT_EQ(json::parse(TokenizeBody({1, 2}, 1024)),
            json::parse(R"({"count": 2, "max_model_len": 1024, "tokens": [1, 2],
                            "token_strs": null})"));
  EXPECT_EQ(json::parse(DetokenizeBody("h\xc3")), json::parse(R"({"prompt": "h\\xc3"})"));
  model::ModelConfig config;
  config.language.context_length = 64;
  const json info = json::parse(TokenizerInfoBody(config, kBytes));
  EXPECT_EQ(info["model_max_length"], 64);
  EXPECT_EQ(info["vocab_size"], 260);
  EXPECT_TRUE(info["eos_token"].is_null());  // id 256: a special token without bytes
  EXPECT_FALSE(ModelBody({}, "lm").has_value());
}

OpenAiRequest ToolRequest(const std::string& choice) {
  return Parsed(Endpoint::kChatCompletions,
                absl::StrCat(R"({"model": "lm", "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f"}},
                              {"type": "function", "function": {"name": "g"}}],
                    "tool_choice": )",
                             choice, "}"));
}

TEST(ParseToolCalls, RequiredAutoCutAndForeign) {
  const OpenAiRequest required = ToolRequest(R"("required")");
  ParsedToolCalls p = ParseToolCalls(
      required, "<call>",
      R"([{"name": "f", "arguments": {"b": 1, "a": [2]}}, {"name": "g", "arguments": {}}])");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, R"({"b":1,"a":[2]})");  // compact, in the model's order
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.content, "");
  // Cut by max_tokens: the complete calls before the cut, arguments without the whitespace
  // between JSON tokens.
  p = ParseToolCalls(required, "<call>",
                     R"([{"name": "f", "arguments": {"s": "]}"}}, {"name": "g", "argu)");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"s":"]}"})");
  // A name the request did not offer: no calls, the text stays content.
  p = ParseToolCalls(required, "<call>", R"([{"name": "h", "arguments": {}}])");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, R"([{"name": "h", "arguments": {}}])");
  // auto: the calls follow the marker, the text before it is the content.
  const OpenAiRequest automatic = ToolRequest(R"("auto")");
  p = ParseToolCalls(automatic, "<call>",
                     R"(Let me see.<call>{"name": "g", "arguments": {"x": 1}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Let me see.");
  p = ParseToolCalls(automatic, "<call>", "Just text.");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "Just text.");
}

TEST(ResponseBuilder, ToolCallsInTheBodyAndAsStreamedDeltas) {
  const OpenAiRequest r = ToolRequest(R"("required")");
  const std::string text = R"([{"name": "g", "arguments": {"x": 1}}])";
  ResponseBuilder whole(r, {"chatcmpl-abc", 1, "lm"}, kBytes);
  whole.set_call_begin("<call>");
  for (char ch : text) whole.AddToken(0, Tok(ch));
  ASSERT_TRUE(
      whole.Finish(0, Final(FinishReason::kEos, 3, static_cast<int32_t>(text.size()))).ok());
  const json choice = json::parse(whole.Body())["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"],
            json::parse(R"([{"id": "call_abc_0_0", "type": "function",
      "function": {"name": "g", "arguments": "{\"x\":1}"}}])"));

  // Streamed: the call's start as soon as its name is read, then its arguments as they come; the
  // fragments assemble to the unstreamed call.
  OpenAiRequest streamed_request = r;
  streamed_request.stream = true;
  ResponseBuilder streamed(streamed_request, {"chatcmpl-abc", 1, "lm"}, kBytes);
  streamed.set_call_begin("<call>");
  std::vector<json> deltas;
  size_t start_at = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    for (const std::string& e : Events(streamed.Token(0, Tok(text[i])))) {
      deltas.push_back(json::parse(e)["choices"][0]["delta"]);
      if (deltas.size() == 1) start_at = i;
    }
  }
  EXPECT_EQ(start_at, text.find("\"g\"") + 2);  // at the name's closing quote
  auto end = streamed.FinishChunk(0, Final(FinishReason::kEos, 3, 10));
  ASSERT_TRUE(end.ok());
  const std::vector<std::string> last = Events(*end);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(json::parse(last[0])["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_GE(deltas.size(), 4u);  // the start, then "{", "\"x\"", ":", "1", "}" one by one
  EXPECT_EQ(deltas[0], json::parse(R"({"role": "assistant", "content": null, "tool_calls": [
      {"index": 0, "id": "call_abc_0_0", "type": "function",
       "function": {"name": "g", "arguments": ""}}]})"));
  std::string arguments;
  for (size_t i = 1; i < deltas.size(); ++i) {
    ASSERT_EQ(deltas[i]["tool_calls"][0]["index"], 0);
    arguments += deltas[i]["tool_calls"][0]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(arguments, "{\"x\":1}");
}

std::vector<ToolCallDelta> PushAll(ToolCallStream& s, const std::vector<std::string>& pieces) {
  std::vector<ToolCallDelta> out;
  for (const std::string& p : pieces) {
    for (ToolCallDelta& d : s.Push(p)) out.push_back(std::move(d));
  }
  for (ToolCallDelta& d : s.Finish()) out.push_back(std::move(d));
  return out;
}

std::string Show(const std::vector<ToolCallDelta>& deltas) {
  std::string out;
  for (const ToolCallDelta& d : deltas) {
    const char* kind = d.kind == ToolCallDelta::Kind::kContent     ? "content"
                       : d.kind == ToolCallDelta::Kind::kCallStart ? "start"
                                                                   : "args";
    absl::StrAppend(&out, kind, d.call, "[", d.text, "] ");
  }
  return out;
}

TEST(ToolCallStream, AutoHoldsOnlyWhatMayBeTheMarker) {
  const OpenAiRequest r = ToolRequest(R"("auto")");
  ToolCallStream s(r, "<call>");
  // "<c" may begin the marker: held; "<x" cannot: released as soon as it is decided.
  EXPECT_EQ(Show(s.Push("I will <")), "content0[I will ] ");
  EXPECT_EQ(Show(s.Push("x> see <c")), "content0[<x> see ] ");
  EXPECT_EQ(Show(s.Push("all>{\"arguments\": {\"a\": [1, ")), "");  // arguments before the name
  EXPECT_EQ(Show(s.Push("2]}, \"name\": \"f\"}")), "start0[f] args0[{\"a\":[1,2]}] ");
  EXPECT_EQ(Show(s.Finish()), "");
  EXPECT_EQ(s.complete_arguments(), std::vector<std::string>{"{\"a\":[1,2]}"});

  // "auto" with a template without a marker: nothing is a call.
  ToolCallStream unmarked(r, "");
  EXPECT_EQ(Show(PushAll(unmarked, {"[{\"name\": \"f\", \"arguments\": {}}]"})),
            "content0[[{\"name\": \"f\", \"arguments\": {}}]] ");
  // No marker: everything is content by the end.
  ToolCallStream plain(r, "<call>");
  EXPECT_EQ(Show(PushAll(plain, {"Just <ca", "ts."})), "content0[Just ] content0[<cats.] ");
  // A marker followed by no call: the marker and the rest come back as content at the end.
  ToolCallStream no_call(r, "<call>");
  EXPECT_EQ(Show(PushAll(no_call, {"So<call>", "{\"name\": \"zz\", \"arguments\": {}}"})),
            "content0[So] content0[<call>{\"name\": \"zz\", \"arguments\": {}}] ");
  EXPECT_TRUE(no_call.complete_arguments().empty());
}

TEST(ToolCallStream, RequiredCallsStreamTheirArgumentsAsTheyCome) {
  const OpenAiRequest r = ToolRequest(R"("required")");
  ToolCallStream s(r, "<call>");
  EXPECT_EQ(Show(s.Push(R"([{"name": "f", "arguments": {"s": "a )")),
            R"(start0[f] args0[{"s":"a ] )");  // whitespace inside strings kept
  EXPECT_EQ(Show(s.Push(R"(]\" }"}, "x": 3.5e1 }, {"name")")), R"(args0[]\" }"}] )");
  EXPECT_EQ(Show(s.Push(R"(: "g", "arguments": true})")), "start1[g] args1[true] ");
  EXPECT_EQ(Show(s.Push("]  trailing")), "");
  EXPECT_EQ(s.complete_arguments(), (std::vector<std::string>{R"({"s":"a ]\" }"})", "true"}));
  // Cut inside the second call: it started, it never completed.
  ToolCallStream cut(r, "<call>");
  PushAll(cut, {R"([{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"a)"});
  EXPECT_EQ(cut.calls_started(), 2u);
  EXPECT_EQ(cut.complete_arguments(), std::vector<std::string>{"{}"});
  // Arguments that are not JSON end the calls there: that call is not complete.
  ToolCallStream bad(r, "<call>");
  PushAll(bad, {R"([{"name": "f", "arguments": {"a" 1}}])"});
  EXPECT_TRUE(bad.complete_arguments().empty());
}

TEST(ToolCallStream, StreamedPiecesAssembleToTheUnstreamedReply) {
  // However the reply is cut into released pieces, the content and calls the deltas assemble to
  // are ParseToolCalls' (for a reply whose started calls all complete).
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"("auto")",
       {"Plain text, no call.", "Text <ca then <call>[{\"name\": \"f\", \"arguments\": {}}]",
        "<call> {\"name\":\"g\" , \"arguments\" : { \"k\" : [ 1 , \"a b\" , null ] } }",
        "before<call>not json", "<c<call>[{\"name\": \"f\", \"arguments\": {\"q\": \"\\\"\"}}]"}},
      {R"("required")",
       {R"([{"name": "f", "arguments": {"x": -1.5e3}}, {"name": "g", "arguments": [true]}])",
        R"([{"arguments": {"late": "name"}, "name": "g"}])", R"([{"name": "h", "arguments": {}}])",
        R"(  [ ] )"}}};
  for (const auto& [choice, texts] : cases) {
    const OpenAiRequest r = ToolRequest(choice);
    for (const std::string& text : texts) {
      const ParsedToolCalls whole = ParseToolCalls(r, "<call>", text);
      for (size_t piece = 1; piece <= 7; ++piece) {
        ToolCallStream s(r, "<call>");
        std::vector<std::string> pieces;
        for (size_t i = 0; i < text.size(); i += piece) pieces.push_back(text.substr(i, piece));
        std::string content;
        std::vector<ToolCall> calls;
        for (const ToolCallDelta& d : PushAll(s, pieces)) {
          if (d.kind == ToolCallDelta::Kind::kContent) content += d.text;
          if (d.kind == ToolCallDelta::Kind::kCallStart) calls.push_back({"", d.text, ""});
          if (d.kind == ToolCallDelta::Kind::kArguments) calls.at(d.call).arguments += d.text;
        }
        ASSERT_EQ(s.calls_started(), s.complete_arguments().size()) << text;
        EXPECT_EQ(content, whole.content) << text << " in pieces of " << piece;
        ASSERT_EQ(calls.size(), whole.calls.size()) << text << " in pieces of " << piece;
        for (size_t k = 0; k < calls.size(); ++k) {
          EXPECT_EQ(calls[k].name, whole.calls[k].name) << text;
          EXPECT_EQ(calls[k].arguments, whole.calls[k].arguments) << text;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tost::service::openai
