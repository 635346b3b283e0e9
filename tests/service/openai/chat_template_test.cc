// config.json "chat_template": its parsing and refusals (model/config/config.cc), the template
// shipped with models/tost-austen, and rendering a chat with it.
#include "service/openai/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "model/config/config.h"
#include "service/openai/error.h"

namespace tost::service::openai {
namespace {

using ::testing::HasSubstr;

std::string LmConfig(const std::string& extra) {
  return absl::StrCat(R"({"name": "lm", "architecture": "tost_lm",
      "lm": {"n_layer": 1, "n_head": 1, "n_embd": 4, "context_length": 8, "vocab_size": 260})",
                      extra, "}");
}

void ExpectConfigError(const std::string& chat_template, const std::string& message) {
  auto c = model::ParseModelConfig(LmConfig(absl::StrCat(R"(, "chat_template": )", chat_template)),
                                   "m/config.json");
  ASSERT_FALSE(c.ok()) << chat_template;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), absl::StrCat("m/config.json: ", message)) << chat_template;
}

TEST(ChatTemplateConfig, AbsentMeansNoChat) {
  auto c = model::ParseModelConfig(LmConfig(""), "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->chat_template.has_value());
}

TEST(ChatTemplateConfig, Parses) {
  auto c = model::ParseModelConfig(
      LmConfig(R"(, "chat_template": {"system": "<s>{content}</s>", "user": "U: {content}\n",
          "assistant": "A: {content}\n", "generation_prompt": "A:", "stop": ["\nU:"]})"),
      "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->chat_template.has_value());
  const model::ChatTemplate& t = *c->chat_template;
  ASSERT_TRUE(t.system.has_value());
  EXPECT_EQ(t.system->prefix, "<s>");
  EXPECT_EQ(t.system->suffix, "</s>");
  EXPECT_EQ(t.user.prefix, "U: ");
  EXPECT_EQ(t.user.suffix, "\n");
  EXPECT_EQ(t.assistant.prefix, "A: ");
  EXPECT_EQ(t.generation_prompt, "A:");
  EXPECT_EQ(t.stop, std::vector<std::string>{"\nU:"});
}

TEST(ChatTemplateConfig, Refusals) {
  ExpectConfigError("[]", "chat_template must be an object, got []");
  ExpectConfigError(R"({"user": "{content}", "assistant": "{content}", "tool": "{content}"})",
                    "chat_template has an unknown key \"tool\" (expected system, user, assistant, "
                    "generation_prompt, stop, tools)");
  ExpectConfigError(R"({"assistant": "{content}"})",
                    "chat_template.user: missing (a string holding \"{content}\")");
  ExpectConfigError(R"({"user": "{content}"})",
                    "chat_template.assistant: missing (a string holding \"{content}\")");
  ExpectConfigError(R"({"user": "Q: ", "assistant": "{content}"})",
                    "chat_template.user: expected exactly one \"{content}\" (where the message "
                    "goes), got \"Q: \"");
  ExpectConfigError(R"({"user": "{content}{content}", "assistant": "{content}"})",
                    "chat_template.user: expected exactly one \"{content}\" (where the message "
                    "goes), got \"{content}{content}\"");
  ExpectConfigError(R"({"user": 1, "assistant": "{content}"})",
                    "chat_template.user: expected a string, got 1");
  ExpectConfigError(R"({"user": "{content}", "assistant": "{content}", "system": "S"})",
                    "chat_template.system: expected exactly one \"{content}\" (where the message "
                    "goes), got \"S\"");
  ExpectConfigError(
      R"({"user": "{content}", "assistant": "{content}", "generation_prompt": "{content}"})",
      "chat_template.generation_prompt: expected no \"{content}\" (it opens the reply, which has "
      "no content yet)");
  ExpectConfigError(R"({"user": "{content}", "assistant": "{content}", "stop": "x"})",
                    "chat_template.stop: expected a list of at most 8 strings, got \"x\"");
  ExpectConfigError(
      R"({"user": "{content}", "assistant": "{content}", "stop": ["1","2","3","4","5","6","7","8","9"]})",
      "chat_template.stop: expected a list of at most 8 strings, got "
      "[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]");
  ExpectConfigError(R"({"user": "{content}", "assistant": "{content}", "stop": ["a", ""]})",
                    "chat_template.stop[1]: expected a string of 1 to 256 bytes, got \"\"");
  ExpectConfigError(absl::StrCat(R"({"user": "{content})", std::string(4096, 'x'),
                                 R"(", "assistant": "{content}"})"),
                    "chat_template.user: at most 4096 bytes, got 4105");
}

TEST(ChatTemplateConfig, OnlyLanguageModelsTakeOne) {
  auto c = model::ParseModelConfig(R"({"name": "v", "architecture": "tost_vision",
      "vision": {"embed_dim": 8, "depth": 1, "num_heads": 1, "patch_size": 2, "num_classes": 2,
                 "image_height": 4, "image_width": 4},
      "chat_template": {"user": "{content}", "assistant": "{content}"}})",
                                   "v/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "v/config.json: chat_template: only a tost_lm model takes one (it renders chats into "
            "prompts)");
}

TEST(ChatTemplateConfig, ParseChatTemplateAlone) {
  auto t = model::ParseChatTemplate(R"({"user": "{content}", "assistant": "[{content}]"})", "t");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->assistant.prefix, "[");
  EXPECT_FALSE(model::ParseChatTemplate("{", "t").ok());
  auto bad = model::ParseChatTemplate("{\"user\": \"\xff\"}", "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("user"));
}

// The shipped language model's template: a chat as the quoted dialogue of a novel.
TEST(ChatTemplateConfig, TostAustenRendersADialogue) {
  auto c = model::LoadModelConfig(absl::StrCat(TOST_SOURCE_DIR, "/models/tost-austen"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->chat_template.has_value());
  const std::vector<ChatMessage> chat = {
      {ChatRole::kSystem, "Elizabeth and Jane talk in the drawing room."},
      {ChatRole::kUser, "Is he not handsome?"},
      {ChatRole::kAssistant, "He is just what a young man ought to be."},
      {ChatRole::kUser, "And what of his friend?"}};
  auto prompt = RenderChat(*c, chat);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "Elizabeth and Jane talk in the drawing room.\n\n"
            "\"Is he not handsome?\"\n\n"
            "\"He is just what a young man ought to be.\"\n\n"
            "\"And what of his friend?\"\n\n"
            "\"");
  EXPECT_EQ(c->chat_template->stop, (std::vector<std::string>{"\"", "\n\n"}));
  EXPECT_EQ(ChatStopStrings(*c->chat_template, std::vector<std::string>{"\n\n", "Mr."}),
            (std::vector<std::string>{"\"", "\n\n", "Mr."}));
}

TEST(RenderChat, ContentIsInsertedAsIs) {
  model::ChatTemplate t;
  t.user = {"<u>", "</u>"};
  t.assistant = {"<a>", "</a>"};
  auto p = RenderChat(t, {{{ChatRole::kUser, "{content} and {"}}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, "<u>{content} and {</u>");
}

TEST(RenderChat, SystemNeedsASystemRole) {
  model::ChatTemplate t;
  t.user = {"", ""};
  t.assistant = {"", ""};
  auto p = RenderChat(t, {{{ChatRole::kUser, "a"}, {ChatRole::kSystem, "b"}}});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "messages[1].role: this model's chat template has no \"system\" role: send the "
            "instructions as a \"user\" message");
  EXPECT_EQ(ErrorParam(p.status()), "messages[1].role");
}

TEST(ChatTemplateConfig, ToolFormat) {
  auto c = model::ParseModelConfig(
      LmConfig(R"(, "chat_template": {"user": "U: {content}\n", "assistant": "A: {content}\n",
          "tools": {"definitions": "<tools>{tools}</tools>\n", "call_begin": "<call>",
                    "call_end": "</call>", "result": "R: {content}\n"}})"),
      "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->chat_template->tools.has_value());
  const model::ChatTemplate::Tools& t = *c->chat_template->tools;
  EXPECT_EQ(t.definitions_prefix, "<tools>");
  EXPECT_EQ(t.definitions_suffix, "</tools>\n");
  EXPECT_EQ(t.call_begin, "<call>");
  EXPECT_EQ(t.call_end, "</call>");
  EXPECT_EQ(t.result.prefix, "R: ");
  const std::string turns = R"("user": "{content}", "assistant": "{content}", )";
  ExpectConfigError(absl::StrCat("{", turns, R"("tools": {"definitions": "{tools}",
                    "call_begin": "<c>", "call_end": "</c>"}})"),
                    "chat_template.tools.result: missing");
  ExpectConfigError(absl::StrCat("{", turns, R"("tools": {"definitions": "no placeholder",
                    "call_begin": "<c>", "call_end": "</c>", "result": "{content}"}})"),
                    "chat_template.tools.definitions: expected exactly one \"{tools}\" (where the "
                    "tools go), got \"no placeholder\"");
  ExpectConfigError(absl::StrCat("{", turns, R"("tools": {"definitions": "{tools}",
                    "call_begin": "", "call_end": "</c>", "result": "{content}"}})"),
                    "chat_template.tools: expected a non-empty call_begin and call_end (what "
                    "marks a call in the model's output)");
  ExpectConfigError(absl::StrCat("{", turns, R"("tools": {"definitions": "{tools}",
                    "call_begin": "<c>", "call_end": "</c>", "result": "{content}", "x": 1}})"),
                    "chat_template.tools has an unknown key \"x\" (expected definitions, "
                    "call_begin, call_end, result)");
}

}  // namespace
}  // namespace tost::service::openai
