// The OpenAI-compatible request parser: every field's accepted and refused forms, the exact
// messages (field, expected, got) and the "param" each refusal carries; then the request as the
// engine's GenerationInput, through BuildGenerationRequest on a fake model's scheduler.
#include "service/openai/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/engine/generation_scheduler.h"
#include "service/openai/error.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service::openai {
namespace {

using ::testing::HasSubstr;

OpenAiRequest Completion(const std::string& fields) {
  auto r = ParseCompletionRequest(absl::StrCat(R"({"model": "m", "prompt": "Hi")", fields, "}"));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest{};
}

OpenAiRequest Chat(const std::string& fields) {
  auto r = ParseChatCompletionRequest(absl::StrCat(
      R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}])", fields, "}"));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest{};
}

// The body is refused with exactly `message`, INVALID_ARGUMENT, and `param` in the error body.
void ExpectRefused(Endpoint endpoint, const std::string& body, const std::string& message,
                   const std::string& param) {
  auto r = ParseOpenAiRequest(endpoint, body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_EQ(r.status().message(), message) << body;
  EXPECT_EQ(ErrorParam(r.status()), param) << body;
}
void CompletionRefused(const std::string& fields, const std::string& message,
                       const std::string& param) {
  ExpectRefused(Endpoint::kCompletions,
                absl::StrCat(R"({"model": "m", "prompt": "Hi")", fields, "}"), message, param);
}
void ChatRefused(const std::string& fields, const std::string& message, const std::string& param) {
  ExpectRefused(Endpoint::kChatCompletions,
                absl::StrCat(R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}])",
                             fields, "}"),
                message, param);
}

TEST(OpenAiRequest, ClientIdentifiersAreBoundedStrings) {
  const OpenAiRequest r =
      Chat(R"(, "user": "u-1", "safety_identifier": "s-1", "prompt_cache_key": "k-1")");
  EXPECT_EQ(r.identifiers.user, "u-1");
  EXPECT_EQ(r.identifiers.safety_identifier, "s-1");
  EXPECT_EQ(r.identifiers.prompt_cache_key, "k-1");
  EXPECT_EQ(AccessLogFields(r.identifiers), (std::vector<std::pair<std::string, std::string>>{
                                                {"user", "u-1"}, {"safety_identifier", "s-1"}}));
  EXPECT_TRUE(AccessLogFields(Completion("").identifiers).empty());
  // Characters, not bytes: 64 two-byte characters are within safety_identifier's bound.
  std::string e64;
  for (int i = 0; i < 64; ++i) e64 += "\u00e9";
  EXPECT_EQ(Completion(absl::StrCat(R"(, "safety_identifier": ")", e64, R"(")"))
                .identifiers.safety_identifier.size(),
            128u);
  CompletionRefused(absl::StrCat(R"(, "safety_identifier": ")", e64, R"(e")"),
                    "safety_identifier: expected a string of at most 64 characters, got one of 65",
                    "safety_identifier");
  CompletionRefused(absl::StrCat(R"(, "user": ")", std::string(257, 'u'), R"(")"),
                    "user: expected a string of at most 256 characters, got one of 257", "user");
  ChatRefused(absl::StrCat(R"(, "prompt_cache_key": ")", std::string(257, 'k'), R"(")"),
              "prompt_cache_key: expected a string of at most 256 characters, got one of 257",
              "prompt_cache_key");
  ChatRefused(R"(, "user": 7)", "user: expected a string, got an integer (7)", "user");
}

TEST(OpenAiRequest, ToolParameterConstraintsNameEachCalledFunction) {
  const std::string tools = R"(, "tools": [
      {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
      {"type": "function", "function": {"name": "b"}},
      {"type": "function", "function": {"name": "c", "parameters": {"type": "string"}}}])";
  const auto all = ToolParameterConstraints(Chat(tools + R"(, "tool_choice": "required")"));
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].first, "tools[0].function.parameters");
  EXPECT_EQ(all[0].second.text, R"({"type":"object"})");
  EXPECT_EQ(all[1].second.text, "{}");
  EXPECT_EQ(all[2].first, "tools[2].function.parameters");
  EXPECT_EQ(all[2].second.kind, structured::Constraint::Kind::kJsonSchema);
  // A named call's schema holds that function only.
  const auto named = ToolParameterConstraints(
      Chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "c"}})"));
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "tools[2].function.parameters");
}

TEST(OpenAiRequest, CompletionDefaults) {
  const OpenAiRequest r = Completion("");
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "Hi");
  EXPECT_FALSE(r.prompt_tokens.has_value());
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_FALSE(r.stop.has_value());
  EXPECT_FALSE(r.logprobs.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.return_state);
}

TEST(OpenAiRequest, BodyMustBeUtf8JsonObject) {
  ExpectRefused(Endpoint::kCompletions, "[1]",
                "body: expected a JSON object, got an array of 1 element(s)", "body");
  auto r = ParseCompletionRequest(R"({"model": "m", "prompt": )");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("body: expected a JSON object: "));
  EXPECT_EQ(ErrorParam(r.status()), "body");
  r = ParseCompletionRequest("{\"model\": \"m\", \"prompt\": \"a\xff\"}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("byte offset 27"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("field \"prompt\""));
}

TEST(OpenAiRequest, Model) {
  ExpectRefused(Endpoint::kCompletions, R"({"prompt": "x"})",
                "model: missing: expected the name of a model", "model");
  ExpectRefused(Endpoint::kCompletions, R"({"model": 5, "prompt": "x"})",
                "model: expected a non-empty string, got an integer (5)", "model");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "", "prompt": "x"})",
                "model: expected a non-empty string, got a string (\"\")", "model");
}

TEST(OpenAiRequest, PromptForms) {
  auto r = ParseCompletionRequest(R"({"model": "m", "prompt": [1, 2, 3]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  r = ParseCompletionRequest(R"({"model": "m", "prompt": ["one"]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_text, "one");
  r = ParseCompletionRequest(R"({"model": "m", "prompt": [[7, 8]]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->prompt_tokens, (std::vector<int32_t>{7, 8}));
  r = ParseCompletionRequest(R"({"model": "m", "prompt": ""})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_text, "");

  ExpectRefused(Endpoint::kCompletions, R"({"model": "m"})",
                "prompt: missing: expected a string or an array of token ids", "prompt");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": ["a", "b"]})",
                "prompt: batch prompts are not supported: expected one prompt (a string or an "
                "array of token ids), got an array of 2 prompts; send one request per prompt",
                "prompt");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": 5})",
                "prompt: expected a string, an array of token ids, or an array holding one of "
                "either, got an integer (5)",
                "prompt");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": [1, 2.5]})",
                "prompt[1]: expected an integer in [0, 2147483647], got a number (2.5)",
                "prompt[1]");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": [1, -1]})",
                "prompt[1]: expected an integer in [0, 2147483647], got an integer (-1)",
                "prompt[1]");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": [1, "x"]})",
                "prompt[1]: expected an integer in [0, 2147483647], got a string (\"x\")",
                "prompt[1]");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": [[1], [2]]})",
                "prompt: batch prompts are not supported: expected one prompt (a string or an "
                "array of token ids), got an array of 2 prompts; send one request per prompt",
                "prompt");
  ExpectRefused(Endpoint::kCompletions, R"({"model": "m", "prompt": [{}]})",
                "prompt[0]: expected a string, an array of token ids, or an array holding one of "
                "either, got an object",
                "prompt[0]");
}

TEST(OpenAiRequest, Messages) {
  auto r = ParseChatCompletionRequest(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": "Really."},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "you"}], "name": "x"},
      {"role": "assistant", "content": "Hi", "tool_calls": []}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, ChatRole::kSystem);
  EXPECT_EQ(r->messages[1].role, ChatRole::kSystem);
  EXPECT_EQ(r->messages[2].role, ChatRole::kUser);
  EXPECT_EQ(r->messages[2].content, "Hello, you");
  EXPECT_EQ(r->messages[2].name, "x");
  EXPECT_EQ(r->messages[1].name, "");
  EXPECT_EQ(r->messages[3].role, ChatRole::kAssistant);

  const Endpoint chat = Endpoint::kChatCompletions;
  ExpectRefused(chat, R"({"model": "m"})", "messages: missing: expected an array of messages",
                "messages");
  ExpectRefused(chat, R"({"model": "m", "messages": []})",
                "messages: expected a non-empty array of messages, got an array of 0 element(s)",
                "messages");
  ExpectRefused(chat, R"({"model": "m", "messages": ["hi"]})",
                "messages[0]: expected an object {\"role\", \"content\"}, got a string (\"hi\")",
                "messages[0]");
  ExpectRefused(chat,
                R"({"model": "m", "messages": [{"role": "user", "content": "a"},
                    {"role": "user", "content": "b"}, {"role": "robot", "content": "c"}]})",
                "messages[2].role: expected one of \"system\", \"developer\", \"user\", "
                "\"assistant\", \"tool\", got a string (\"robot\")",
                "messages[2].role");
  ExpectRefused(chat, R"({"model": "m", "messages": [{"role": "tool", "content": "c"}]})",
                "messages[0].tool_call_id: missing: expected the id of the call this answers",
                "messages[0].tool_call_id");
  ExpectRefused(chat, R"({"model": "m", "messages": [{"role": "user", "content": null}]})",
                "messages[0].content: expected a string or an array of {\"type\": \"text\"} parts, "
                "got null",
                "messages[0].content");
  ExpectRefused(
      chat, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
      "messages[0].content[0].type: expected \"text\" (the only content this server's "
      "models take), got a string (\"image_url\")",
      "messages[0].content[0].type");
  ExpectRefused(
      chat,
      R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]})",
      "messages[0].content[0].text: expected a string, got an integer (3)",
      "messages[0].content[0].text");
  ExpectRefused(chat,
                R"({"model": "m", "messages": [{"role": "user", "content": "", "name": "a b"}]})",
                "messages[0].name: expected a name of 1 to 64 of a-z, A-Z, 0-9, _ and -, got a "
                "string (\"a b\")",
                "messages[0].name");
  ExpectRefused(
      chat,
      R"({"model": "m", "messages": [{"role": "assistant", "content": "", "refusal": "no"}]})",
      "messages[0].refusal: not supported by this server (no refusals: send the assistant's text "
      "as \"content\"), got a string (\"no\")",
      "messages[0].refusal");
  ExpectRefused(
      chat,
      R"({"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]})",
      "messages[0].tool_calls[0].id: expected a string, got null", "messages[0].tool_calls[0].id");
}

TEST(OpenAiRequest, MaxTokens) {
  EXPECT_EQ(Completion(R"(, "max_tokens": 10)").max_tokens, 10);
  EXPECT_EQ(Completion(R"(, "max_tokens": null)").max_tokens, std::nullopt);
  // vLLM's max_completion_tokens on completions too.
  EXPECT_EQ(Completion(R"(, "max_completion_tokens": 5)").max_tokens, 5);
  CompletionRefused(
      R"(, "max_completion_tokens": 0)",
      "max_completion_tokens: expected an integer in [1, 2147483647], got an integer (0)",
      "max_completion_tokens");
  CompletionRefused(R"(, "max_tokens": 0)",
                    "max_tokens: expected an integer in [1, 2147483647], got an integer (0)",
                    "max_tokens");
  CompletionRefused(R"(, "max_tokens": "5")",
                    "max_tokens: expected an integer in [1, 2147483647], got a string (\"5\")",
                    "max_tokens");
  CompletionRefused(R"(, "max_tokens": 1e300)",
                    "max_tokens: expected an integer in [1, 2147483647], got a number (1e+300)",
                    "max_tokens");
  const OpenAiRequest chat = Chat(R"(, "max_completion_tokens": 7)");
  EXPECT_EQ(chat.max_tokens, 7);
  EXPECT_EQ(chat.max_tokens_field, "max_completion_tokens");
  EXPECT_EQ(Chat(R"(, "max_tokens": 7, "max_completion_tokens": 7)").max_tokens, 7);
  ChatRefused(R"(, "max_tokens": 7, "max_completion_tokens": 8)",
              "max_completion_tokens: expected the same value as max_tokens (7) or max_tokens left "
              "out, got 8",
              "max_completion_tokens");
}

TEST(OpenAiRequest, Sampling) {
  EXPECT_EQ(Completion(R"(, "temperature": 0)").temperature, 0.f);
  EXPECT_EQ(Completion(R"(, "temperature": 0.7)").temperature, 0.7f);
  EXPECT_EQ(Completion(R"(, "temperature": 2)").temperature, 2.f);
  CompletionRefused(R"(, "temperature": 2.5)",
                    "temperature: expected a number in [0, 2], got a number (2.5)", "temperature");
  CompletionRefused(R"(, "temperature": -1)",
                    "temperature: expected a number in [0, 2], got an integer (-1)", "temperature");
  CompletionRefused(R"(, "temperature": 0.001)",
                    "temperature: expected 0 (greedy) or a number in [0.01, 2], got a number "
                    "(0.001)",
                    "temperature");
  CompletionRefused(R"(, "temperature": "hot")",
                    "temperature: expected a number in [0, 2], got a string (\"hot\")",
                    "temperature");
  EXPECT_EQ(Completion(R"(, "top_p": 0.5)").top_p, 0.5f);
  CompletionRefused(R"(, "top_p": 0)", "top_p: expected a number in (0, 1], got an integer (0)",
                    "top_p");
  CompletionRefused(R"(, "top_p": 1.5)", "top_p: expected a number in (0, 1], got a number (1.5)",
                    "top_p");
  EXPECT_EQ(Completion(R"(, "seed": 42)").seed, 42u);
  EXPECT_EQ(Completion(R"(, "seed": -1)").seed, ~uint64_t{0});
  CompletionRefused(R"(, "seed": 1.5)",
                    "seed: expected an integer in [-9223372036854775808, 9223372036854775807], "
                    "got a number (1.5)",
                    "seed");
  CompletionRefused(R"(, "seed": 18446744073709551615)",
                    "seed: expected an integer in [-9223372036854775808, 9223372036854775807], "
                    "got an integer (18446744073709551615)",
                    "seed");
}

TEST(OpenAiRequest, Stop) {
  EXPECT_EQ(Completion(R"(, "stop": "\n")").stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(Completion(R"(, "stop": ["a", "b", "c", "d"])").stop,
            (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(Completion(R"(, "stop": [])").stop, std::vector<std::string>{});
  EXPECT_EQ(Completion(R"(, "stop": null)").stop, std::nullopt);
  CompletionRefused(R"(, "stop": ["a", "b", "c", "d", "e"])",
                    "stop: expected a string or an array of at most 4 strings, got an array of 5 "
                    "element(s)",
                    "stop");
  CompletionRefused(R"(, "stop": 3)",
                    "stop: expected a string or an array of at most 4 strings, got an integer (3)",
                    "stop");
  CompletionRefused(R"(, "stop": "")",
                    "stop: expected a string of 1 to 256 bytes, got a string (\"\")", "stop");
  CompletionRefused(R"(, "stop": ["a", 1])",
                    "stop[1]: expected a string of 1 to 256 bytes, got an integer (1)", "stop[1]");
  CompletionRefused(absl::StrCat(R"(, "stop": [")", std::string(257, 'x'), R"("])"),
                    absl::StrCat("stop[0]: expected a string of 1 to 256 bytes, got a string (\"",
                                 std::string(64, 'x'), "...\" (257 bytes))"),
                    "stop[0]");
}

TEST(OpenAiRequest, Logprobs) {
  EXPECT_EQ(Completion(R"(, "logprobs": 5)").logprobs, 5);
  EXPECT_EQ(Completion(R"(, "logprobs": 0)").logprobs, 0);
  EXPECT_EQ(Completion(R"(, "logprobs": null)").logprobs, std::nullopt);
  CompletionRefused(R"(, "logprobs": 21)",
                    "logprobs: expected an integer in [0, 20], got an integer (21)", "logprobs");
  CompletionRefused(R"(, "logprobs": true)", "logprobs: expected an integer in [0, 20], got true",
                    "logprobs");
  EXPECT_EQ(Chat(R"(, "logprobs": true)").logprobs, 0);
  EXPECT_EQ(Chat(R"(, "logprobs": true, "top_logprobs": 3)").logprobs, 3);
  EXPECT_EQ(Chat(R"(, "logprobs": false)").logprobs, std::nullopt);
  ChatRefused(R"(, "logprobs": 2)", "logprobs: expected true or false, got an integer (2)",
              "logprobs");
  ChatRefused(R"(, "top_logprobs": 3)",
              "top_logprobs: needs \"logprobs\": true, got 3 with logprobs null", "top_logprobs");
  ChatRefused(R"(, "logprobs": true, "top_logprobs": 30)",
              "top_logprobs: expected an integer in [0, 20], got an integer (30)", "top_logprobs");
}

TEST(OpenAiRequest, ChoicesAndStreaming) {
  EXPECT_EQ(Completion(R"(, "n": 3)").n, 3);
  CompletionRefused(R"(, "n": 0)", "n: expected an integer in [1, 16], got an integer (0)", "n");
  CompletionRefused(R"(, "n": 17)", "n: expected an integer in [1, 16], got an integer (17)", "n");
  CompletionRefused(R"(, "n": 2, "session_id": "s")",
                    "n: a request continuing a session (session_id) takes n = 1 (one state to "
                    "write back), got 2",
                    "n");
  const OpenAiRequest s =
      Completion(R"(, "stream": true, "stream_options": {"include_usage": true})");
  EXPECT_TRUE(s.stream);
  EXPECT_TRUE(s.include_usage);
  EXPECT_FALSE(Completion(R"(, "stream": true, "stream_options": {})").include_usage);
  CompletionRefused(R"(, "stream": "yes")",
                    "stream: expected true or false, got a string (\"yes\")", "stream");
  CompletionRefused(R"(, "stream_options": {"include_usage": true})",
                    "stream_options: only with \"stream\": true", "stream_options");
  CompletionRefused(R"(, "stream": true, "stream_options": {"include_usage": 1})",
                    "stream_options.include_usage: expected true or false, got an integer (1)",
                    "stream_options.include_usage");
  CompletionRefused(R"(, "stream": true, "stream_options": [])",
                    "stream_options: expected an object {\"include_usage\": bool}, got an array of "
                    "0 element(s)",
                    "stream_options");
}

TEST(OpenAiRequest, UnsupportedFieldsAtTheirDefaultsAreAccepted) {
  Completion(R"(, "echo": false, "frequency_penalty": 0, "presence_penalty": 0.0,
               "logit_bias": {}, "suffix": "", "best_of": 1, "user": "u-1",
               "some_future_field": {"x": [1, 2]})");
  Chat(R"(, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
         "logit_bias": null, "parallel_tool_calls": false)");
  Chat(R"(, "store": false, "metadata": {}, "modalities": ["text"], "reasoning_effort": "none",
         "service_tier": "auto", "prompt_cache_options": {}, "safety_identifier": "s",
         "prompt_cache_key": "k", "audio": null, "verbosity": null, "web_search_options": null,
         "stream": true, "stream_options": {"include_obfuscation": false})");
}

TEST(OpenAiRequest, UnsupportedFieldsAreRefusedByName) {
  CompletionRefused(R"(, "frequency_penalty": 0.5)",
                    "frequency_penalty: not supported by this server (OpenAI's penalties subtract "
                    "from a token's logit per occurrence; the model's repetition penalty divides "
                    "it, which is not the same distribution: send 0 (or repetition_penalty, "
                    "vLLM's)), got a number (0.5)",
                    "frequency_penalty");
  CompletionRefused(R"(, "presence_penalty": 3)",
                    "presence_penalty: expected a number in [-2, 2], got an integer (3)",
                    "presence_penalty");
  // OpenAI's own service's fields, each by name.
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "audio": {"voice": "alloy", "format": "mp3"})", "audio"},
           {R"(, "modalities": ["text", "audio"])", "modalities"},
           {R"(, "store": true)", "store"},
           {R"(, "metadata": {"k": "v"})", "metadata"},
           {R"(, "moderation": {"model": "m"})", "moderation"},
           {R"(, "prediction": {"type": "content", "content": "x"})", "prediction"},
           {R"(, "web_search_options": {})", "web_search_options"},
           {R"(, "reasoning_effort": "high")", "reasoning_effort"},
           {R"(, "verbosity": "low")", "verbosity"},
           {R"(, "service_tier": "flex")", "service_tier"},
           {R"(, "prompt_cache_options": {"ttl": "30m"})", "prompt_cache_options"},
           {R"(, "prompt_cache_retention": "24h")", "prompt_cache_retention"},
           {R"(, "stream": true, "stream_options": {"include_obfuscation": true})",
            "stream_options.include_obfuscation"},
           {R"(, "safety_identifier": 1)", "safety_identifier"},
       }) {
    auto r = ParseChatCompletionRequest(
        R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}])" + body + "}");
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_TRUE(absl::StartsWith(r.status().message(), field + ": ")) << r.status();
    EXPECT_EQ(ErrorParam(r.status()), field);
  }
  CompletionRefused(R"(, "suffix": "end")",
                    "suffix: not supported by this server (no insertion, completions append "
                    "only), got a string (\"end\")",
                    "suffix");
  CompletionRefused(R"(, "best_of": 3)",
                    "best_of: not supported by this server (no ranking of choices; best_of equal "
                    "to n (1) is accepted), got an integer (3)",
                    "best_of");
  ChatRefused(R"(, "functions": [{"name": "f"}])",
              "functions: not supported by this server (the deprecated functions form: send "
              "tools), got an array of 1 element(s)",
              "functions");
  ChatRefused(R"(, "function_call": "auto")",
              "function_call: not supported by this server (the deprecated function_call form: "
              "send tool_choice), got a string (\"auto\")",
              "function_call");
  ChatRefused(R"(, "tool_choice": "auto")",
              "tool_choice: expected tools to choose from: the request has none", "tool_choice");
  ChatRefused(R"(, "user": 5)", "user: expected a string, got an integer (5)", "user");
}

// --- constraints: response_format and vLLM's guided_* ------------------------------------------

TEST(OpenAiRequest, NoConstraintByDefaultOrWithTextFormat) {
  EXPECT_FALSE(Chat("").constraint.has_value());
  EXPECT_FALSE(Chat(R"(, "response_format": {"type": "text"})").constraint.has_value());
  EXPECT_FALSE(Completion(R"(, "response_format": null, "guided_json": null, "guided_regex": null,
                             "guided_grammar": null, "guided_choice": null)")
                   .constraint.has_value());
  EXPECT_TRUE(Chat("").constraint_field.empty());
}

TEST(OpenAiRequest, ResponseFormatJsonObject) {
  for (const OpenAiRequest& r : {Chat(R"(, "response_format": {"type": "json_object"})"),
                                 Completion(R"(, "response_format": {"type": "json_object"})")}) {
    ASSERT_TRUE(r.constraint.has_value());
    EXPECT_EQ(r.constraint->kind, structured::Constraint::Kind::kJsonObject);
    EXPECT_EQ(r.constraint_field, "response_format");
  }
}

TEST(OpenAiRequest, ResponseFormatJsonSchemaKeepsTheSchemasKeyOrder) {
  // The parser sorts object keys; the schema reaches the engine in the client's order, which is
  // the order a constrained output writes the properties in.
  const OpenAiRequest r = Chat(R"(, "response_format": {"type": "json_schema", "json_schema": {
      "name": "Person_v-2", "strict": true, "description": "who",
      "schema": {"type": "object", "properties": {"zeta": {"type": "integer"},
                                                  "alpha": {"type": "string", "maxLength": 3}},
                 "required": ["zeta", "alpha"]}}},
      "other": {"schema": {"b": 1, "a": 2}})");
  ASSERT_TRUE(r.constraint.has_value());
  EXPECT_EQ(r.constraint->kind, structured::Constraint::Kind::kJsonSchema);
  EXPECT_EQ(r.constraint->text,
            R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string",)"
            R"("maxLength":3}},"required":["zeta","alpha"]})");
  EXPECT_EQ(r.constraint_field, "response_format.json_schema.schema");
  // strict false (or absent) constrains all the same; the schema may hold arrays of objects.
  const OpenAiRequest loose = Completion(R"(, "response_format": {"type": "json_schema",
      "json_schema": {"name": "n", "strict": false,
                      "schema": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}})");
  ASSERT_TRUE(loose.constraint.has_value());
  EXPECT_EQ(loose.constraint->text, R"({"anyOf":[{"type":"integer"},{"type":"string"}]})");
  // A duplicate key keeps the last value, as the first parse does.
  const OpenAiRequest twice = Completion(R"(, "response_format": {"type": "json_schema",
      "json_schema": {"name": "n", "schema": {"type": "string"}, "schema": {"type": "integer"}}})");
  ASSERT_TRUE(twice.constraint.has_value());
  EXPECT_EQ(twice.constraint->text, R"({"type":"integer"})");
}

TEST(OpenAiRequest, ResponseFormatRefusals) {
  ChatRefused(R"(, "response_format": "json")",
              "response_format: expected an object {\"type\": \"text\"}, {\"type\": "
              "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"name\", "
              "\"schema\"}}, got a string (\"json\")",
              "response_format");
  ChatRefused(R"(, "response_format": {})",
              "response_format.type: missing: expected one of \"text\", \"json_object\", "
              "\"json_schema\"",
              "response_format.type");
  ChatRefused(R"(, "response_format": {"type": "yaml"})",
              "response_format.type: expected one of \"text\", \"json_object\", \"json_schema\", "
              "got a string (\"yaml\")",
              "response_format.type");
  ChatRefused(R"(, "response_format": {"type": 1})",
              "response_format.type: expected one of \"text\", \"json_object\", \"json_schema\", "
              "got an integer (1)",
              "response_format.type");
  ChatRefused(R"(, "response_format": {"type": "json_schema"})",
              "response_format.json_schema: missing: expected an object {\"name\", \"schema\", "
              "\"strict\", \"description\"} with \"type\": \"json_schema\"",
              "response_format.json_schema");
  ChatRefused(R"(, "response_format": {"type": "json_schema", "json_schema": []})",
              "response_format.json_schema: expected an object {\"name\", \"schema\", \"strict\", "
              "\"description\"}, got an array of 0 element(s)",
              "response_format.json_schema");
  const std::string name_what = "a string of 1 to 64 characters from a-z, A-Z, 0-9, _ and -";
  CompletionRefused(
      R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}})",
      "response_format.json_schema.name: missing: expected " + name_what,
      "response_format.json_schema.name");
  for (const auto& [name, got] : std::vector<std::pair<std::string, std::string>>{
           {R"("")", R"(a string (""))"},
           {R"("has space")", R"(a string ("has space"))"},
           {R"("dot.ted")", R"(a string ("dot.ted"))"},
           {"\"" + std::string(65, 'a') + "\"",
            "a string (\"" + std::string(64, 'a') + "...\" (65 bytes))"},
           {"7", "an integer (7)"}}) {
    CompletionRefused(
        absl::StrCat(R"(, "response_format": {"type": "json_schema",
                                      "json_schema": {"name": )",
                     name, R"(, "schema": {}}})"),
        absl::StrCat("response_format.json_schema.name: expected ", name_what, ", got ", got),
        "response_format.json_schema.name");
  }
  // 64 characters is the most a name may have.
  EXPECT_TRUE(Completion(absl::StrCat(R"(, "response_format": {"type": "json_schema",
                                         "json_schema": {"name": ")",
                                      std::string(64, 'a'), R"(", "schema": {}}})"))
                  .constraint.has_value());
  ChatRefused(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "n"}})",
              "response_format.json_schema.schema: missing: expected a JSON schema (an object)",
              "response_format.json_schema.schema");
  ChatRefused(
      R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": "{}"}})",
      "response_format.json_schema.schema: expected a JSON schema (an object), got a string "
      "(\"{}\")",
      "response_format.json_schema.schema");
  ChatRefused(R"(, "response_format": {"type": "json_schema",
                   "json_schema": {"name": "n", "schema": {}, "strict": "yes"}})",
              "response_format.json_schema.strict: expected true or false, got a string "
              "(\"yes\")",
              "response_format.json_schema.strict");
  ChatRefused(R"(, "response_format": {"type": "json_schema",
                   "json_schema": {"name": "n", "schema": {}, "description": 3}})",
              "response_format.json_schema.description: expected a string, got an integer (3)",
              "response_format.json_schema.description");
}

TEST(OpenAiRequest, GuidedJsonTakesAnObjectOrAString) {
  const OpenAiRequest object =
      Completion(R"(, "guided_json": {"type": "object", "properties": {"b": {}, "a": {}}})");
  ASSERT_TRUE(object.constraint.has_value());
  EXPECT_EQ(object.constraint->kind, structured::Constraint::Kind::kJsonSchema);
  EXPECT_EQ(object.constraint->text, R"({"type":"object","properties":{"b":{},"a":{}}})");
  EXPECT_EQ(object.constraint_field, "guided_json");
  // A string is passed on as sent: the compiler says whether it is a schema.
  const OpenAiRequest text = Chat(R"(, "guided_json": "{\"type\": \"integer\"}")");
  ASSERT_TRUE(text.constraint.has_value());
  EXPECT_EQ(text.constraint->text, R"({"type": "integer"})");
  for (const auto& [value, got] : std::vector<std::pair<std::string, std::string>>{
           {R"("")", R"(a string (""))"}, {"[]", "an array of 0 element(s)"}, {"true", "true"}}) {
    CompletionRefused(absl::StrCat(R"(, "guided_json": )", value),
                      absl::StrCat("guided_json: expected a JSON schema: an object, or a string "
                                   "holding one, got ",
                                   got),
                      "guided_json");
  }
}

TEST(OpenAiRequest, GuidedRegexGrammarAndChoice) {
  const OpenAiRequest regex = Completion(R"(, "guided_regex": "[a-z]+\\d")");
  ASSERT_TRUE(regex.constraint.has_value());
  EXPECT_EQ(regex.constraint->kind, structured::Constraint::Kind::kRegex);
  EXPECT_EQ(regex.constraint->text, R"([a-z]+\d)");
  EXPECT_EQ(regex.constraint_field, "guided_regex");

  const OpenAiRequest grammar = Chat(R"(, "guided_grammar": "root ::= \"yes\" | \"no\"")");
  ASSERT_TRUE(grammar.constraint.has_value());
  EXPECT_EQ(grammar.constraint->kind, structured::Constraint::Kind::kGrammar);
  EXPECT_EQ(grammar.constraint->text, R"(root ::= "yes" | "no")");
  EXPECT_EQ(grammar.constraint_field, "guided_grammar");

  const OpenAiRequest choice = Chat(R"(, "guided_choice": ["yes", "no", "\u00e9"])");
  ASSERT_TRUE(choice.constraint.has_value());
  EXPECT_EQ(choice.constraint->kind, structured::Constraint::Kind::kChoice);
  EXPECT_EQ(choice.constraint->choices, (std::vector<std::string>{"yes", "no", "\xc3\xa9"}));
  EXPECT_EQ(choice.constraint_field, "guided_choice");

  CompletionRefused(R"(, "guided_regex": "")",
                    "guided_regex: expected a non-empty string (a regular expression the whole "
                    "output matches), got a string (\"\")",
                    "guided_regex");
  CompletionRefused(R"(, "guided_regex": ["a"])",
                    "guided_regex: expected a non-empty string (a regular expression the whole "
                    "output matches), got an array of 1 element(s)",
                    "guided_regex");
  ChatRefused(R"(, "guided_grammar": 1)",
              "guided_grammar: expected a non-empty string (an XGrammar EBNF grammar whose start "
              "rule is root), got an integer (1)",
              "guided_grammar");
  ChatRefused(R"(, "guided_choice": [])",
              "guided_choice: expected a non-empty array of strings, got an array of 0 element(s)",
              "guided_choice");
  ChatRefused(R"(, "guided_choice": "yes")",
              "guided_choice: expected a non-empty array of strings, got a string (\"yes\")",
              "guided_choice");
  ChatRefused(R"(, "guided_choice": ["yes", 2])",
              "guided_choice[1]: expected a non-empty string, got an integer (2)",
              "guided_choice[1]");
  ChatRefused(R"(, "guided_choice": ["yes", ""])",
              "guided_choice[1]: expected a non-empty string, got a string (\"\")",
              "guided_choice[1]");
}

TEST(OpenAiRequest, OneConstraintSourcePerRequest) {
  ChatRefused(R"(, "response_format": {"type": "json_object"}, "guided_regex": "a+")",
              "guided_regex: expected one constraint per request, got two: response_format and "
              "guided_regex both constrain the output; send one",
              "guided_regex");
  CompletionRefused(R"(, "guided_json": {}, "guided_choice": ["a"])",
                    "guided_choice: expected one constraint per request, got two: guided_json "
                    "and guided_choice both constrain the output; send one",
                    "guided_choice");
  CompletionRefused(R"(, "guided_regex": "a", "guided_grammar": "root ::= \"a\"")",
                    "guided_grammar: expected one constraint per request, got two: guided_regex "
                    "and guided_grammar both constrain the output; send one",
                    "guided_grammar");
  CompletionRefused(R"(, "response_format": {"type": "json_schema",
                          "json_schema": {"name": "n", "schema": {}}}, "guided_json": {})",
                    "guided_json: expected one constraint per request, got two: response_format "
                    "and guided_json both constrain the output; send one",
                    "guided_json");
  // A text response_format constrains nothing: it goes with a guided_* field.
  EXPECT_TRUE(Chat(R"(, "response_format": {"type": "text"}, "guided_regex": "a+")")
                  .constraint.has_value());
}

TEST(OpenAiRequest, SessionAndStateExtensions) {
  EXPECT_EQ(Completion(R"(, "session_id": "abc")").session_id, "abc");
  const OpenAiRequest r = Completion(R"(, "state": "AAEC/w==", "return_state": true)");
  EXPECT_EQ(r.state, std::string("\x00\x01\x02\xff", 4));
  EXPECT_TRUE(r.return_state);
  CompletionRefused(R"(, "state": "not base64!")",
                    "state: expected a state blob in base64 (RFC 4648), got a string (\"not "
                    "base64!\")",
                    "state");
  CompletionRefused(R"(, "state": 5)", "state: expected a string, got an integer (5)", "state");
  CompletionRefused(R"(, "session_id": "s", "state": "AAEC")",
                    "state: set session_id or state, not both", "state");
  CompletionRefused(R"(, "return_state": 1)",
                    "return_state: expected true or false, got an integer (1)", "return_state");
}

model::ModelConfig ChatModel() {
  model::ModelConfig c;
  c.name = "fake-lm";
  c.architecture = model::Architecture::kLanguage;
  model::ChatTemplate t;
  t.user = {"Q: ", "\n"};
  t.assistant = {"A: ", "\n"};
  t.generation_prompt = "A:";
  t.stop = {"\nQ:"};
  c.chat_template = t;
  return c;
}

TEST(OpenAiRequest, VllmSamplingAndStopTokenIds) {
  const OpenAiRequest r = Completion(
      R"(, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.3, "stop_token_ids": [7, 2047])");
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.min_p, 0.05f);
  EXPECT_EQ(r.repetition_penalty, 1.3f);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{7, 2047}));
  EXPECT_EQ(Completion(R"(, "top_k": -1)").top_k, 0);  // vLLM's "off"
  EXPECT_TRUE(SetsSampling(Completion(R"(, "min_p": 0.1)")));
  EXPECT_FALSE(SetsSampling(Completion(R"(, "stop_token_ids": [1])")));
  CompletionRefused(R"(, "top_k": -2)",
                    "top_k: expected an integer in [-1, 2147483647], got an integer (-2)", "top_k");
  CompletionRefused(R"(, "min_p": 1)", "min_p: expected a number in [0, 1), got an integer (1)",
                    "min_p");
  CompletionRefused(R"(, "repetition_penalty": 0)",
                    "repetition_penalty: expected a number in [0.01, 100], got an integer (0)",
                    "repetition_penalty");
  CompletionRefused(
      R"(, "stop_token_ids": [1, -1])",
      "stop_token_ids[1]: expected an integer in [0, 2147483647], got an integer (-1)",
      "stop_token_ids[1]");
  CompletionRefused(R"(, "stop_token_ids": 3)",
                    "stop_token_ids: expected an array of token ids, got an integer (3)",
                    "stop_token_ids");

  std::string storage;
  auto in = ToGenerationInput(r, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->sampling->top_k, 40);
  EXPECT_EQ(in->sampling->min_p, 0.05f);
  EXPECT_EQ(in->sampling->repetition_penalty, 1.3f);
  EXPECT_EQ(in->stop->token_ids, (std::vector<int32_t>{7, 2047}));
  in = ToGenerationInput(Chat(R"(, "stop_token_ids": [5])"), ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->stop->token_ids, std::vector<int32_t>{5});
  // A continued completion that sets only stop_token_ids keeps its state's sampling.
  in = ToGenerationInput(Completion(R"(, "session_id": "s", "stop_token_ids": [5])"), ChatModel(),
                         &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_FALSE(in->sampling.has_value());
  EXPECT_EQ(in->stop->token_ids, std::vector<int32_t>{5});
}

TEST(OpenAiRequest, LogitBias) {
  const OpenAiRequest r = Completion(R"(, "logit_bias": {"50": -100, "7": 100, "300": 0.5})");
  model::ModelConfig config = ChatModel();
  config.language.vocab_size = 301;
  EXPECT_EQ(r.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, 100.f}, {50, -100.f}, {300, 0.5f}}));
  std::string storage;
  auto in = ToGenerationInput(r, config, &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->logit_bias, r.logit_bias);
  config.language.vocab_size = 300;  // id 300 is past it
  in = ToGenerationInput(r, config, &storage);
  EXPECT_EQ(in.status().message(),
            "logit_bias: expected token ids of model \"fake-lm\"'s vocabulary (0 to 299), got 300");
  EXPECT_EQ(ErrorParam(in.status()), "logit_bias");
  CompletionRefused(R"(, "logit_bias": 1)",
                    "logit_bias: expected an object mapping token ids (as strings) to biases, got "
                    "an integer (1)",
                    "logit_bias");
  CompletionRefused(R"(, "logit_bias": {"7": 101})",
                    "logit_bias[\"7\"]: expected a number in [-100, 100], got an integer (101)",
                    "logit_bias[\"7\"]");
  CompletionRefused(R"(, "logit_bias": {"7": "x"})",
                    "logit_bias[\"7\"]: expected a number in [-100, 100], got a string (\"x\")",
                    "logit_bias[\"7\"]");
  CompletionRefused(R"(, "logit_bias": {"-1": 1})",
                    "logit_bias: expected token ids as decimal strings, got the key \"-1\"",
                    "logit_bias");
  CompletionRefused(R"(, "logit_bias": {"99999999999": 1})",
                    "logit_bias: expected token ids as decimal strings, got the key "
                    "\"99999999999\"",
                    "logit_bias");
  CompletionRefused(R"(, "logit_bias": {"7": 1, "07": 2})",
                    "logit_bias: expected each token id once, got 7 twice", "logit_bias");
  std::string many = R"(, "logit_bias": {)";
  for (int i = 0; i <= 300; ++i) absl::StrAppend(&many, i == 0 ? "" : ", ", "\"", i, "\": 1");
  many += "}";
  CompletionRefused(many, "logit_bias: expected at most 300 token ids, got 301", "logit_bias");
}

TEST(OpenAiToGenerationInput, CompletionDefaultsAreOpenAis) {
  const OpenAiRequest r = Completion("");
  std::string storage;
  auto in = ToGenerationInput(r, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->prompt_text, "Hi");
  ASSERT_TRUE(in->sampling.has_value());
  EXPECT_EQ(in->sampling->temperature, 1.f);
  EXPECT_EQ(in->sampling->top_p, 1.f);
  EXPECT_EQ(in->sampling->seed, 0u);
  ASSERT_TRUE(in->stop.has_value());
  EXPECT_TRUE(in->stop->strings.empty());
  EXPECT_EQ(in->max_new_tokens, 0);
  EXPECT_EQ(in->top_logprobs, 0);
  EXPECT_FALSE(in->logprobs);
}

TEST(OpenAiToGenerationInput, ContinuedKeepsTheStatesUnlessSet) {
  std::string storage;
  auto in = ToGenerationInput(Completion(R"(, "session_id": "s")"), ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_FALSE(in->sampling.has_value());
  EXPECT_FALSE(in->stop.has_value());
  in = ToGenerationInput(Completion(R"(, "session_id": "s", "seed": 3, "stop": "x")"), ChatModel(),
                         &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(in->sampling.has_value());
  EXPECT_EQ(in->sampling->seed, 3u);
  EXPECT_EQ(in->sampling->temperature, 1.f);
  EXPECT_EQ(in->stop->strings, std::vector<std::string>{"x"});
}

TEST(OpenAiToGenerationInput, ChatRendersAndMergesStops) {
  auto r = ParseChatCompletionRequest(R"({"model": "fake-lm", "messages": [
      {"role": "user", "content": "Who?"}, {"role": "assistant", "content": "Me."},
      {"role": "user", "content": "Why?"}], "stop": ["\nQ:", "!"], "temperature": 0,
      "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 9})");
  ASSERT_TRUE(r.ok()) << r.status();
  std::string storage;
  auto in = ToGenerationInput(*r, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(storage, "Q: Who?\nA: Me.\nQ: Why?\nA:");
  EXPECT_EQ(in->prompt_text, storage);
  EXPECT_EQ(in->stop->strings, (std::vector<std::string>{"\nQ:", "!"}));
  EXPECT_EQ(in->sampling->temperature, 0.f);
  EXPECT_TRUE(in->logprobs);
  EXPECT_EQ(in->top_logprobs, 2);
  EXPECT_EQ(in->max_new_tokens, 9);
  EXPECT_EQ(FieldNames(*r).max_new_tokens, "max_completion_tokens");
  EXPECT_EQ(FieldNames(*r).prompt_text, "messages");
}

// Under a constraint a chat stops on the request's own stop strings only: the constraint ends the
// reply, and a template stop string (a closing quote) would cut JSON at its first quote.
TEST(OpenAiToGenerationInput, ConstrainedChatDropsTheTemplatesStops) {
  std::string storage;
  auto in = ToGenerationInput(Chat(R"(, "response_format": {"type": "json_object"})"), ChatModel(),
                              &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(storage, "Q: Hi\nA:");  // the same prompt: generation starts after the assistant prefix
  ASSERT_TRUE(in->stop.has_value());
  EXPECT_TRUE(in->stop->strings.empty());
  in = ToGenerationInput(Chat(R"(, "guided_regex": "[a-z]+", "stop": ["!"])"), ChatModel(),
                         &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->stop->strings, std::vector<std::string>{"!"});
  // A constrained completion keeps its stop strings as an unconstrained one.
  in = ToGenerationInput(Completion(R"(, "guided_regex": "[a-z]+", "stop": "x")"), ChatModel(),
                         &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->stop->strings, std::vector<std::string>{"x"});
}

// The engine is asked for each token's own logprob and exactly the alternatives shown.
TEST(OpenAiToGenerationInput, LogprobsAskTheEngineForTheChosenTokensAndTheShownAlternatives) {
  std::string storage;
  const auto engine_asks = [&](const OpenAiRequest& r) {
    auto in = ToGenerationInput(r, ChatModel(), &storage);
    EXPECT_TRUE(in.ok()) << in.status();
    return in.ok() ? std::make_pair(in->logprobs, in->top_logprobs) : std::make_pair(false, -1);
  };
  EXPECT_EQ(engine_asks(Chat(R"(, "logprobs": true)")), std::make_pair(true, 0));
  EXPECT_EQ(engine_asks(Chat(R"(, "logprobs": true, "top_logprobs": 3)")), std::make_pair(true, 3));
  EXPECT_EQ(engine_asks(Chat(R"(, "logprobs": false)")), std::make_pair(false, 0));
  EXPECT_EQ(engine_asks(Chat("")), std::make_pair(false, 0));
  EXPECT_EQ(engine_asks(Completion(R"(, "logprobs": 0)")), std::make_pair(true, 0));
  EXPECT_EQ(engine_asks(Completion(R"(, "logprobs": 5)")), std::make_pair(true, 5));
  EXPECT_EQ(engine_asks(Completion("")), std::make_pair(false, 0));
}

TEST(OpenAiToGenerationInput, ChatNeedsATemplate) {
  model::ModelConfig plain = ChatModel();
  plain.chat_template.reset();
  std::string storage;
  auto in = ToGenerationInput(Chat(""), plain, &storage);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in.status().message(),
            "model: \"fake-lm\" has no chat template (config.json \"chat_template\"), so it "
            "cannot serve /v1/chat/completions: send the prompt to /v1/completions instead");
  EXPECT_EQ(ErrorParam(in.status()), "model");
}

TEST(OpenAiToGenerationInput, ChoiceSeeds) {
  EXPECT_EQ(service::ChoiceSeed(7, 0), 7u);
  EXPECT_NE(service::ChoiceSeed(7, 1), 7u);
  EXPECT_NE(service::ChoiceSeed(7, 1), service::ChoiceSeed(7, 2));
  EXPECT_NE(service::ChoiceSeed(7, 1), service::ChoiceSeed(8, 1));
}

// The input runs through the same builder as tost.v1 Generate, whose errors name this request's
// fields.
TEST(OpenAiToGenerationInput, BuildsAnEngineRequestNamingOpenAiFields) {
  testing::FakeLanguageModel lm;
  FakeClock clock;
  auto scheduler = GenerationScheduler::Create(lm, {}, &clock);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  ServiceLimits limits;
  std::string storage;

  const OpenAiRequest ok = Completion(R"(, "max_tokens": 5, "stop": ["zz"], "seed": 9)");
  auto in = ToGenerationInput(ok, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  auto req = BuildGenerationRequest(*in, **scheduler, std::nullopt, limits, FieldNames(ok));
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->prompt, (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(req->max_new_tokens, 5);
  EXPECT_EQ(req->state.stop_strings, std::vector<std::string>{"zz"});
  EXPECT_EQ(req->state.sampling.seed, 9u);
  EXPECT_TRUE((*scheduler)->CheckState(req->state).ok());

  const OpenAiRequest big = Chat(R"(, "max_completion_tokens": 5000)");
  in = ToGenerationInput(big, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  req = BuildGenerationRequest(*in, **scheduler, std::nullopt, limits, FieldNames(big));
  ASSERT_FALSE(req.ok());
  EXPECT_EQ(req.status().message(), "max_completion_tokens must be in [0, 4096], got 5000");

  limits.max_prompt_bytes = 3;
  const OpenAiRequest ids = *ParseCompletionRequest(R"({"model": "m", "prompt": [1, 2, 3, 4]})");
  in = ToGenerationInput(ids, ChatModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  req = BuildGenerationRequest(*in, **scheduler, std::nullopt, limits, FieldNames(ids));
  ASSERT_FALSE(req.ok());
  EXPECT_EQ(req.status().message(), "prompt holds 4 ids, more than the limit of 3");
}

TEST(OpenAiRequest, Echo) {
  const OpenAiRequest r = Completion(R"(, "echo": true, "logprobs": 1, "max_tokens": 0)");
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_FALSE(Completion(R"(, "echo": false)").echo);
  EXPECT_FALSE(Chat(R"(, "echo": true)").echo);  // not a chat field: ignored there
  CompletionRefused(R"(, "echo": 1)", "echo: expected true or false, got an integer (1)", "echo");
  CompletionRefused(R"(, "max_tokens": 0)",
                    "max_tokens: expected an integer in [1, 2147483647], got an integer (0)",
                    "max_tokens");
  CompletionRefused(R"(, "echo": true, "session_id": "s")",
                    "echo: expected a prompt that starts a sequence, got one continuing a session "
                    "(session_id): its earlier tokens are not in the request to echo",
                    "echo");
}

TEST(OpenAiRequest, TokenizeAndDetokenize) {
  auto t = ParseTokenizeRequest(R"({"prompt": "Hi", "add_special_tokens": false})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->prompt, "Hi");
  EXPECT_EQ(t->model, "");
  t = ParseTokenizeRequest(R"({"model": 3, "prompt": "Hi"})");
  EXPECT_EQ(t.status().message(), "model: expected a non-empty string, got an integer (3)");
  t = ParseTokenizeRequest(R"({"model": "m"})");
  EXPECT_EQ(t.status().message(), "prompt: missing: expected the text to tokenize");
  auto d = ParseDetokenizeRequest(R"({"model": "m", "tokens": [1, 2]})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tokens, (std::vector<int32_t>{1, 2}));
  d = ParseDetokenizeRequest(R"({"tokens": [1, -2]})");
  EXPECT_EQ(d.status().message(),
            "tokens[1]: expected an integer in [0, 2147483647], got an integer (-2)");
  EXPECT_EQ(ErrorParam(d.status()), "tokens[1]");
}

TEST(OpenAiRequest, StructuredOutputs) {
  using Kind = structured::Constraint::Kind;
  const auto constraint_of = [](const std::string& extra) {
    const OpenAiRequest r = Completion(extra);
    EXPECT_TRUE(r.constraint.has_value()) << extra;
    return std::make_pair(r.constraint.value_or(structured::Constraint{}), r.constraint_field);
  };
  auto [json_schema, json_field] =
      constraint_of(R"(, "structured_outputs": {"json": {"type": "object", "b": 1, "a": 2}})");
  EXPECT_EQ(json_schema.kind, Kind::kJsonSchema);
  EXPECT_EQ(json_schema.text, R"({"type":"object","b":1,"a":2})");  // the client's key order
  EXPECT_EQ(json_field, "structured_outputs.json");
  EXPECT_EQ(
      constraint_of(R"(, "structured_outputs": {"json": "{\"type\": \"string\"}"})").first.text,
      R"({"type": "string"})");
  EXPECT_EQ(
      constraint_of(R"(, "structured_outputs": {"regex": "[a-z]+", "grammar": null})").first.kind,
      Kind::kRegex);
  EXPECT_EQ(constraint_of(R"(, "structured_outputs": {"grammar": "root ::= \"a\""})").first.kind,
            Kind::kGrammar);
  auto [choice, choice_field] =
      constraint_of(R"(, "structured_outputs": {"choice": ["yes", "no"]})");
  EXPECT_EQ(choice.choices, (std::vector<std::string>{"yes", "no"}));
  EXPECT_EQ(choice_field, "structured_outputs.choice");
  EXPECT_EQ(constraint_of(R"(, "structured_outputs": {"json_object": true})").first.kind,
            Kind::kJsonObject);
  EXPECT_FALSE(Completion(R"(, "structured_outputs": {"json_object": false})").constraint);
  EXPECT_FALSE(Completion(R"(, "structured_outputs": null)").constraint);

  CompletionRefused(R"(, "structured_outputs": {"regex": "a", "choice": ["a"]})",
                    "structured_outputs.regex: expected one constraint in structured_outputs, got "
                    "two: structured_outputs.choice and structured_outputs.regex",
                    "structured_outputs.regex");
  CompletionRefused(R"(, "structured_outputs": {"regex": "a"}, "guided_regex": "b")",
                    "structured_outputs: expected one constraint per request, got two: "
                    "guided_regex and structured_outputs both constrain the output; send one",
                    "structured_outputs");
  CompletionRefused(R"(, "structured_outputs": {"disable_any_whitespace": true})",
                    "structured_outputs.disable_any_whitespace: not supported by this server (this "
                    "server's constraints take no backend settings), got true",
                    "structured_outputs.disable_any_whitespace");
  CompletionRefused(
      R"(, "structured_outputs": {"choice": []})",
      "structured_outputs.choice: expected a non-empty array of strings, got an array "
      "of 0 element(s)",
      "structured_outputs.choice");
  CompletionRefused(R"(, "structured_outputs": [])",
                    "structured_outputs: expected an object with one of \"json\", \"regex\", "
                    "\"choice\", \"grammar\", \"json_object\", \"structural_tag\", got an "
                    "array of 0 element(s)",
                    "structured_outputs");
  auto [tag, tag_field] = constraint_of(
      R"(, "structured_outputs": {"structural_tag": {"type": "structural_tag", "format": {}}})");
  EXPECT_EQ(tag.kind, Kind::kStructuralTag);
  EXPECT_EQ(tag.text, R"({"type":"structural_tag","format":{}})");
  EXPECT_EQ(tag_field, "structured_outputs.structural_tag");
  EXPECT_EQ(constraint_of(R"(, "structured_outputs": {"structural_tag": "{}"})").first.text, "{}");
  CompletionRefused(R"(, "structured_outputs": {"structural_tag": 1})",
                    "structured_outputs.structural_tag: expected an XGrammar structural tag "
                    "{\"type\": \"structural_tag\", \"format\": ...}: an object, or a string "
                    "holding one, got an integer (1)",
                    "structured_outputs.structural_tag");
}

model::ModelConfig ToolModel() {
  model::ModelConfig c = ChatModel();
  c.chat_template->tools =
      model::ChatTemplate::Tools{"Tools: ", "\n", "<call>", "</call>", {"Result: ", "\n"}};
  return c;
}

constexpr char kWeather[] =
    R"({"type": "function", "function": {"name": "weather", "description": "d",
        "parameters": {"type": "object", "properties": {"town": {"type": "string"},
                       "days": {"type": "integer"}}, "required": ["town"]}}})";

TEST(OpenAiRequest, Tools) {
  const OpenAiRequest r = Chat(absl::StrCat(R"(, "tools": [)", kWeather, "]"));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "weather");
  EXPECT_EQ(r.tools[0].description, "d");
  // The parameters as sent: their properties in the client's order.
  EXPECT_EQ(
      r.tools[0].parameters,
      R"({"type":"object","properties":{"town":{"type":"string"},"days":{"type":"integer"}},"required":["town"]})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(r.constraint.has_value());
  EXPECT_TRUE(r.parallel_tool_calls);

  const OpenAiRequest required = Chat(absl::StrCat(
      R"(, "tool_choice": "required", "parallel_tool_calls": false, "tools": [)", kWeather, "]"));
  EXPECT_EQ(required.tool_choice, ToolChoice::kRequired);
  ASSERT_TRUE(required.constraint.has_value());
  EXPECT_EQ(required.constraint_field, "tools");
  EXPECT_EQ(required.constraint->text,
            R"({"type":"array","items":{"type":"object","properties":{"name":{"const":"weather"},)"
            R"("arguments":{"$ref":"#/$defs/tool_0"}},"required":["name","arguments"],)"
            R"("additionalProperties":false},"minItems":1,"maxItems":1,"$defs":{"tool_0":)"
            R"({"type":"object","properties":{"town":{"type":"string"},"days":{"type":"integer"}},)"
            R"("required":["town"]}}})");
  // A recursive schema stays recursive in itself: its "$ref": "#" is rebased.
  const OpenAiRequest recursive = Chat(
      R"(, "tool_choice": {"type": "function", "function": {"name": "t"}}, "tools": [
          {"type": "function", "function": {"name": "u"}},
          {"type": "function", "function": {"name": "t", "parameters": {"type": "object",
           "properties": {"child": {"$ref": "#"}}}}}])");
  EXPECT_EQ(recursive.tool_choice, ToolChoice::kNamed);
  EXPECT_NE(
      recursive.constraint->text.find(
          R"("$defs":{"tool_1":{"type":"object","properties":{"child":{"$ref":"#/$defs/tool_1"}}}})"),
      std::string::npos)
      << recursive.constraint->text;
  EXPECT_EQ(recursive.constraint->text.find("tool_0"), std::string::npos);  // only the named one

  ChatRefused(R"(, "tools": [{"type": "function", "function": {"name": "a b"}}])",
              "tools[0].function.name: expected a name of 1 to 64 of a-z, A-Z, 0-9, _ and -, got a "
              "string (\"a b\")",
              "tools[0].function.name");
  ChatRefused(R"(, "tools": [{"type": "code_interpreter"}])",
              "tools[0].type: expected \"function\" (the only kind of tool here), got a string "
              "(\"code_interpreter\")",
              "tools[0].type");
  ChatRefused(absl::StrCat(R"(, "tools": [)", kWeather, ",", kWeather, "]"),
              "tools[1].function.name: expected distinct function names, got \"weather\" twice",
              "tools[1].function.name");
  ChatRefused(absl::StrCat(R"(, "tool_choice": "sometimes", "tools": [)", kWeather, "]"),
              "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
              "\"function\": {\"name\"}}, got a string (\"sometimes\")",
              "tool_choice");
  ChatRefused(R"(, "tool_choice": "required", "tools": [{"type": "function", "function":
                 {"name": "f", "parameters": {"$ref": "#"}}}])",
              "tools[0].function.parameters: expected a schema some finite JSON value satisfies, "
              "got one whose references recurse without end (every branch comes back to a schema "
              "it is inside)",
              "tools[0].function.parameters");
  ChatRefused(R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
                 {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                  "required": ["a"]}}}], "response_format": {"type": "json_object"},
                 "tool_choice": "required")",
              "tool_choice: a required call is constrained by the functions' schemas, and "
              "response_format constrains the output too: send one of them",
              "tool_choice");
}

TEST(OpenAiToGenerationInput, ToolsAreRenderedAndARequiredCallOpensTheReply) {
  const std::string body = absl::StrCat(
      R"({"model": "fake-lm", "messages": [{"role": "user", "content": "Rain?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
           "function": {"name": "weather", "arguments": "{\"town\": \"Bath\"}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "wet"}], "tools": [)",
      kWeather, R"(], "tool_choice": "required"})");
  auto r = ParseChatCompletionRequest(body);
  ASSERT_TRUE(r.ok()) << r.status();
  std::string storage;
  auto in = ToGenerationInput(*r, ToolModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(
      storage,
      R"(Tools: [{"name":"weather","description":"d","parameters":{"type":"object",)"
      R"("properties":{"town":{"type":"string"},"days":{"type":"integer"}},"required":["town"]}}])"
      "\nQ: Rain?\nA: <call>"
      R"([{"name":"weather","arguments":{"town":"Bath"}}])"
      "</call>\nResult: wet\nA:<call>");
  EXPECT_TRUE(in->stop->strings.empty());  // the constraint ends the reply
  // auto: the reply may call; the end of a call ends it.
  r->tool_choice = ToolChoice::kAuto;
  r->constraint.reset();
  in = ToGenerationInput(*r, ToolModel(), &storage);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE(absl::EndsWith(storage, "Result: wet\nA:"));
  EXPECT_EQ(in->stop->strings, (std::vector<std::string>{"\nQ:", "</call>"}));
  // A template without a tool format: a 400 that says so, naming tools.
  in = ToGenerationInput(*r, ChatModel(), &storage);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(ErrorParam(in.status()), "messages[1].tool_calls");
  EXPECT_THAT(std::string(in.status().message()),
              ::testing::HasSubstr("has no tool format in its chat template"));
  auto plain = ParseChatCompletionRequest(
      absl::StrCat(R"({"model": "fake-lm", "messages": [{"role": "user", "content": "Rain?"}],
                      "tools": [)",
                   kWeather, "]}"));
  ASSERT_TRUE(plain.ok());
  in = ToGenerationInput(*plain, ChatModel(), &storage);
  EXPECT_EQ(ErrorParam(in.status()), "tools");
}

}  // namespace
}  // namespace tost::service::openai
