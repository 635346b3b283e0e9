// The gpt2 tokenizer against tiktoken and Hugging Face tokenizers: tests/model/fixtures/gpt2 holds
// files in GPT-2's formats with a small merge table (tools/gpt2_fixtures.py; the real files cannot
// be fetched here) and the pieces and ids both references give for each case. Both file forms the
// server loads (encoder.json + vocab.bpe, and a tiktoken rank file) must give exactly those.
#include "model/text/gpt2_tokenizer.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "model/config/config.h"
#include "model/text/tokenizer.h"

namespace tost::model {
namespace {

using ::testing::HasSubstr;

const std::string& FixtureDir() {
  static const std::string dir = std::string(TOST_SOURCE_DIR) + "/tests/model/fixtures/gpt2";
  return dir;
}

std::string Read(const std::string& name) {
  absl::StatusOr<std::string> text = ReadFileToString(FixtureDir() + "/" + name);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

const nlohmann::json& Cases() {
  static const nlohmann::json* cases =
      new nlohmann::json(nlohmann::json::parse(Read("cases.json")));
  return *cases;
}

int64_t EndOfText() { return Cases()["meta"]["eot_id"].get<int64_t>(); }

std::unique_ptr<Gpt2Tokenizer> FromEncoder() {
  auto tok = Gpt2Tokenizer::FromEncoderAndMerges(Read("encoder.json"), "encoder.json",
                                                 Read("vocab.bpe"), "vocab.bpe", EndOfText());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::unique_ptr<Gpt2Tokenizer> FromRanks() {
  auto tok = Gpt2Tokenizer::FromRanks(Read("gpt2.tiktoken"), "gpt2.tiktoken", EndOfText());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::string Decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += tok.TokenBytes(id);
  return out;
}

class Gpt2FixtureTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<Gpt2Tokenizer> Make() const {
    return std::string(GetParam()) == "encoder" ? FromEncoder() : FromRanks();
  }
};

TEST_P(Gpt2FixtureTest, PiecesAndIdsEqualTiktokenAndHuggingFaceOnEveryCase) {
  const auto tok = Make();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), Cases()["meta"]["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok->eos_token_id(), EndOfText());
  ASSERT_GE(Cases()["cases"].size(), 40u);
  for (const auto& c : Cases()["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(c.value("name", text));
    std::vector<std::string> pieces;
    for (std::string_view p : tok->PreTokenize(text)) pieces.emplace_back(p);
    if (c.contains("pieces")) {
      EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>());
    }
    const std::vector<int32_t> ids = tok->Encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(Decode(*tok, ids), text);
  }
}

TEST_P(Gpt2FixtureTest, EndOfTextInsidePromptTextIsText) {
  const auto tok = Make();
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode("a<|endoftext|>b");
  EXPECT_THAT(ids, ::testing::Not(::testing::Contains(EndOfText())));
  EXPECT_EQ(Decode(*tok, ids), "a<|endoftext|>b");
  EXPECT_EQ(tok->TokenBytes(static_cast<int32_t>(EndOfText())), "") << "a special token";
}

TEST_P(Gpt2FixtureTest, BytesThatAreNotUtf8StillEncodeAndRoundTrip) {
  const auto tok = Make();
  ASSERT_NE(tok, nullptr);
  for (const std::string& text :
       {std::string("caf\xC3"), std::string("\xFF\xFE the end"),
        std::string("a\x80\x80 b \xED\xA0\x80 c"), std::string("\xF0\x9F\x98")}) {
    const std::vector<int32_t> ids = tok->Encode(text);
    EXPECT_EQ(Decode(*tok, ids), text);
    std::string joined;
    for (std::string_view p : tok->PreTokenize(text)) joined.append(p);
    EXPECT_EQ(joined, text);
  }
}

TEST_P(Gpt2FixtureTest, AMegabyteWordEncodesInLinearithmicTime) {
  const auto tok = Make();
  ASSERT_NE(tok, nullptr);
  const std::string word(1 << 20, 'e');  // one piece: the pattern never splits a letter run
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->Encode(word);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(Decode(*tok, ids), word);
  // Quadratic merging would take hours here; the heap takes well under a second.
  EXPECT_LT(seconds, 10.0);
}

INSTANTIATE_TEST_SUITE_P(BothFileForms, Gpt2FixtureTest, ::testing::Values("encoder", "ranks"));

TEST(Gpt2Tokenizer, RefusesFilesThatDoNotDescribeAGpt2Vocabulary) {
  const std::string encoder = Read("encoder.json"), merges = Read("vocab.bpe");
  const auto error = [](const absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>>& made) {
    EXPECT_FALSE(made.ok());
    return std::string(made.status().message());
  };
  EXPECT_THAT(error(Gpt2Tokenizer::FromEncoderAndMerges(encoder, "enc", merges, "mer", 5)),
              HasSubstr("<|endoftext|>"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromEncoderAndMerges("[1,2]", "enc", merges, "mer", 5)),
              HasSubstr("enc: must be a JSON object"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromEncoderAndMerges(encoder, "enc", "#version: 0.2\nzz\n",
                                                        "mer", EndOfText())),
              HasSubstr("mer: line 2"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromEncoderAndMerges(R"({"a": 0, "<|endoftext|>": 1})", "enc",
                                                        "", "mer", 1)),
              HasSubstr("no token for the byte"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromRanks("YQ== 0\nYg== 2\n", "ranks", 9)),
              HasSubstr("ranks must be 0 .. n-1"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromRanks(Read("gpt2.tiktoken"), "ranks", 3)),
              HasSubstr("end of text must be a special id after them"));
  EXPECT_THAT(error(Gpt2Tokenizer::FromRanks("not base64!! 0\n", "ranks", 9)),
              HasSubstr("ranks: line 1"));
}

TEST(Gpt2Tokenizer, ConfigNamesItsFilesInsideTheModelDirectory) {
  const std::string lm = R"("architecture":"tost_lm","lm":{"n_layer":1,"n_head":1,"n_embd":4,
      "context_length":8,"vocab_size":50304})";
  auto parse = [&](const std::string& tokenizer) {
    return ParseModelConfig(absl::StrCat(R"({"name":"x",)", lm, R"(,"tokenizer":)", tokenizer, "}"),
                            "config.json");
  };
  auto gpt2 = parse(R"({"type":"gpt2"})");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ(gpt2->language.tokenizer_encoder_file, "encoder.json");
  EXPECT_EQ(gpt2->language.tokenizer_merges_file, "vocab.bpe");
  EXPECT_EQ(gpt2->language.eos_token_id, 50256);
  auto ranks = parse(R"({"type":"gpt2","ranks_file":"gpt2.tiktoken"})");
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(ranks->language.tokenizer_ranks_file, "gpt2.tiktoken");
  EXPECT_FALSE(parse(R"({"type":"gpt2","ranks_file":"../gpt2.tiktoken"})").ok());
  EXPECT_FALSE(parse(R"({"type":"gpt2","ranks_file":"a","encoder_file":"b"})").ok());
  auto none = parse(R"({"type":"none"})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->language.eos_token_id, -1);
  EXPECT_FALSE(parse(R"({"type":"none","eos_token_id":50304})").ok());
  EXPECT_THAT(parse(R"({"type":"sentencepiece"})").status().message(), HasSubstr("\"none\""));
}

TEST(NoTextTokenizer, TakesTokenIdsOnly) {
  const NoTextTokenizer tok(256, -1);
  EXPECT_FALSE(tok.encodes_text());
  EXPECT_STREQ(tok.type(), "none");
  EXPECT_EQ(tok.TokenBytes(65), "");
  EXPECT_EQ(tok.vocab_size(), 256);
}

}  // namespace
}  // namespace tost::model
