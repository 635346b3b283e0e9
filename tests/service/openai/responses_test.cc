// The Responses API's pure pieces: the request parsers of POST /v1/responses and of the
// Conversations API (every accepted form, every refusal's message and "param"), the Response
// object and its event stream, what a stored response and a stored conversation are on the record
// store, and the cursor-paginated lists.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/engine/client_text.h"
#include "service/openai/conversation_record.h"
#include "service/openai/error.h"
#include "service/openai/responses_body.h"
#include "service/openai/responses_request.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kHead[] = R"({"model": "m", "input": "Hi")";

ResponsesRequest Responses(const std::string& fields) {
  auto r = ParseResponsesRequest(absl::StrCat(kHead, fields, "}"));
  EXPECT_TRUE(r.ok()) << fields << ": " << r.status();
  return r.ok() ? *r : ResponsesRequest{};
}

ResponsesRequest ResponsesBody(const std::string& body) {
  auto r = ParseResponsesRequest(body);
  EXPECT_TRUE(r.ok()) << body << ": " << r.status();
  return r.ok() ? *r : ResponsesRequest{};
}

// The body is refused with exactly `message`, INVALID_ARGUMENT, and `param` in the error body.
void BodyRefused(const std::string& body, const std::string& message, const std::string& param) {
  auto r = ParseResponsesRequest(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_EQ(r.status().message(), message) << body;
  EXPECT_EQ(ErrorParam(r.status()), param) << body;
  EXPECT_EQ(json::parse(OpenAiErrorBody(r.status()))["error"]["param"], param) << body;
}
void Refused(const std::string& fields, const std::string& message, const std::string& param) {
  BodyRefused(absl::StrCat(kHead, fields, "}"), message, param);
}
// Input items (the JSON of an array) refused.
void InputRefused(const std::string& input, const std::string& message, const std::string& param) {
  BodyRefused(absl::StrCat(R"({"model": "m", "input": )", input, "}"), message, param);
}

ConversationRequest Conversation(ConversationBody kind, const std::string& body) {
  auto r = ParseConversationRequest(kind, body);
  EXPECT_TRUE(r.ok()) << body << ": " << r.status();
  return r.ok() ? *r : ConversationRequest{};
}
void ConversationRefused(ConversationBody kind, const std::string& body, const std::string& message,
                         const std::string& param) {
  auto r = ParseConversationRequest(kind, body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_EQ(r.status().message(), message) << body;
  EXPECT_EQ(ErrorParam(r.status()), param) << body;
}

// `n` copies of a two-byte character (é): `n` characters, 2n bytes.
std::string Accented(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "\xc3\xa9";
  return s;
}

InputMessage Msg(ChatRole role, const std::string& role_name, const std::string& content) {
  return InputMessage{ChatMessage{role, content}, role_name};
}

// --- POST /v1/responses: input -----------------------------------------------------------------

TEST(ResponsesRequest, InputAsAStringIsOneUserMessageAndDefaults) {
  const ResponsesRequest r = Responses("");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.input.size(), 1u);
  EXPECT_EQ(r.input[0].role, "user");
  EXPECT_EQ(r.input[0].message.role, ChatRole::kUser);
  EXPECT_EQ(r.input[0].message.content, "Hi");
  EXPECT_FALSE(r.instructions.has_value());
  EXPECT_TRUE(r.previous_response_id.empty());
  EXPECT_TRUE(r.conversation_id.empty());
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.max_output_tokens.has_value());
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_FALSE(r.top_p.has_value());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.metadata, json::object());
  EXPECT_FALSE(r.constraint.has_value());
  EXPECT_TRUE(r.constraint_field.empty());
  EXPECT_EQ(r.text_format, json({{"type", "text"}}));
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.state.has_value());
  EXPECT_FALSE(r.return_state);
  // An empty string is an empty user message.
  const ResponsesRequest empty = ResponsesBody(R"({"model": "m", "input": ""})");
  ASSERT_EQ(empty.input.size(), 1u);
  EXPECT_EQ(empty.input[0].message.content, "");
}

TEST(ResponsesRequest, InputAsItems) {
  const ResponsesRequest r = ResponsesBody(R"({"model": "m", "input": [
      {"role": "developer", "content": "Be brief."},
      {"role": "system", "content": [{"type": "input_text", "text": "Sys"}]},
      {"type": "message", "role": "user",
       "content": [{"type": "input_text", "text": "Hello, "}, {"type": "input_text", "text": "you"}]},
      {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "Hi", "annotations": []},
                   {"type": "input_text", "text": "!"}]},
      {"role": "assistant", "content": "plain"},
      {"role": "user", "content": []}]})");
  ASSERT_EQ(r.input.size(), 6u);
  EXPECT_EQ(r.input[0].role, "developer");
  EXPECT_EQ(r.input[0].message.role, ChatRole::kSystem);  // developer renders as system
  EXPECT_EQ(r.input[0].message.content, "Be brief.");
  EXPECT_EQ(r.input[1].role, "system");
  EXPECT_EQ(r.input[1].message.role, ChatRole::kSystem);
  EXPECT_EQ(r.input[1].message.content, "Sys");
  EXPECT_EQ(r.input[2].role, "user");
  EXPECT_EQ(r.input[2].message.role, ChatRole::kUser);
  EXPECT_EQ(r.input[2].message.content, "Hello, you");
  EXPECT_EQ(r.input[3].role, "assistant");
  EXPECT_EQ(r.input[3].message.role, ChatRole::kAssistant);
  EXPECT_EQ(r.input[3].message.content, "Hi!");
  EXPECT_EQ(r.input[4].message.content, "plain");
  EXPECT_EQ(r.input[5].message.content, "");
}

TEST(ResponsesRequest, InputRefusalsNameTheItemsPath) {
  BodyRefused(R"({"model": "m"})", "input: missing: expected a string or an array of messages",
              "input");
  BodyRefused(R"({"model": "m", "input": null})",
              "input: missing: expected a string or an array of messages", "input");
  InputRefused("[]",
               "input: expected a non-empty array of message items, got an array of 0 element(s)",
               "input");
  InputRefused("3", "input: expected a non-empty array of message items, got an integer (3)",
               "input");
  InputRefused(R"(["Hi"])",
               "input[0]: expected a message item {\"role\", \"content\"}, got a string (\"Hi\")",
               "input[0]");
  InputRefused(
      R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
          {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])",
      "input[2].content[0].type: not supported by this server (the models take text only), got a "
      "string (\"input_image\")",
      "input[2].content[0].type");
  for (const char* kind : {"input_file", "input_audio"}) {
    InputRefused(absl::StrCat(R"([{"role": "user", "content": [{"type": ")", kind, R"("}]}])"),
                 absl::StrCat("input[0].content[0].type: not supported by this server (the models "
                              "take text only), got a string (\"",
                              kind, "\")"),
                 "input[0].content[0].type");
  }
  for (const char* kind :
       {"function_call", "function_call_output", "reasoning", "item_reference"}) {
    InputRefused(absl::StrCat(R"([{"role": "user", "content": "a"}, {"type": ")", kind, R"("}])"),
                 absl::StrCat("input[1].type: not supported by this server (input items are "
                              "messages only: no tool calls, tool outputs, reasoning or item "
                              "references), got a string (\"",
                              kind, "\")"),
                 "input[1].type");
  }
  InputRefused(R"([{"type": 1, "role": "user", "content": "a"}])",
               "input[0].type: expected \"message\", got an integer (1)", "input[0].type");
  InputRefused(R"([{"role": "tool", "content": "a"}])",
               "input[0].role: expected one of \"user\", \"system\", \"developer\", "
               "\"assistant\", got a string (\"tool\")",
               "input[0].role");
  InputRefused(R"([{"content": "a"}])",
               "input[0].role: expected one of \"user\", \"system\", \"developer\", "
               "\"assistant\", got null",
               "input[0].role");
  InputRefused(R"([{"role": "user", "content": "a", "name": "bob"}])",
               "input[0].name: unknown field of a message item (expected type, role, content, id, "
               "status)",
               "input[0].name");
  InputRefused(R"([{"role": "user"}])",
               "input[0].content: expected a string or an array of text parts, got null",
               "input[0].content");
  InputRefused(R"([{"role": "user", "content": 7}])",
               "input[0].content: expected a string or an array of text parts, got an integer (7)",
               "input[0].content");
  InputRefused(R"([{"role": "user", "content": ["a"]}])",
               "input[0].content[0]: expected an object {\"type\": \"input_text\", \"text\": "
               "...}, got a string (\"a\")",
               "input[0].content[0]");
  // A user's part is input_text; an assistant's output_text (or input_text).
  InputRefused(R"([{"role": "user", "content": [{"type": "output_text", "text": "a"}]}])",
               "input[0].content[0].type: expected \"input_text\", got a string (\"output_text\")",
               "input[0].content[0].type");
  InputRefused(R"([{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}])",
               "input[0].content[0].type: expected \"output_text\", got a string (\"refusal\")",
               "input[0].content[0].type");
  InputRefused(R"([{"role": "user", "content": [{"text": "a"}]}])",
               "input[0].content[0].type: expected \"input_text\", got null",
               "input[0].content[0].type");
  InputRefused(R"([{"role": "user", "content": [{"type": "input_text"}]}])",
               "input[0].content[0].text: expected a string, got null", "input[0].content[0].text");
  // At most kMaxInputItems items.
  std::vector<std::string> items(kMaxInputItems, R"({"role": "user", "content": "a"})");
  EXPECT_EQ(
      ResponsesBody(absl::StrCat(R"({"model": "m", "input": [)", absl::StrJoin(items, ","), "]}"))
          .input.size(),
      kMaxInputItems);
  items.push_back(items.back());
  InputRefused(absl::StrCat("[", absl::StrJoin(items, ","), "]"),
               "input: expected at most 256 items, got an array of 257 element(s)", "input");
}

// --- the body and its fields --------------------------------------------------------------------

TEST(ResponsesRequest, BodyMustBeUtf8JsonObject) {
  BodyRefused("[1]", "body: expected a JSON object, got an array of 1 element(s)", "body");
  auto r = ParseResponsesRequest(R"({"model": "m", "input": )");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("body: expected a JSON object: "));
  EXPECT_EQ(ErrorParam(r.status()), "body");
  r = ParseResponsesRequest("{\"model\": \"m\", \"input\": \"a\xff\"}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(r.status().message()),
      HasSubstr(
          "invalid UTF-8 at byte offset 26 (line 1, column 27) in the value of field \"input\""));
  EXPECT_EQ(ErrorParam(r.status()), "body");
}

TEST(ResponsesRequest, Model) {
  BodyRefused(R"({"input": "Hi"})", "model: missing: expected the name of a model", "model");
  BodyRefused(R"({"model": "", "input": "Hi"})",
              "model: expected a non-empty string, got a string (\"\")", "model");
  BodyRefused(R"({"model": 3, "input": "Hi"})",
              "model: expected a non-empty string, got an integer (3)", "model");
}

TEST(ResponsesRequest, UnknownFieldsAreRefusedByName) {
  Refused(R"(, "frobnicate": 1)",
          "frobnicate: unknown parameter of POST /v1/responses (docs/api.md lists them)",
          "frobnicate");
  // Fields of the chat routes are not the Responses API's.
  Refused(R"(, "max_tokens": 5)",
          "max_tokens: unknown parameter of POST /v1/responses (docs/api.md lists them)",
          "max_tokens");
  Refused(R"(, "messages": [])",
          "messages: unknown parameter of POST /v1/responses (docs/api.md lists them)", "messages");
}

// kRefused of responses_request.cc: each at a value asking for something, then at its defaults.
struct RefusedField {
  const char* key;
  const char* refused_value;  // JSON
  const char* got;            // how the message names it
  const char* why;
  std::vector<const char*> accepted;  // JSON values that ask for nothing
};

const std::vector<RefusedField>& RefusedFields() {
  static const auto* fields = new std::vector<RefusedField>{
      {"tools",
       R"([{"type": "function", "name": "f"}])",
       "an array of 1 element(s)",
       "no tool calling",
       {"null", "[]"}},
      {"tool_choice",
       R"("required")",
       "a string (\"required\")",
       "no tool calling; \"none\" and \"auto\" (without tools) are accepted",
       {"null", R"("none")", R"("auto")"}},
      {"parallel_tool_calls",
       "1",
       "an integer (1)",
       "no tool calling; a boolean is accepted and has no effect",
       {"null", "true", "false"}},
      {"max_tool_calls", "3", "an integer (3)", "no tool calling", {"null"}},
      {"background",
       "true",
       "true",
       "no background mode: responses are answered while the request waits",
       {"null", "false"}},
      {"reasoning", R"({"effort": "low"})", "an object", "the models do not reason", {"null"}},
      {"include",
       R"(["message.output_text.logprobs"])",
       "an array of 1 element(s)",
       "no extra output data (logprobs, sources, encrypted reasoning)",
       {"null", "[]"}},
      {"prompt", R"({"id": "pmpt_1"})", "an object", "no stored prompt templates", {"null"}},
      {"top_logprobs",
       "2",
       "an integer (2)",
       "no logprobs on this route (the chat routes have them)",
       {"null"}},
      {"truncation",
       R"("auto")",
       "a string (\"auto\")",
       "no truncation: the state holds the whole conversation, and an input past the context is "
       "refused; \"disabled\" is accepted",
       {"null", R"("disabled")"}},
      {"service_tier",
       R"("flex")",
       "a string (\"flex\")",
       "one tier; \"auto\" and \"default\" are accepted",
       {"null", R"("auto")", R"("default")"}},
      {"prompt_cache_retention",
       R"("24h")",
       "a string (\"24h\")",
       "the prefix-state cache's retention is the server's",
       {"null"}},
      {"context_management",
       R"([{"type": "compaction"}])",
       "an array of 1 element(s)",
       "the state holds the whole conversation",
       {"null"}},
      {"stream_options",
       R"({"include_obfuscation": false})",
       "an object",
       "no stream options",
       {"null"}},
  };
  return *fields;
}

TEST(ResponsesRequest, FieldsThisServerCannotHonourAreRefusedByName) {
  for (const RefusedField& f : RefusedFields()) {
    Refused(absl::StrCat(R"(, ")", f.key, R"(": )", f.refused_value),
            absl::StrCat(f.key, ": not supported by this server (", f.why, "), got ", f.got),
            f.key);
  }
  // Each field's other non-default forms.
  Refused(R"(, "tool_choice": {"type": "function", "name": "f"})",
          "tool_choice: not supported by this server (no tool calling; \"none\" and \"auto\" "
          "(without tools) are accepted), got an object",
          "tool_choice");
  Refused(R"(, "background": false, "include": "x")",
          "include: not supported by this server (no extra output data (logprobs, sources, "
          "encrypted reasoning)), got a string (\"x\")",
          "include");
  Refused(R"(, "reasoning": {})",
          "reasoning: not supported by this server (the models do not reason), got an object",
          "reasoning");
}

TEST(ResponsesRequest, FieldsThisServerCannotHonourAreAcceptedAtTheirDefaults) {
  for (const RefusedField& f : RefusedFields()) {
    for (const char* value : f.accepted) {
      Responses(absl::StrCat(R"(, ")", f.key, R"(": )", value));
    }
  }
  // All of them at once, as a client library may send them.
  Responses(R"(, "tools": [], "tool_choice": "auto", "parallel_tool_calls": true,
              "background": false, "include": [], "truncation": "disabled",
              "service_tier": "default", "reasoning": null, "top_logprobs": null)");
}

TEST(ResponsesRequest, InstructionsAndEchoedFields) {
  const ResponsesRequest r = Responses(
      R"(, "instructions": "Be kind.", "user": "u-1", "safety_identifier": "s-1",
         "prompt_cache_key": "k-1", "stream": true)");
  EXPECT_EQ(r.instructions, "Be kind.");
  EXPECT_EQ(r.identifiers.user, "u-1");
  EXPECT_EQ(r.identifiers.safety_identifier, "s-1");
  EXPECT_EQ(r.identifiers.prompt_cache_key, "k-1");
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(Responses(R"(, "instructions": null)").instructions.has_value());
  Refused(R"(, "instructions": ["a"])",
          "instructions: expected a string, got an array of 1 element(s)", "instructions");
  Refused(R"(, "user": 5)", "user: expected a string, got an integer (5)", "user");
  Refused(R"(, "safety_identifier": true)", "safety_identifier: expected a string, got true",
          "safety_identifier");
  Refused(R"(, "prompt_cache_key": {})", "prompt_cache_key: expected a string, got an object",
          "prompt_cache_key");
  Refused(R"(, "stream": "yes")", "stream: expected true or false, got a string (\"yes\")",
          "stream");
}

// --- continuing: previous_response_id, conversation, state ---------------------------------------

TEST(ResponsesRequest, PreviousResponseAndConversation) {
  EXPECT_EQ(Responses(R"(, "previous_response_id": "resp_1")").previous_response_id, "resp_1");
  EXPECT_EQ(Responses(R"(, "conversation": "conv_1")").conversation_id, "conv_1");
  EXPECT_EQ(Responses(R"(, "conversation": {"id": "conv_2"})").conversation_id, "conv_2");
  EXPECT_TRUE(
      Responses(R"(, "previous_response_id": null, "conversation": null)").conversation_id.empty());
  const std::string longest(kMaxIdBytes, 'a');
  EXPECT_EQ(
      Responses(absl::StrCat(R"(, "previous_response_id": ")", longest, "\"")).previous_response_id,
      longest);
  Refused(absl::StrCat(R"(, "previous_response_id": ")", longest, "a\""),
          absl::StrCat("previous_response_id: expected an id of 1 to 64 bytes, got a string (\"",
                       longest, "...\" (65 bytes))"),
          "previous_response_id");
  Refused(R"(, "previous_response_id": "")",
          "previous_response_id: expected an id of 1 to 64 bytes, got a string (\"\")",
          "previous_response_id");
  Refused(R"(, "previous_response_id": 5)",
          "previous_response_id: expected a string, got an integer (5)", "previous_response_id");
  Refused(R"(, "conversation": {})", "conversation.id: expected a string, got null",
          "conversation.id");
  Refused(R"(, "conversation": {"id": ""})",
          "conversation.id: expected an id of 1 to 64 bytes, got a string (\"\")",
          "conversation.id");
  Refused(R"(, "conversation": {"id": "conv_1", "name": "c"})",
          "conversation.name: unknown field (expected id)", "conversation.name");
  Refused(R"(, "conversation": 1)", "conversation: expected a string, got an integer (1)",
          "conversation");
  Refused(R"(, "previous_response_id": "resp_1", "conversation": "conv_1")",
          "conversation: set previous_response_id or conversation, not both: each names the state "
          "to continue",
          "conversation");
}

TEST(ResponsesRequest, StoreFalseCannotJoinAConversation) {
  EXPECT_FALSE(Responses(R"(, "store": false)").store);
  EXPECT_FALSE(Responses(R"(, "store": false, "previous_response_id": "resp_1")").store);
  EXPECT_TRUE(Responses(R"(, "store": true, "conversation": "conv_1")").store);
  Refused(R"(, "store": false, "conversation": "conv_1")",
          "store: a response in a conversation is stored with it: send store true (or leave it "
          "out), or leave out conversation",
          "store");
  Refused(R"(, "store": 0)", "store: expected true or false, got an integer (0)", "store");
}

TEST(ResponsesRequest, StateExtension) {
  const ResponsesRequest r = Responses(R"(, "state": "AAEC/w==", "return_state": true)");
  EXPECT_EQ(r.state, std::string("\x00\x01\x02\xff", 4));
  EXPECT_TRUE(r.return_state);
  Refused(R"(, "state": "not base64!")",
          "state: expected a state blob in base64 (RFC 4648), got a string (\"not base64!\")",
          "state");
  Refused(R"(, "state": "")",
          "state: expected a state blob in base64 (RFC 4648), got a string (\"\")", "state");
  Refused(R"(, "state": 5)", "state: expected a string, got an integer (5)", "state");
  Refused(R"(, "state": "AAEC", "previous_response_id": "resp_1")",
          "state: set one of state, previous_response_id and conversation: each names the state "
          "to continue",
          "state");
  Refused(R"(, "state": "AAEC", "conversation": "conv_1")",
          "state: set one of state, previous_response_id and conversation: each names the state "
          "to continue",
          "state");
  Refused(R"(, "return_state": 1)", "return_state: expected true or false, got an integer (1)",
          "return_state");
}

// --- metadata ----------------------------------------------------------------------------------

std::string MetadataPairs(size_t n) {
  std::vector<std::string> pairs;
  for (size_t i = 0; i < n; ++i) pairs.push_back(absl::StrCat("\"k", i, "\": \"v\""));
  return absl::StrCat("{", absl::StrJoin(pairs, ", "), "}");
}

TEST(ResponsesRequest, MetadataBounds) {
  EXPECT_EQ(Responses(R"(, "metadata": null)").metadata, json::object());
  EXPECT_EQ(Responses(R"(, "metadata": {"a": "b", "c": ""})").metadata,
            json({{"a", "b"}, {"c", ""}}));
  EXPECT_EQ(Responses(absl::StrCat(R"(, "metadata": )", MetadataPairs(16))).metadata.size(), 16u);
  Refused(absl::StrCat(R"(, "metadata": )", MetadataPairs(17)),
          "metadata: expected at most 16 pairs, got an object", "metadata");
  // Keys of 64 characters and values of 512, counted in characters, not bytes.
  const std::string key64 = Accented(64), value512 = Accented(512);
  const ResponsesRequest r =
      Responses(absl::StrCat(R"(, "metadata": {")", key64, R"(": ")", value512, R"(", "x": "y"})"));
  EXPECT_EQ(r.metadata[key64], value512);
  EXPECT_EQ(Responses(absl::StrCat(R"(, "metadata": {")", std::string(64, 'k'), R"(": ")",
                                   std::string(512, 'v'), R"("})"))
                .metadata.size(),
            1u);
  // Past them: the key is quoted in the path as the message quotes client text.
  const std::string key65 = Accented(65);
  Refused(
      absl::StrCat(R"(, "metadata": {")", key65, R"(": "v"})"),
      absl::StrCat("metadata.", QuoteClientText(key65), ": expected a key of 1 to 64 characters"),
      absl::StrCat("metadata.", QuoteClientText(key65)));
  Refused(absl::StrCat(R"(, "metadata": {")", std::string(65, 'k'), R"(": "v"})"),
          absl::StrCat("metadata.\"", std::string(64, 'k'),
                       "...\" (65 bytes): expected a key of 1 to 64 characters"),
          absl::StrCat("metadata.\"", std::string(64, 'k'), "...\" (65 bytes)"));
  Refused(R"(, "metadata": {"": "v"})", "metadata.\"\": expected a key of 1 to 64 characters",
          "metadata.\"\"");
  Refused(
      absl::StrCat(R"(, "metadata": {"k": ")", Accented(513), R"("})"),
      absl::StrCat("metadata.\"k\": expected a string of at most 512 characters, got a string (",
                   QuoteClientText(Accented(513)), ")"),
      "metadata.\"k\"");
  Refused(R"(, "metadata": {"k": 1})",
          "metadata.\"k\": expected a string of at most 512 characters, got an integer (1)",
          "metadata.\"k\"");
  Refused(R"(, "metadata": ["k"])",
          "metadata: expected an object of string values, got an array of 1 element(s)",
          "metadata");
}

// --- text.format -------------------------------------------------------------------------------

TEST(ResponsesRequest, TextFormatText) {
  for (const char* text : {R"(, "text": null)", R"(, "text": {})", R"(, "text": {"format": null})",
                           R"(, "text": {"format": {"type": "text"}})",
                           R"(, "text": {"format": {"type": "text"}, "verbosity": "medium"})",
                           R"(, "text": {"verbosity": null})"}) {
    const ResponsesRequest r = Responses(text);
    EXPECT_FALSE(r.constraint.has_value()) << text;
    EXPECT_TRUE(r.constraint_field.empty()) << text;
    EXPECT_EQ(r.text_format, json({{"type", "text"}})) << text;
  }
}

TEST(ResponsesRequest, TextFormatJsonObject) {
  const ResponsesRequest r = Responses(R"(, "text": {"format": {"type": "json_object"}})");
  ASSERT_TRUE(r.constraint.has_value());
  EXPECT_EQ(r.constraint->kind, structured::Constraint::Kind::kJsonObject);
  EXPECT_EQ(r.constraint_field, "text.format");
  EXPECT_EQ(r.text_format, json({{"type", "json_object"}}));
}

TEST(ResponsesRequest, TextFormatJsonSchemaKeepsTheSchemasKeyOrder) {
  // The parser sorts object keys; the schema reaches the engine in the client's order. Other
  // objects holding a "schema" key do not confuse the second read.
  const ResponsesRequest r = Responses(R"(, "metadata": {"schema": "x"},
      "text": {"format": {"type": "json_schema", "name": "Person_v-2", "description": "who",
        "schema": {"type": "object", "properties": {"zeta": {"type": "integer"},
                                                    "alpha": {"type": "string", "maxLength": 3}},
                   "required": ["zeta", "alpha"]}}})");
  ASSERT_TRUE(r.constraint.has_value());
  EXPECT_EQ(r.constraint->kind, structured::Constraint::Kind::kJsonSchema);
  EXPECT_EQ(r.constraint->text,
            R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string",)"
            R"("maxLength":3}},"required":["zeta","alpha"]})");
  EXPECT_EQ(r.constraint_field, "text.format.schema");
  EXPECT_EQ(r.text_format["type"], "json_schema");
  EXPECT_EQ(r.text_format["name"], "Person_v-2");
  EXPECT_EQ(r.text_format["description"], "who");
  EXPECT_EQ(r.text_format["strict"], true);  // the default: the schema is always enforced
  EXPECT_EQ(r.text_format["schema"], json::parse(r.constraint->text));
  // strict false is accepted (and enforced all the same); the format may sit after other fields.
  const ResponsesRequest loose = Responses(R"(, "text": {"format": {"type": "json_schema",
      "name": "n", "strict": false, "schema": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}})");
  ASSERT_TRUE(loose.constraint.has_value());
  EXPECT_EQ(loose.constraint->text, R"({"anyOf":[{"type":"integer"},{"type":"string"}]})");
  EXPECT_EQ(loose.text_format["strict"], false);
  EXPECT_FALSE(loose.text_format.contains("description"));
  // A name of 64 characters is the longest.
  EXPECT_TRUE(Responses(absl::StrCat(R"(, "text": {"format": {"type": "json_schema", "name": ")",
                                     std::string(64, 'n'), R"(", "schema": {}}})"))
                  .constraint.has_value());
}

TEST(ResponsesRequest, TextFormatRefusals) {
  constexpr char kTypes[] = R"(one of "text", "json_object", "json_schema")";
  Refused(R"(, "text": "json")",
          "text: expected an object {\"format\": {...}}, got a string (\"json\")", "text");
  Refused(R"(, "text": {"fmt": {}})", "text.fmt: unknown field (expected format, verbosity)",
          "text.fmt");
  Refused(R"(, "text": {"verbosity": "high"})",
          "text.verbosity: not supported by this server (the models have no verbosity setting; "
          "\"medium\"), got a string (\"high\")",
          "text.verbosity");
  Refused(R"(, "text": {"format": "json_object"})",
          absl::StrCat("text.format: expected an object of type ", kTypes,
                       ", got a string (\"json_object\")"),
          "text.format");
  Refused(R"(, "text": {"format": {}})",
          absl::StrCat("text.format.type: expected ", kTypes, ", got null"), "text.format.type");
  Refused(R"(, "text": {"format": {"type": "xml"}})",
          absl::StrCat("text.format.type: expected ", kTypes, ", got a string (\"xml\")"),
          "text.format.type");
  const std::string what_name = "a string of 1 to 64 characters from a-z, A-Z, 0-9, _ and -";
  Refused(R"(, "text": {"format": {"type": "json_schema", "schema": {}}})",
          absl::StrCat("text.format.name: missing: expected ", what_name), "text.format.name");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}})",
          absl::StrCat("text.format.name: expected ", what_name, ", got a string (\"a b\")"),
          "text.format.name");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "", "schema": {}}})",
          absl::StrCat("text.format.name: expected ", what_name, ", got a string (\"\")"),
          "text.format.name");
  Refused(absl::StrCat(R"(, "text": {"format": {"type": "json_schema", "name": ")",
                       std::string(65, 'n'), R"(", "schema": {}}})"),
          absl::StrCat("text.format.name: expected ", what_name, ", got a string (\"",
                       std::string(64, 'n'), "...\" (65 bytes))"),
          "text.format.name");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": 1, "schema": {}}})",
          absl::StrCat("text.format.name: expected ", what_name, ", got an integer (1)"),
          "text.format.name");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "n"}})",
          "text.format.schema: missing: expected a JSON schema (an object)", "text.format.schema");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "n", "schema": "{}"}})",
          "text.format.schema: expected a JSON schema (an object), got a string (\"{}\")",
          "text.format.schema");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "n", "schema": {},
                                   "strict": "yes"}})",
          "text.format.strict: expected true or false, got a string (\"yes\")",
          "text.format.strict");
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "n", "schema": {},
                                   "description": 3}})",
          "text.format.description: expected a string, got an integer (3)",
          "text.format.description");
  // The text and json_object formats have nothing but their type: a schema sent with
  // json_object would not be enforced.
  Refused(R"(, "text": {"format": {"type": "json_object", "schema": {"type": "object"}}})",
          "text.format.schema: unknown field of a \"json_object\" format (expected type)",
          "text.format.schema");
  Refused(R"(, "text": {"format": {"type": "text", "name": "n"}})",
          "text.format.name: unknown field of a \"text\" format (expected type)",
          "text.format.name");
  // The chat routes' nesting ({"json_schema": {...}}) is not the Responses API's.
  Refused(R"(, "text": {"format": {"type": "json_schema", "name": "n", "schema": {},
                                   "json_schema": {}}})",
          "text.format.json_schema: unknown field (expected type, name, schema, description, "
          "strict)",
          "text.format.json_schema");
}

// --- sampling and length ------------------------------------------------------------------------

TEST(ResponsesRequest, Sampling) {
  EXPECT_EQ(Responses(R"(, "temperature": 0)").temperature, 0.f);
  EXPECT_EQ(Responses(R"(, "temperature": 0.01)").temperature, 0.01f);
  EXPECT_EQ(Responses(R"(, "temperature": 0.7)").temperature, 0.7f);
  EXPECT_EQ(Responses(R"(, "temperature": 2)").temperature, 2.f);
  EXPECT_FALSE(Responses(R"(, "temperature": null)").temperature.has_value());
  Refused(R"(, "temperature": 2.5)", "temperature: expected a number in [0, 2], got a number (2.5)",
          "temperature");
  Refused(R"(, "temperature": -1)", "temperature: expected a number in [0, 2], got an integer (-1)",
          "temperature");
  Refused(R"(, "temperature": 0.001)",
          "temperature: expected 0 (greedy) or a number in [0.01, 2], got a number (0.001)",
          "temperature");
  Refused(R"(, "temperature": "hot")",
          "temperature: expected a number in [0, 2], got a string (\"hot\")", "temperature");
  EXPECT_EQ(Responses(R"(, "top_p": 0.5)").top_p, 0.5f);
  EXPECT_EQ(Responses(R"(, "top_p": 1)").top_p, 1.f);
  Refused(R"(, "top_p": 0)", "top_p: expected a number in (0, 1], got an integer (0)", "top_p");
  Refused(R"(, "top_p": 1.5)", "top_p: expected a number in (0, 1], got a number (1.5)", "top_p");
  Refused(R"(, "top_p": -0.5)", "top_p: expected a number in (0, 1], got a number (-0.5)", "top_p");
  EXPECT_EQ(Responses(R"(, "seed": 42)").seed, 42u);
  EXPECT_EQ(Responses(R"(, "seed": -1)").seed, ~uint64_t{0});
  Refused(R"(, "seed": 1.5)",
          "seed: expected an integer in [-9223372036854775808, 9223372036854775807], got a number "
          "(1.5)",
          "seed");
  Refused(R"(, "seed": 18446744073709551615)",
          "seed: expected an integer in [-9223372036854775808, 9223372036854775807], got an "
          "integer (18446744073709551615)",
          "seed");
}

TEST(ResponsesRequest, MaxOutputTokens) {
  EXPECT_EQ(Responses(R"(, "max_output_tokens": 1)").max_output_tokens, 1);
  EXPECT_EQ(Responses(R"(, "max_output_tokens": 2147483647)").max_output_tokens, 2147483647);
  EXPECT_FALSE(Responses(R"(, "max_output_tokens": null)").max_output_tokens.has_value());
  Refused(R"(, "max_output_tokens": 0)",
          "max_output_tokens: expected an integer in [1, 2147483647], got an integer (0)",
          "max_output_tokens");
  Refused(R"(, "max_output_tokens": 2147483648)",
          "max_output_tokens: expected an integer in [1, 2147483647], got an integer (2147483648)",
          "max_output_tokens");
  Refused(R"(, "max_output_tokens": -3)",
          "max_output_tokens: expected an integer in [1, 2147483647], got an integer (-3)",
          "max_output_tokens");
  Refused(R"(, "max_output_tokens": "5")",
          "max_output_tokens: expected an integer in [1, 2147483647], got a string (\"5\")",
          "max_output_tokens");
  Refused(R"(, "max_output_tokens": 16.0)",
          "max_output_tokens: expected an integer in [1, 2147483647], got a number (16.0)",
          "max_output_tokens");
}

// --- the Conversations API's request bodies ------------------------------------------------------

TEST(ConversationRequest, CreateTakesItemsAndMetadataBothOptional) {
  ConversationRequest r = Conversation(ConversationBody::kCreate, "{}");
  EXPECT_TRUE(r.items.empty());
  EXPECT_FALSE(r.metadata.has_value());
  // A conversation may start empty.
  r = Conversation(ConversationBody::kCreate, R"({"items": [], "metadata": null})");
  EXPECT_TRUE(r.items.empty());
  EXPECT_FALSE(r.metadata.has_value());
  r = Conversation(ConversationBody::kCreate,
                   R"({"items": [{"role": "developer", "content": "Be brief."},
                                 {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "Hi"}]}],
                       "metadata": {"topic": "demo"}})");
  ASSERT_EQ(r.items.size(), 2u);
  EXPECT_EQ(r.items[0].role, "developer");
  EXPECT_EQ(r.items[0].message.role, ChatRole::kSystem);
  EXPECT_EQ(r.items[1].message.content, "Hi");
  EXPECT_EQ(r.metadata, json({{"topic", "demo"}}));
  ConversationRefused(ConversationBody::kCreate, R"({"items": [], "name": "x"})",
                      "name: unknown parameter (expected items, metadata)", "name");
  ConversationRefused(ConversationBody::kCreate, R"({"items": {}})",
                      "items: expected a non-empty array of message items, got an object", "items");
  ConversationRefused(ConversationBody::kCreate,
                      R"({"items": [{"role": "robot", "content": "x"}]})",
                      "items[0].role: expected one of \"user\", \"system\", \"developer\", "
                      "\"assistant\", got a string (\"robot\")",
                      "items[0].role");
  ConversationRefused(ConversationBody::kCreate, R"({"metadata": {"k": 2}})",
                      "metadata.\"k\": expected a string of at most 512 characters, got an "
                      "integer (2)",
                      "metadata.\"k\"");
  ConversationRefused(ConversationBody::kCreate, "[]",
                      "body: expected a JSON object, got an array of 0 element(s)", "body");
  auto bad = ParseConversationRequest(ConversationBody::kCreate, "{\"items\": \"\xc3(\"}");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(ErrorParam(bad.status()), "body");
  bad = ParseConversationRequest(ConversationBody::kCreate, "{");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), StartsWith("body: expected a JSON object: "));
}

TEST(ConversationRequest, AddItemsRequiresItems) {
  const ConversationRequest r = Conversation(
      ConversationBody::kAddItems,
      R"({"items": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})");
  ASSERT_EQ(r.items.size(), 2u);
  EXPECT_EQ(r.items[1].message.role, ChatRole::kAssistant);
  EXPECT_FALSE(r.metadata.has_value());
  ConversationRefused(ConversationBody::kAddItems, "{}",
                      "items: missing: expected an array of message items", "items");
  ConversationRefused(ConversationBody::kAddItems, R"({"items": null})",
                      "items: missing: expected an array of message items", "items");
  // Adding nothing is a mistake worth reporting.
  ConversationRefused(ConversationBody::kAddItems, R"({"items": []})",
                      "items: expected a non-empty array of message items, got an array of 0 "
                      "element(s)",
                      "items");
  ConversationRefused(ConversationBody::kAddItems,
                      R"({"items": [{"role": "user", "content": "a"}], "metadata": {}})",
                      "metadata: unknown parameter (expected items)", "metadata");
  ConversationRefused(
      ConversationBody::kAddItems,
      R"({"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
      "items[0].content[0].type: not supported by this server (the models take text only), got a "
      "string (\"input_image\")",
      "items[0].content[0].type");
}

TEST(ConversationRequest, UpdateRequiresMetadata) {
  const ConversationRequest r =
      Conversation(ConversationBody::kUpdate, R"({"metadata": {"a": "1"}})");
  EXPECT_TRUE(r.items.empty());
  EXPECT_EQ(r.metadata, json({{"a", "1"}}));
  EXPECT_EQ(Conversation(ConversationBody::kUpdate, R"({"metadata": {}})").metadata,
            json::object());
  ConversationRefused(ConversationBody::kUpdate, "{}",
                      "metadata: missing: expected an object of strings", "metadata");
  ConversationRefused(ConversationBody::kUpdate, R"({"metadata": null})",
                      "metadata: missing: expected an object of strings", "metadata");
  ConversationRefused(ConversationBody::kUpdate, R"({"metadata": {}, "items": []})",
                      "items: unknown parameter (expected metadata)", "items");
  ConversationRefused(ConversationBody::kUpdate,
                      absl::StrCat(R"({"metadata": )", MetadataPairs(17), "}"),
                      "metadata: expected at most 16 pairs, got an object", "metadata");
}

// --- message items ------------------------------------------------------------------------------

TEST(ResponsesMessageItem, ShapesAndParsesBackAsInput) {
  const json user = MessageItemJson("msg_1", Msg(ChatRole::kSystem, "developer", "Be brief."));
  EXPECT_EQ(user, json::parse(R"({"type": "message", "id": "msg_1", "status": "completed",
      "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]})"));
  const json assistant = MessageItemJson("msg_2", Msg(ChatRole::kAssistant, "assistant", "Yes."));
  EXPECT_EQ(assistant, json::parse(R"({"type": "message", "id": "msg_2", "status": "completed",
      "role": "assistant",
      "content": [{"type": "output_text", "text": "Yes.", "annotations": []}]})"));
  // A listed item sent back as input is the same message.
  auto back = ParseInputMessages(json::array({user, assistant}), "input");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].role, "developer");
  EXPECT_EQ((*back)[0].message.role, ChatRole::kSystem);
  EXPECT_EQ((*back)[0].message.content, "Be brief.");
  EXPECT_EQ((*back)[1].role, "assistant");
  EXPECT_EQ((*back)[1].message.content, "Yes.");
}

// --- the Response object -------------------------------------------------------------------------

TEST(ResponsesBody, NewResponseEchoesTheRequest) {
  const ResponsesRequest plain = Responses("");
  const json r = NewResponseJson(plain, "resp_1", "lm", 1700000000);
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 1700000000);
  EXPECT_EQ(r["status"], "in_progress");
  EXPECT_EQ(r["model"], "lm");
  EXPECT_EQ(r["output"], json::array());
  EXPECT_TRUE(r["usage"].is_null());
  EXPECT_TRUE(r["error"].is_null());
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_TRUE(r["instructions"].is_null());
  EXPECT_TRUE(r["max_output_tokens"].is_null());
  EXPECT_TRUE(r["previous_response_id"].is_null());
  EXPECT_TRUE(r["user"].is_null());
  EXPECT_EQ(r["metadata"], json::object());
  EXPECT_EQ(r["store"], true);
  EXPECT_EQ(r["background"], false);
  // OpenAI's defaults when unset.
  EXPECT_EQ(r["temperature"], 1.0);
  EXPECT_EQ(r["top_p"], 1.0);
  EXPECT_EQ(r["text"], json({{"format", {{"type", "text"}}}}));
  EXPECT_EQ(r["tools"], json::array());
  EXPECT_EQ(r["tool_choice"], "none");
  EXPECT_EQ(r["truncation"], "disabled");
  EXPECT_FALSE(r.contains("conversation"));
  EXPECT_FALSE(r.contains("safety_identifier"));
  EXPECT_FALSE(r.contains("prompt_cache_key"));
  EXPECT_FALSE(r.contains("completed_at"));

  const ResponsesRequest full = Responses(
      R"(, "instructions": "Be kind.", "max_output_tokens": 9, "metadata": {"a": "b"},
         "conversation": {"id": "conv_1"}, "temperature": 0.5, "top_p": 0.25, "user": "u",
         "safety_identifier": "s", "prompt_cache_key": "k", "store": true,
         "text": {"format": {"type": "json_object"}})");
  const json f = NewResponseJson(full, "resp_2", "lm", 5);
  EXPECT_EQ(f["instructions"], "Be kind.");
  EXPECT_EQ(f["max_output_tokens"], 9);
  EXPECT_EQ(f["metadata"], json({{"a", "b"}}));
  EXPECT_EQ(f["conversation"], json({{"id", "conv_1"}}));
  EXPECT_EQ(f["temperature"], 0.5);
  EXPECT_EQ(f["top_p"], 0.25);
  EXPECT_EQ(f["user"], "u");
  EXPECT_EQ(f["safety_identifier"], "s");
  EXPECT_EQ(f["prompt_cache_key"], "k");
  EXPECT_EQ(f["text"], json({{"format", {{"type", "json_object"}}}}));
  EXPECT_TRUE(f["previous_response_id"].is_null());
  const json p = NewResponseJson(
      Responses(R"(, "previous_response_id": "resp_0", "store": false, "temperature": 0)"),
      "resp_3", "lm", 5);
  EXPECT_EQ(p["previous_response_id"], "resp_0");
  EXPECT_EQ(p["store"], false);
  EXPECT_EQ(p["temperature"], 0.0);
}

TEST(ResponsesBody, CompletedAndIncomplete) {
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  CompleteResponseJson(r, "msg_1", "Hello.", /*truncated=*/false, {10, 4, 5}, 12);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_EQ(r["completed_at"], 12);
  EXPECT_EQ(r["output"], json::array({OutputMessageJson("msg_1", "Hello.", "completed")}));
  EXPECT_EQ(r["output"][0], json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant",
      "status": "completed", "content": [{"type": "output_text", "text": "Hello.",
                                          "annotations": [], "logprobs": []}]})"));
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 10,
      "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5,
      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})"));

  json cut = NewResponseJson(Responses(R"(, "max_output_tokens": 3)"), "resp_2", "lm", 10);
  CompleteResponseJson(cut, "msg_2", "Hel", /*truncated=*/true, {7, 0, 3}, 11);
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(cut["output"][0]["status"], "incomplete");
  EXPECT_EQ(cut["output"][0]["content"][0]["text"], "Hel");
  EXPECT_EQ(cut["usage"]["total_tokens"], 10);
}

TEST(ResponsesBody, Failed) {
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  FailResponseJson(r, absl::ResourceExhaustedError("the queue is full"));
  EXPECT_EQ(r["status"], "failed");
  EXPECT_EQ(r["error"], json({{"code", "resource_exhausted"}, {"message", "the queue is full"}}));
}

// --- the event stream
// ------------------------------------------------------------------------------

struct Event {
  std::string type;
  json data;
};

// SSE bytes as events; every event is "event: <type>\ndata: <json>\n\n" and its data's type is
// the event's.
std::vector<Event> Events(const std::string& sse) {
  std::vector<Event> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << sse.substr(at);
    if (end == std::string::npos) break;
    const std::string event = sse.substr(at, end - at);
    at = end + 2;
    EXPECT_THAT(event, StartsWith("event: "));
    const size_t nl = event.find('\n');
    EXPECT_NE(nl, std::string::npos);
    if (nl == std::string::npos) break;
    Event e{event.substr(7, nl - 7), json()};
    EXPECT_EQ(event.compare(nl + 1, 6, "data: "), 0) << event;
    e.data = json::parse(event.substr(nl + 7));
    EXPECT_EQ(e.data["type"], e.type);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::string> Types(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const Event& e : events) out.push_back(e.type);
  return out;
}

void ExpectNumberedFromZero(const std::vector<Event>& events) {
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["sequence_number"], i) << events[i].type;
  }
}

std::string Deltas(const std::vector<Event>& events) {
  std::string out;
  for (const Event& e : events) {
    if (e.type == "response.output_text.delta") out += e.data["delta"].get<std::string>();
  }
  return out;
}

TEST(ResponsesEventStream, EventsInOrderNumberedFromZero) {
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  ResponseEventStream stream("msg_1");
  std::string sse = stream.Begin(r);
  sse += stream.Delta("Hel");
  sse += stream.Delta("");  // nothing, and no number taken
  sse += stream.Delta("lo \xc3\xa9");
  CompleteResponseJson(r, "msg_1", "Hello \xc3\xa9", false, {3, 0, 2}, 11);
  sse += stream.Complete(r);
  const std::vector<Event> events = Events(sse);
  EXPECT_EQ(Types(events),
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  ExpectNumberedFromZero(events);
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(events[0].data["response"]["id"], "resp_1");
  EXPECT_EQ(events[1].data["response"]["status"], "in_progress");
  EXPECT_EQ(events[2].data["item"], OutputMessageJson("msg_1", "", "in_progress"));
  EXPECT_EQ(events[2].data["output_index"], 0);
  EXPECT_EQ(events[3].data["item_id"], "msg_1");
  EXPECT_EQ(events[3].data["part"],
            json({{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}));
  EXPECT_EQ(events[4].data["item_id"], "msg_1");
  EXPECT_EQ(events[4].data["delta"], "Hel");
  EXPECT_EQ(events[5].data["delta"], "lo \xc3\xa9");
  EXPECT_EQ(Deltas(events), "Hello \xc3\xa9");
  EXPECT_EQ(events[6].data["text"], "Hello \xc3\xa9");
  EXPECT_EQ(events[7].data["part"], r["output"][0]["content"][0]);
  EXPECT_EQ(events[8].data["item"], r["output"][0]);
  EXPECT_EQ(events[9].data["response"], r);
  EXPECT_EQ(events[9].data["response"]["status"], "completed");
}

TEST(ResponsesEventStream, TextReleasedAtTheEndIsALastDelta) {
  // A stop string's withheld bytes that were not one reach only the final text: a last delta
  // carries them, so the deltas add up to the done event's text.
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  ResponseEventStream stream("msg_1");
  std::string sse = stream.Begin(r);
  sse += stream.Delta("Hello");
  CompleteResponseJson(r, "msg_1", "Hello\n\nQ", false, {3, 0, 4}, 11);
  sse += stream.Complete(r);
  const std::vector<Event> events = Events(sse);
  ExpectNumberedFromZero(events);
  ASSERT_EQ(events.size(), 10u);
  EXPECT_EQ(events[5].type, "response.output_text.delta");
  EXPECT_EQ(events[5].data["delta"], "\n\nQ");
  EXPECT_EQ(events[6].type, "response.output_text.done");
  EXPECT_EQ(Deltas(events), "Hello\n\nQ");
  EXPECT_EQ(events[6].data["text"], "Hello\n\nQ");

  // No delta at all: the whole text is the one delta.
  json quiet = NewResponseJson(Responses(""), "resp_2", "lm", 10);
  ResponseEventStream whole("msg_2");
  std::string all = whole.Begin(quiet);
  CompleteResponseJson(quiet, "msg_2", "All at once", false, {3, 0, 3}, 11);
  all += whole.Complete(quiet);
  const std::vector<Event> e2 = Events(all);
  ExpectNumberedFromZero(e2);
  EXPECT_EQ(Deltas(e2), "All at once");
  // And an empty text has no delta.
  json empty = NewResponseJson(Responses(""), "resp_3", "lm", 10);
  ResponseEventStream none("msg_3");
  std::string e = none.Begin(empty);
  CompleteResponseJson(empty, "msg_3", "", false, {3, 0, 1}, 11);
  e += none.Complete(empty);
  const std::vector<Event> e3 = Events(e);
  ExpectNumberedFromZero(e3);
  EXPECT_EQ(Types(e3),
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
}

TEST(ResponsesEventStream, IncompleteEndsWithResponseIncomplete) {
  json r = NewResponseJson(Responses(R"(, "max_output_tokens": 2)"), "resp_1", "lm", 10);
  ResponseEventStream stream("msg_1");
  // One call per statement: the operands of + are evaluated in no set order.
  std::string sse = stream.Begin(r);
  sse += stream.Delta("ab");
  CompleteResponseJson(r, "msg_1", "ab", true, {3, 0, 2}, 11);
  sse += stream.Complete(r);
  const std::vector<Event> events = Events(sse);
  ExpectNumberedFromZero(events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, "response.incomplete");
  EXPECT_EQ(events.back().data["response"]["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(events[events.size() - 2].data["item"]["status"], "incomplete");
}

TEST(ResponsesEventStream, FailedAndError) {
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  ResponseEventStream stream("msg_1");
  std::string sse = stream.Begin(r);
  sse += stream.Delta("x");
  FailResponseJson(r, absl::UnavailableError("the model was unloaded"));
  sse += stream.Failed(r);
  sse += stream.Error(FieldError("input[0].content", "too long"));
  sse += stream.Error(absl::InternalError("boom"));
  const std::vector<Event> events = Events(sse);
  ExpectNumberedFromZero(events);
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[5].type, "response.failed");
  EXPECT_EQ(events[5].data["response"]["status"], "failed");
  EXPECT_EQ(events[5].data["response"]["error"],
            json({{"code", "unavailable"}, {"message", "the model was unloaded"}}));
  EXPECT_EQ(events[6].data, json({{"type", "error"},
                                  {"sequence_number", 6},
                                  {"code", "invalid_argument"},
                                  {"message", "input[0].content: too long"},
                                  {"param", "input[0].content"}}));
  EXPECT_EQ(events[7].data, json({{"type", "error"},
                                  {"sequence_number", 7},
                                  {"code", "internal"},
                                  {"message", "boom"},
                                  {"param", nullptr}}));
  // An error alone (before any response) is numbered 0.
  ResponseEventStream early("msg_2");
  const std::vector<Event> first = Events(early.Error(absl::NotFoundError("no model")));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].data["sequence_number"], 0);
  EXPECT_EQ(first[0].data["code"], "not_found");
}

TEST(ResponsesEventStream, InvalidUtf8IsReplacedNotThrown) {
  json r = NewResponseJson(Responses(""), "resp_1", "lm", 10);
  ResponseEventStream stream("msg_1");
  std::string sse = stream.Begin(r);
  sse += stream.Delta("a\xff");
  const std::vector<Event> events = Events(sse);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[4].data["delta"], "a\xef\xbf\xbd");
}

// --- stored responses ----------------------------------------------------------------------------

TEST(ResponsesStored, EncodeDecodeRoundTrip) {
  StoredResponse s;
  s.response = NewResponseJson(Responses(R"(, "metadata": {"k": "v"})"), "resp_1", "lm", 10);
  CompleteResponseJson(s.response, "msg_1", "caf\xc3\xa9", false, {5, 1, 2}, 11);
  s.input_items = InputItemsJson({Msg(ChatRole::kUser, "user", "Hi")});
  s.context_tokens = 123456789012;
  s.state_blob = std::string("TOSTSESS\0\0\x01\xff\0", 13);
  const std::string record = EncodeStoredResponse(s);
  auto back = DecodeStoredResponse(record, "resp_1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->response, s.response);
  EXPECT_EQ(back->input_items, s.input_items);
  EXPECT_EQ(back->context_tokens, s.context_tokens);
  EXPECT_EQ(back->state_blob, s.state_blob);
  EXPECT_EQ(back->state_blob.size(), 13u);
  // An empty state (a response not yet continued from) too.
  s.state_blob.clear();
  back = DecodeStoredResponse(EncodeStoredResponse(s), "resp_1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->state_blob.empty());
}

TEST(ResponsesStored, DecodeOfAnotherRecordIsDataLoss) {
  for (const std::string& garbage : {std::string(), std::string("not msgpack at all"),
                                     std::string("\x81\xa1x\x01", 4), std::string("\xc1", 1)}) {
    auto r = DecodeStoredResponse(garbage, "resp_\xff");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()),
                StartsWith("stored response \"resp_\\xff\" is not a record this server wrote: "));
  }
  // The right keys holding the wrong shapes.
  StoredResponse s;
  s.response = json::array();
  s.input_items = json::array();
  auto r = DecodeStoredResponse(EncodeStoredResponse(s), "resp_1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "stored response \"resp_1\" is not a record this server wrote: bad shape");
  const std::vector<uint8_t> text_state = json::to_msgpack(json{{"response", json::object()},
                                                                {"input_items", json::array()},
                                                                {"context_tokens", 1},
                                                                {"state", "a string, not bytes"}});
  r = DecodeStoredResponse(std::string(text_state.begin(), text_state.end()), "resp_1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
}

TEST(ResponsesStored, InputItemsKeepTheLatestWithinTheBound) {
  const json small =
      InputItemsJson({Msg(ChatRole::kSystem, "developer", "d"), Msg(ChatRole::kUser, "user", "u")});
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(small[0]["role"], "developer");
  EXPECT_EQ(small[1]["role"], "user");
  EXPECT_NE(small[0]["id"], small[1]["id"]);
  for (const json& item : small) {
    EXPECT_THAT(item["id"].get<std::string>(), StartsWith("msg_"));
    EXPECT_EQ(item["type"], "message");
  }
  const std::string third(kMaxStoredInputBytes / 3 + 1, 'x');
  const json bounded = InputItemsJson({Msg(ChatRole::kUser, "user", "first " + third),
                                       Msg(ChatRole::kAssistant, "assistant", "second " + third),
                                       Msg(ChatRole::kUser, "user", "third " + third)});
  ASSERT_EQ(bounded.size(), 2u);
  EXPECT_EQ(bounded[0]["content"][0]["text"], "second " + third);
  EXPECT_EQ(bounded[1]["content"][0]["text"], "third " + third);
  // Exactly at the bound all are kept.
  const std::string half(kMaxStoredInputBytes / 2, 'y');
  EXPECT_EQ(InputItemsJson({Msg(ChatRole::kUser, "user", half), Msg(ChatRole::kUser, "user", half)})
                .size(),
            2u);
  // The latest item is kept even past the bound on its own.
  const json one =
      InputItemsJson({Msg(ChatRole::kUser, "user", "a"),
                      Msg(ChatRole::kUser, "user", std::string(kMaxStoredInputBytes + 1, 'z'))});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["content"][0]["text"].get<std::string>().size(), kMaxStoredInputBytes + 1);
  EXPECT_EQ(InputItemsJson({}), json::array());
}

TEST(ResponsesStored, NewItemIds) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string id = NewItemId("resp_");
    ASSERT_EQ(id.size(), 5u + 32u) << id;
    EXPECT_THAT(id, StartsWith("resp_"));
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    EXPECT_LE(id.size(), kMaxIdBytes);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_THAT(NewItemId("conv_"), StartsWith("conv_"));
}

// --- lists
// ----------------------------------------------------------------------------------------

json Items(const std::vector<std::string>& ids) {
  json items = json::array();
  for (const std::string& id : ids) items.push_back({{"id", id}, {"type", "message"}});
  return items;
}

std::vector<std::string> Ids(const json& page) {
  std::vector<std::string> out;
  for (const json& item : page["data"]) out.push_back(item["id"].get<std::string>());
  return out;
}

json Page(const json& items, const std::string& order, const std::string& after, int64_t limit) {
  auto page = ListPage(items, order, after, limit);
  EXPECT_TRUE(page.ok()) << page.status();
  if (!page.ok()) return json();
  EXPECT_EQ((*page)["object"], "list");
  return *page;
}

TEST(ResponsesListPage, AscendingAndDescendingWithCursor) {
  const json items = Items({"a", "b", "c", "d", "e"});
  json p = Page(items, "asc", "", 2);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(p["first_id"], "a");
  EXPECT_EQ(p["last_id"], "b");
  EXPECT_EQ(p["has_more"], true);
  p = Page(items, "asc", "b", 2);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(p["has_more"], true);
  p = Page(items, "asc", "d", 2);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"e"}));
  EXPECT_EQ(p["first_id"], "e");
  EXPECT_EQ(p["last_id"], "e");
  EXPECT_EQ(p["has_more"], false);
  p = Page(items, "asc", "c", 2);  // exactly the rest
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"d", "e"}));
  EXPECT_EQ(p["has_more"], false);
  p = Page(items, "asc", "e", 2);  // after the last
  EXPECT_TRUE(p["data"].empty());
  EXPECT_TRUE(p["first_id"].is_null());
  EXPECT_TRUE(p["last_id"].is_null());
  EXPECT_EQ(p["has_more"], false);
  p = Page(items, "desc", "", 2);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"e", "d"}));
  EXPECT_EQ(p["first_id"], "e");
  EXPECT_EQ(p["last_id"], "d");
  EXPECT_EQ(p["has_more"], true);
  p = Page(items, "desc", "d", 2);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(p["has_more"], true);
  p = Page(items, "desc", "b", 100);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"a"}));
  EXPECT_EQ(p["has_more"], false);
  p = Page(items, "asc", "", 100);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(p["has_more"], false);
  p = Page(items, "asc", "", 1);
  EXPECT_EQ(Ids(p), (std::vector<std::string>{"a"}));
  EXPECT_EQ(p["has_more"], true);
  // The items are returned whole.
  EXPECT_EQ(Page(items, "asc", "a", 1)["data"][0], items[1]);
}

TEST(ResponsesListPage, UnknownCursorIsNotFoundAndAnEmptyListIsAPage) {
  auto r = ListPage(Items({"a", "b"}), "asc", "zz", 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "after: no item \"zz\" in this list");
  EXPECT_EQ(ErrorParam(r.status()), "after");
  r = ListPage(json::array(), "desc", "a", 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  const json empty = Page(json::array(), "asc", "", 20);
  EXPECT_EQ(empty, json::parse(R"({"object": "list", "data": [], "first_id": null,
                                    "last_id": null, "has_more": false})"));
  EXPECT_EQ(Page(json::array(), "desc", "", 20), empty);
}

// --- stored conversations ------------------------------------------------------------------------

std::vector<std::string> Texts(const json& items) {
  std::vector<std::string> out;
  for (const json& item : items) out.push_back(item["content"][0]["text"].get<std::string>());
  return out;
}

TEST(ConversationRecord, Json) {
  StoredConversation c;
  c.created_at = 99;
  c.metadata = {{"a", "b"}};
  EXPECT_EQ(ConversationJson("conv_1", c),
            json::parse(R"({"id": "conv_1", "object": "conversation", "created_at": 99,
                            "metadata": {"a": "b"}})"));
}

TEST(ConversationRecord, PendingItemsAndTurns) {
  StoredConversation c;
  EXPECT_TRUE(PendingMessages(c).empty());
  auto added = AddPendingItems(
      c, {Msg(ChatRole::kSystem, "developer", "Be brief."), Msg(ChatRole::kUser, "user", "Hi")},
      "items");
  ASSERT_TRUE(added.ok()) << added.status();
  ASSERT_EQ(added->size(), 2u);
  EXPECT_EQ(c.pending, 2);
  EXPECT_EQ(c.items, *added);
  EXPECT_EQ((*added)[0]["role"], "developer");
  EXPECT_THAT((*added)[0]["id"].get<std::string>(), StartsWith("msg_"));
  std::vector<InputMessage> pending = PendingMessages(c);
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].role, "developer");
  EXPECT_EQ(pending[0].message.role, ChatRole::kSystem);
  EXPECT_EQ(pending[0].message.content, "Be brief.");
  EXPECT_EQ(pending[1].message.role, ChatRole::kUser);
  EXPECT_EQ(pending[1].message.content, "Hi");

  // A response takes them in, with its own input and output.
  json turn =
      json::array({MessageItemJson("msg_in", Msg(ChatRole::kUser, "user", "And?")),
                   MessageItemJson("msg_out", Msg(ChatRole::kAssistant, "assistant", "Done."))});
  RecordTurn(c, turn);
  EXPECT_EQ(c.pending, 0);
  EXPECT_TRUE(PendingMessages(c).empty());
  EXPECT_EQ(Texts(c.items), (std::vector<std::string>{"Be brief.", "Hi", "And?", "Done."}));

  // Items added later are pending again, after the answered ones.
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kAssistant, "assistant", "Also")}, "items").ok());
  EXPECT_EQ(c.pending, 1);
  pending = PendingMessages(c);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].role, "assistant");
  EXPECT_EQ(pending[0].message.role, ChatRole::kAssistant);
  EXPECT_EQ(pending[0].message.content, "Also");
  // Adding nothing changes nothing.
  added = AddPendingItems(c, {}, "items");
  ASSERT_TRUE(added.ok());
  EXPECT_TRUE(added->empty());
  EXPECT_EQ(c.pending, 1);
  EXPECT_EQ(c.items.size(), 5u);
}

TEST(ConversationRecord, PendingItemsPastTheBoundAreRefused) {
  StoredConversation c;
  const std::string half(kMaxConversationItemBytes / 2, 'p');
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kUser, "user", half)}, "items").ok());
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kUser, "user", half)}, "items").ok());  // at it
  const json before = c.items;
  auto r = AddPendingItems(c, {Msg(ChatRole::kUser, "user", "x")}, "items");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorParam(r.status()), "items");
  EXPECT_EQ(r.status().message(),
            absl::StrCat("items: the conversation's items not yet answered would hold ",
                         kMaxConversationItemBytes + 1, " bytes of text, past its bound of ",
                         kMaxConversationItemBytes, ": create a response to take them in first"));
  EXPECT_EQ(c.items, before);  // unchanged
  EXPECT_EQ(c.pending, 2);
  // Named as the caller names it (the create route's items, a response's input).
  StoredConversation fresh;
  r = AddPendingItems(
      fresh, {Msg(ChatRole::kUser, "user", std::string(kMaxConversationItemBytes + 1, 'q'))},
      "input");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ErrorParam(r.status()), "input");
  EXPECT_TRUE(fresh.items.empty());
  EXPECT_EQ(fresh.pending, 0);
}

TEST(ConversationRecord, AnsweredItemsAreDroppedFirst) {
  StoredConversation c;
  const std::string quarter(kMaxConversationItemBytes / 4, 'a');
  json turn = json::array();
  for (int i = 0; i < 3; ++i) {
    turn.push_back(MessageItemJson(absl::StrCat("msg_", i),
                                   Msg(ChatRole::kUser, "user", absl::StrCat(i, quarter))));
  }
  RecordTurn(c, turn);  // 3/4 of the bound (and 3 bytes), all answered
  ASSERT_EQ(c.items.size(), 3u);
  // Half the bound more, pending: the earliest answered items make room; pending ones stay.
  const std::string half(kMaxConversationItemBytes / 2, 'b');
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kUser, "user", half)}, "items").ok());
  EXPECT_EQ(c.pending, 1);
  ASSERT_EQ(c.items.size(), 2u);
  EXPECT_EQ(c.items[0]["id"], "msg_2");
  EXPECT_EQ(c.items[1]["content"][0]["text"], half);
  // Pending items alone at the bound: every answered item goes.
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kUser, "user", half)}, "items").ok());
  EXPECT_EQ(c.pending, 2);
  EXPECT_EQ(c.items.size(), 2u);
  EXPECT_EQ(PendingMessages(c).size(), 2u);
  // A turn past the bound drops the earliest items, now answered, but keeps the last.
  RecordTurn(c, json::array({MessageItemJson(
                    "msg_big", Msg(ChatRole::kAssistant, "assistant",
                                   std::string(kMaxConversationItemBytes + 1, 'c')))}));
  EXPECT_EQ(c.pending, 0);
  ASSERT_EQ(c.items.size(), 1u);
  EXPECT_EQ(c.items[0]["id"], "msg_big");
}

TEST(ConversationRecord, EncodeDecodeRoundTrip) {
  StoredConversation c;
  c.created_at = 1700000000;
  c.metadata = {{"topic", "caf\xc3\xa9"}};
  c.model = "lm";
  ASSERT_TRUE(AddPendingItems(
                  c,
                  {Msg(ChatRole::kUser, "user", "a"), Msg(ChatRole::kAssistant, "assistant", "b")},
                  "items")
                  .ok());
  c.context_tokens = 77;
  c.state_blob = std::string("\0state\0\xff", 8);
  auto back = DecodeStoredConversation(EncodeStoredConversation(c), "conv_1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->created_at, c.created_at);
  EXPECT_EQ(back->metadata, c.metadata);
  EXPECT_EQ(back->model, c.model);
  EXPECT_EQ(back->items, c.items);
  EXPECT_EQ(back->pending, 2);
  EXPECT_EQ(back->context_tokens, 77);
  EXPECT_EQ(back->state_blob, c.state_blob);
  // A new conversation: no model, no state, no items.
  back = DecodeStoredConversation(EncodeStoredConversation(StoredConversation{}), "conv_2");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->items.empty());
  EXPECT_TRUE(back->state_blob.empty());
  EXPECT_TRUE(back->model.empty());
}

TEST(ConversationRecord, DecodeRefusesRecordsItDidNotWrite) {
  StoredConversation c;
  ASSERT_TRUE(AddPendingItems(c, {Msg(ChatRole::kUser, "user", "a")}, "items").ok());
  c.pending = 2;  // more pending than items
  auto r = DecodeStoredConversation(EncodeStoredConversation(c), "conv_1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "stored conversation \"conv_1\" is not a record this server wrote: bad items");
  c.pending = -1;
  r = DecodeStoredConversation(EncodeStoredConversation(c), "conv_1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  c.pending = 1;
  c.items = json::object();
  r = DecodeStoredConversation(EncodeStoredConversation(c), "conv_1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  for (const std::string& garbage : {std::string(), std::string("\x93\x01\x02\x03", 4),
                                     EncodeStoredResponse(StoredResponse{})}) {
    r = DecodeStoredConversation(garbage, "conv_x");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()),
                StartsWith("stored conversation \"conv_x\" is not a record this server wrote: "));
  }
}

}  // namespace
}  // namespace tost::service::openai
