// The OpenAI-compatible request parser: every field's accepted and refused forms, the exact
// messages (field, expected, got) and the "param" each refusal carries; then the request as the
// engine's GenerationInput, through BuildGenerationRequest on a fake model's scheduler.
#include "service/openai/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

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
                "\"assistant\", got a string (\"robot\")",
                "messages[2].role");
  ExpectRefused(chat, R"({"model": "m", "messages": [{"role": "tool", "content": "c"}]})",
                "messages[0].role: expected one of \"system\", \"developer\", \"user\", "
                "\"assistant\", got a string (\"tool\")",
                "messages[0].role");
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
  ExpectRefused(
      chat,
      R"({"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]})",
      "messages[0].tool_calls: not supported by this server (no tool calling), got an "
      "array of 1 element(s)",
      "messages[0].tool_calls");
}

TEST(OpenAiRequest, MaxTokens) {
  EXPECT_EQ(Completion(R"(, "max_tokens": 10)").max_tokens, 10);
  EXPECT_EQ(Completion(R"(, "max_tokens": null)").max_tokens, std::nullopt);
  // Completions has no max_completion_tokens: an unknown field, ignored.
  EXPECT_EQ(Completion(R"(, "max_completion_tokens": 0)").max_tokens, std::nullopt);
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
}

TEST(OpenAiRequest, UnsupportedFieldsAreRefusedByName) {
  CompletionRefused(R"(, "echo": true)",
                    "echo: not supported by this server (the response holds the completion "
                    "only), got true",
                    "echo");
  CompletionRefused(R"(, "frequency_penalty": 0.5)",
                    "frequency_penalty: not supported by this server (OpenAI's penalties subtract "
                    "from a token's logit per occurrence; the model's repetition penalty divides "
                    "it, which is not the same distribution: send 0), got a number (0.5)",
                    "frequency_penalty");
  CompletionRefused(R"(, "presence_penalty": 3)",
                    "presence_penalty: expected a number in [-2, 2], got an integer (3)",
                    "presence_penalty");
  CompletionRefused(R"(, "logit_bias": {"50256": -100})",
                    "logit_bias: not supported by this server (no logit biases), got an object",
                    "logit_bias");
  CompletionRefused(R"(, "logit_bias": 1)",
                    "logit_bias: expected an object of token id -> bias, got an integer (1)",
                    "logit_bias");
  CompletionRefused(R"(, "suffix": "end")",
                    "suffix: not supported by this server (no insertion, completions append "
                    "only), got a string (\"end\")",
                    "suffix");
  CompletionRefused(R"(, "best_of": 3)",
                    "best_of: not supported by this server (no ranking of choices; best_of equal "
                    "to n (1) is accepted), got an integer (3)",
                    "best_of");
  ChatRefused(R"(, "tools": [{"type": "function"}])",
              "tools: not supported by this server (no tool calling), got an array of 1 "
              "element(s)",
              "tools");
  ChatRefused(R"(, "tool_choice": "auto")",
              "tool_choice: not supported by this server (no tool calling; \"none\" is "
              "accepted), got a string (\"auto\")",
              "tool_choice");
  ChatRefused(R"(, "response_format": {"type": "json_object"})",
              "response_format.type: not supported by this server (plain text only; \"text\" is "
              "accepted), got a string (\"json_object\")",
              "response_format.type");
  ChatRefused(R"(, "response_format": "json")",
              "response_format: expected an object {\"type\": \"text\"}, got a string (\"json\")",
              "response_format");
  ChatRefused(R"(, "user": 5)", "user: expected a string, got an integer (5)", "user");
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
  EXPECT_EQ(ChoiceSeed(7, 0), 7u);
  EXPECT_NE(ChoiceSeed(7, 1), 7u);
  EXPECT_NE(ChoiceSeed(7, 1), ChoiceSeed(7, 2));
  EXPECT_NE(ChoiceSeed(7, 1), ChoiceSeed(8, 1));
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

}  // namespace
}  // namespace tost::service::openai
