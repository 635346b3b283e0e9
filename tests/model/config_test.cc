#include "model/config/config.h"

#include <gtest/gtest.h>

#include "base/utf8.h"

namespace tost::model {
namespace {

constexpr char kVision[] = R"({"name":"v","architecture":"tost_vision",
  "vision":{"embed_dim":192,"depth":12,"num_heads":4,"patch_size":16,"num_classes":3,
            "image_height":224,"image_width":224},
  "labels":["a","b","c"],"preprocess":{"mean":[0.5,0.5,0.5],"std":[0.25,0.25,0.25]}})";

constexpr char kLanguage[] = R"({"name":"l","architecture":"tost_lm","version":"7",
  "lm":{"n_layer":2,"n_head":4,"n_embd":64,"context_length":128,"vocab_size":257},
  "tokenizer":{"type":"byte","eos_token_id":256}})";

TEST(ModelConfig, ParsesVisionWithDefaults) {
  auto c = ParseModelConfig(kVision, "v/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kVision);
  EXPECT_EQ(c->vision.stem_stages(), 4);
  EXPECT_EQ(c->vision.tokens(), 14 * 14);
  EXPECT_EQ(c->vision.in_chans, 3);
  EXPECT_EQ(c->vision.cls_attn_layers, 2);
  EXPECT_EQ(c->vision.labels[2], "c");
  EXPECT_FALSE(c->trained);
}

TEST(ModelConfig, ParsesLanguage) {
  auto c = ParseModelConfig(kLanguage, "l/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->version, "7");
  EXPECT_EQ(c->language.state_floats_per_layer(), 2 * 64 + 4);
  EXPECT_FALSE(c->language.bias);
}

struct BadConfig {
  const char* json;
  const char* expected_in_message;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, IsRefusedWithAMessageNamingTheProblem) {
  auto c = ParseModelConfig(GetParam().json, "m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find(GetParam().expected_in_message), std::string::npos)
      << c.status();
}

INSTANTIATE_TEST_SUITE_P(
    ModelConfig, BadConfigTest,
    ::testing::Values(
        BadConfig{"{", "not valid JSON"}, BadConfig{"[]", "JSON object"},
        BadConfig{R"({"architecture":"tost_lm"})", "\"name\""},
        BadConfig{R"({"name":"x","architecture":"bert"})", "architecture"},
        BadConfig{R"({"name":"x","architecture":"tost_lm"})", "\"lm\" object"},
        BadConfig{R"({"name":"x","architecture":"tost_lm","lm":{"n_layer":2,"n_head":3,"n_embd":64,
                  "context_length":8,"vocab_size":257}})",
                  "divisible by n_head"},
        BadConfig{R"({"name":"x","architecture":"tost_lm","lm":{"n_layer":2,"n_head":4,"n_embd":64,
                  "context_length":8,"vocab_size":100}})",
                  "vocab_size must be >= 257"},
        BadConfig{R"({"name":"x","architecture":"tost_lm","lm":{"n_layer":-1,"n_head":4,"n_embd":64,
                  "context_length":8,"vocab_size":257}})",
                  "n_layer"},
        BadConfig{
            R"({"name":"x","architecture":"tost_vision","vision":{"embed_dim":64,"depth":1,"num_heads":4,
                  "patch_size":6,"num_classes":2,"image_height":8,"image_width":8}})",
            "power of two"},
        BadConfig{
            R"({"name":"x","architecture":"tost_vision","vision":{"embed_dim":64,"depth":1,"num_heads":4,
                  "patch_size":4,"num_classes":2,"image_height":8,"image_width":8},"labels":["a"]})",
            "labels"},
        BadConfig{R"({"name":"x","architecture":"tost_vision","dtype":"int8"})", "dtype"},
        BadConfig{
            R"({"name":"x","architecture":"tost_lm","trained":"yes","lm":{"n_layer":1,"n_head":4,
                  "n_embd":64,"context_length":8,"vocab_size":257}})",
            "malformed field"}));

// Strings of config.json reach ListModels, metrics labels and logs: proto3 strings must be UTF-8,
// and one invalid byte would fail ListModels for every client. The message names the file, the
// field and the byte offset, and is itself valid UTF-8 (the parser's own quotes the bytes raw).
void ExpectInvalidUtf8(const std::string& json, const std::string& field, size_t offset) {
  auto c = ParseModelConfig(json, "m/config.json");
  ASSERT_FALSE(c.ok()) << "accepted invalid UTF-8 in " << field;
  const std::string msg(c.status().message());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("m/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid UTF-8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset " + std::to_string(offset)), std::string::npos) << msg;
  EXPECT_NE(msg.find(field), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\xff'), std::string::npos) << "the message quotes the invalid byte raw";
  EXPECT_EQ(msg.find('\xc3'), std::string::npos) << "the message quotes the invalid byte raw";
}

TEST(ModelConfig, InvalidUtf8IsRefusedNamingFieldAndOffset) {
  const std::string lm = kLanguage;
  // "name":"l" -> "name":"l\xff": the byte after the l.
  std::string name = lm;
  const size_t at = name.find("\"l\"") + 2;
  name.insert(at, "\xff");
  ExpectInvalidUtf8(name, "field \"name\"", at);

  std::string description = lm;
  const size_t brace = description.rfind('}');
  description.insert(brace, ",\"provenance\":{\"description\":\"caf\xc3(\"}");
  ExpectInvalidUtf8(description, "field \"provenance.description\"",
                    brace + std::string(",\"provenance\":{\"description\":\"caf").size());

  std::string label = kVision;
  const size_t b = label.find("\"b\"") + 1;
  label.replace(b, 1, "\xc3");  // a lead byte followed by a quote
  ExpectInvalidUtf8(label, "field \"labels[1]\"", b);

  std::string key = lm;
  const size_t k = key.find("\"version\"") + 1;
  key.replace(k, 1, "\xff");
  ExpectInvalidUtf8(key, "a key of the top-level object", k);

  // A field path past 128 bytes is cut, at a character boundary: "provenance." and a key of 116
  // ASCII bytes and an "é" (C3 A9) straddling byte 128, holding an invalid byte.
  std::string deep = lm;
  const std::string long_key = std::string(116, 'k') + "\xc3\xa9";
  const size_t brace_at = deep.rfind('}');
  deep.insert(brace_at, ",\"provenance\":{\"" + long_key + "\":\"\xff\"}");
  auto cut = ParseModelConfig(deep, "m/config.json");
  ASSERT_FALSE(cut.ok());
  const std::string cut_message(cut.status().message());
  EXPECT_EQ(FirstInvalidUtf8(cut_message), std::nullopt) << cut_message;
  EXPECT_NE(cut_message.find(std::string(100, 'k') + "..."), std::string::npos) << cut_message;

  // Valid multi-byte text is fine, raw or escaped.
  std::string fine = lm;
  fine.insert(fine.rfind('}'),
              ",\"provenance\":{\"description\":\"caf\xc3\xa9 \\u00e9 \xf0\x9f\x99\x82\"}");
  EXPECT_TRUE(ParseModelConfig(fine, "m/config.json").ok());
}

// nlohmann's parse errors quote the last bytes read raw, and may stop inside a valid multi-byte
// character: the message must still be UTF-8 (config_fuzz found it).
TEST(ModelConfig, ParseErrorsQuoteNoBrokenCharacter) {
  auto c = ParseModelConfig("{\"name\": \"x\" \xc3\xa9}", "m/config.json");
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\\xc3"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\xc3'), std::string::npos) << msg;
}

}  // namespace
}  // namespace tost::model
