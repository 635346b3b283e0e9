#include "model/config.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tost::model
