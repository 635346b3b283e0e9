// Tokenizers (byte, byte-level BPE), incremental UTF-8 assembly and the sampler.
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "model/config/config.h"
#include "model/sampling/sampler.h"
#include "model/text/bpe_tokenizer.h"
#include "model/text/tokenizer.h"
#include "tests/model/test_util.h"

namespace tost::model {
namespace {

TEST(ByteTokenizer, EncodesBytesAndDecodesSpecialsToNothing) {
  ByteTokenizer tok(257, 256);
  EXPECT_EQ(tok.Encode("A\xC3\xA9"), (std::vector<int32_t>{65, 0xC3, 0xA9}));
  EXPECT_EQ(tok.TokenBytes(65), "A");
  EXPECT_EQ(tok.TokenBytes(256), "");
  EXPECT_TRUE(tok.IsSpecial(256));
}

// A small vocabulary by hand: 256 = "th", 257 = "the", 258 = " the", 259 = "ee", end-of-text 260.
constexpr char kSmallBpe[] =
    R"({"format":"tost-bpe-v1","max_piece_bytes":8,"merges":[[116,104],[256,101],[32,257],[101,101]],)"
    R"("special_tokens":{"<|endoftext|>":260}})";

std::unique_ptr<BpeTokenizer> SmallBpe() {
  auto tok = BpeTokenizer::Parse(kSmallBpe, "small.json", 261, 260);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

TEST(BpeTokenizer, MergesByRankAndDecodesToTheSameBytes) {
  const auto tok = SmallBpe();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("the"), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok->Encode(" the"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok->Encode("thee"),
            (std::vector<int32_t>{257, 101}));  // rank 1 ("the") beats rank 3 ("ee")
  EXPECT_EQ(tok->Encode("eee"), (std::vector<int32_t>{259, 101}));  // left to right, no overlaps
  EXPECT_EQ(tok->TokenBytes(258), " the");
  EXPECT_EQ(tok->TokenBytes(260), "");  // end-of-text stands for no bytes
  EXPECT_EQ(tok->TokenBytes(-1), "");
  EXPECT_EQ(tok->TokenBytes(5000), "");
  EXPECT_EQ(tok->merges(), 4);
  EXPECT_STREQ(tok->type(), "bpe");
  const std::string text = "then  the\n\tthee, 1811 caf\xC3\xA9 \xFF\x00";
  std::string round_trip;
  for (int32_t id : tok->Encode(text)) round_trip += tok->TokenBytes(id);
  EXPECT_EQ(round_trip, text);
}

std::vector<std::string> Pieces(std::string_view text, int64_t max_piece_bytes = 32) {
  std::vector<std::string> out;
  for (std::string_view p : BpeTokenizer::PreTokenize(text, max_piece_bytes)) out.emplace_back(p);
  return out;
}

TEST(BpeTokenizer, PreTokenizationFollowsToolsBpePy) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Pieces("a  b"), (V{"a", " ", " b"}));      // a run's last space joins the word
  EXPECT_EQ(Pieces("a\n\nb"), (V{"a", "\n\n", "b"}));  // other whitespace does not
  EXPECT_EQ(Pieces("end. "), (V{"end", ".", " "}));    // trailing space stays alone
  EXPECT_EQ(Pieces("in 1811, \"no\""), (V{"in", " 1811", ",", " \"", "no", "\""}));
  EXPECT_EQ(Pieces("caf\xC3\xA9s"), (V{"caf\xC3\xA9s"}));           // UTF-8 stays inside words
  EXPECT_EQ(Pieces(" abcdefghij", 4), (V{" abc", "defg", "hij"}));  // cut at max_piece_bytes
  EXPECT_EQ(Pieces(""), V{});
}

TEST(BpeTokenizer, HostileInputEncodesInLinearTime) {
  const auto tok = SmallBpe();
  ASSERT_NE(tok, nullptr);
  // One 4 MiB "word": pieces are capped, so this is ~0.5M tiny pieces, not one quadratic one.
  const std::string text(4 << 20, 'e');
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->Encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ids.size(), text.size() / 2);  // "ee" pairs
  EXPECT_LT(seconds, 5.0);
}

TEST(BpeTokenizer, MalformedFilesAreRefusedWithTheReason) {
  const auto error = [](std::string_view json, int64_t vocab = 261, int64_t eos = 260) {
    auto tok = BpeTokenizer::Parse(json, "m/tokenizer.json", vocab, eos);
    return tok.ok() ? std::string("OK") : std::string(tok.status().message());
  };
  EXPECT_EQ(error(kSmallBpe), "OK");
  EXPECT_NE(error("{").find("m/tokenizer.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error(R"({"format":"gpt2","max_piece_bytes":8,"merges":[]})")
                .find("\"format\" must be \"tost-bpe-v1\""),
            std::string::npos);
  EXPECT_NE(
      error(kSmallBpe, 300).find("vocabulary of 261 ids, but config.json says vocab_size 300"),
      std::string::npos);
  EXPECT_NE(error(kSmallBpe, 261, 259).find("end-of-text id is 260"), std::string::npos);
  EXPECT_NE(
      error(
          R"({"format":"tost-bpe-v1","max_piece_bytes":8,"merges":[[300,1]],"special_tokens":{"<|endoftext|>":257}})",
          258, 257)
          .find("merge 0 [300, 1] refers to an id outside [0, 256)"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"format":"tost-bpe-v1","max_piece_bytes":8,"merges":[[1,2],[1,2]],"special_tokens":{"<|endoftext|>":258}})",
          259, 258)
          .find("merge 1 [1, 2] repeats merge 0"),
      std::string::npos);
  EXPECT_NE(error(R"({"format":"tost-bpe-v1","max_piece_bytes":0,"merges":[]})", 257, 256)
                .find("max_piece_bytes"),
            std::string::npos);
  EXPECT_NE(error(R"({"format":"tost-bpe-v1","max_piece_bytes":8,"merges":[],"special_tokens":{}})",
                  257, 256)
                .find("<|endoftext|>"),
            std::string::npos);
}

TEST(BpeTokenizer, ConfigNamesAFileInsideTheModelDirectory) {
  const auto parse = [](const std::string& tokenizer) {
    return ParseModelConfig(
        absl::StrCat(
            R"({"format_version":1,"name":"m","architecture":"tost_lm",)",
            R"("lm":{"n_layer":1,"n_head":1,"n_embd":8,"context_length":8,"vocab_size":261},)",
            R"("tokenizer":)", tokenizer, "}"),
        "m/config.json");
  };
  auto ok = parse(R"({"type":"bpe","eos_token_id":260})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->language.tokenizer, "bpe");
  EXPECT_EQ(ok->language.tokenizer_file, "tokenizer.json");
  for (const char* bad : {R"({"type":"bpe","file":"../x.json","eos_token_id":260})",
                          R"({"type":"bpe","file":"/etc/passwd","eos_token_id":260})",
                          R"({"type":"bpe","file":"..","eos_token_id":260})"}) {
    auto r = parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(
        r.status().message().find("tokenizer.file must be a file name inside the model directory"),
        std::string::npos)
        << r.status();
  }
  auto wrong = parse(R"({"type":"sentencepiece"})");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find(
                R"(tokenizer.type must be "byte", "bpe", "gpt2" or "none", got "sentencepiece")"),
            std::string::npos);
}

// The C++ encoder against tools/bpe.py on the fixtures make_parity_fixtures.py writes: the small
// tokenizer trained there and the shipped model's (models/tost-austen/tokenizer.json).
TEST(ParityBpe, EncodesExactlyAsToolsBpePy) {
  if (testing::ParityDir().empty())
    GTEST_FAIL() << "TOST_PARITY_DIR is not set (run through ctest)";
  const std::string dir = testing::ParityDir() + "/bpe";
  const auto cases = ReadFileToString(dir + "/cases.json");
  ASSERT_TRUE(cases.ok()) << cases.status();
  const nlohmann::json doc = nlohmann::json::parse(*cases);
  std::map<std::string, std::unique_ptr<BpeTokenizer>> tokenizers;
  int checked = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["tokenizer"];
    auto& tok = tokenizers[name];
    if (tok == nullptr) {
      const auto text = ReadFileToString(dir + "/" + name + "/tokenizer.json");
      ASSERT_TRUE(text.ok()) << text.status();
      const int64_t vocab = c["vocab_size"];
      auto parsed = BpeTokenizer::Parse(*text, name, vocab, vocab - 1);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      tok = *std::move(parsed);
    }
    const std::string text = absl::HexStringToBytes(c["text_hex"].get<std::string>());
    std::vector<std::string> pieces;
    for (const auto& p : c["pieces_hex"])
      pieces.push_back(absl::HexStringToBytes(p.get<std::string>()));
    EXPECT_EQ(Pieces(text), pieces) << name << ": " << c["text_hex"];
    EXPECT_EQ(tok->Encode(text), c["ids"].get<std::vector<int32_t>>())
        << name << ": " << c["text_hex"];
    ++checked;
  }
  EXPECT_GE(checked, 19);
  std::cout << checked << " encodings checked with tokenizers:";
  for (const auto& [name, tok] : tokenizers)
    std::cout << " " << name << " (" << tok->vocab_size() << ")";
  std::cout << "\n";
}

TEST(Utf8Assembler, HoldsIncompleteCharactersBack) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("h"), "h");
  EXPECT_EQ(a.Push("\xE2"), "");  // first byte of a 3-byte euro sign
  EXPECT_EQ(a.Push("\x82"), "");
  EXPECT_EQ(a.Push("\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(a.Push("\xF0\x9F"), "");
  EXPECT_EQ(a.Flush(), "\xEF\xBF\xBD");  // an unfinished character at the end becomes U+FFFD
  EXPECT_EQ(a.pending(), "");
}

TEST(Utf8Assembler, ReplacesInvalidBytesWithoutBlocking) {
  Utf8Assembler a;
  EXPECT_EQ(a.Push("\xFF"
                   "a"),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(a.Push("\xC3"
                   "b"),
            "\xEF\xBF\xBD"
            "b");  // lead byte followed by ASCII
  EXPECT_EQ(a.Push("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");          // a surrogate is not UTF-8
  EXPECT_EQ(a.Push("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
}

TEST(Sampler, GreedyTakesTheArgmax) {
  const std::vector<float> logits = {0.1f, 3.f, -1.f, 3.f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleToken(logits, p, 0), 1);  // ties go to the lowest id
}

TEST(Sampler, DrawsAreAPureFunctionOfSeedAndPosition) {
  const std::vector<float> logits = {1.f, 1.2f, 0.8f, 1.1f, 0.9f};
  SamplingParams p;
  p.seed = 42;
  std::vector<int32_t> first, second;
  for (uint64_t pos = 0; pos < 50; ++pos) first.push_back(SampleToken(logits, p, pos));
  for (uint64_t pos = 0; pos < 50; ++pos) second.push_back(SampleToken(logits, p, pos));
  EXPECT_EQ(first, second);
  p.seed = 43;
  std::vector<int32_t> other;
  for (uint64_t pos = 0; pos < 50; ++pos) other.push_back(SampleToken(logits, p, pos));
  EXPECT_NE(first, other);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {0.f, std::log(3.f)};  // p = 1/4, 3/4
  SamplingParams p;
  p.seed = 7;
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += SampleToken(logits, p, i);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  const std::vector<float> logits = {5.f, 4.f, 0.f, -1.f, 4.5f};
  SamplingParams p;
  p.seed = 3;
  p.top_k = 2;
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[SampleToken(logits, p, i)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(4));
  p.top_k = 0;
  p.top_p = 0.5f;  // the top token alone holds > 50%
  for (int i = 0; i < 200; ++i) EXPECT_EQ(SampleToken(logits, p, i), 0);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(ValidateSamplingParams(p).message().find("temperature"), std::string::npos);
  p = {};
  p.top_k = -3;
  EXPECT_NE(ValidateSamplingParams(p).message().find("top_k"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

TEST(Sampler, MinPDropsTheUnlikelyTail) {
  const std::vector<float> logits = {2.f, 1.9f, -3.f, -4.f};
  SamplingParams p;
  p.seed = 11;
  p.min_p = 0.2f;
  for (int i = 0; i < 500; ++i) EXPECT_LT(SampleToken(logits, p, i), 2);
}

TEST(Sampler, RepetitionPenaltyDiscouragesRecentTokens) {
  const std::vector<float> logits = {1.f, 0.9f};
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleToken(logits, p, 0), 0);
  p.repetition_penalty = 1.5f;
  const std::vector<int32_t> recent = {0, 0, 0};
  EXPECT_EQ(SampleToken(logits, p, 0, recent), 1);  // 1/1.5 < 0.9
}

TEST(Sampler, TopLogprobsAreNormalisedAndSorted) {
  const std::vector<float> logits = {0.f, 2.f, 1.f};
  const auto top = TopLogprobs(logits, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(top[0].second, 2.0 - std::log(z), 1e-6);
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

TEST(DrawTokens, EachRowIsTheSampleOfItsOwnLogits) {
  const std::vector<float> logits = {0.f, 2.f,  1.f, 9.f,   // row 0: id 3 padded away
                                     3.f, -1.f, 3.f, 9.f};  // row 1
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams warm;
  warm.seed = 5;
  const std::vector<int32_t> recent = {0};
  const std::vector<TokenDraw> draws = {{greedy, 7, {}, 2}, {warm, 8, recent, 0}};
  const std::vector<DrawnToken> drawn = DrawTokens(logits, /*defined_vocab=*/3, draws);
  ASSERT_EQ(drawn.size(), 2u);
  EXPECT_EQ(drawn[0].id, 1);  // never the undefined id 3
  EXPECT_EQ(drawn[0].nonfinite_id, -1);
  const std::vector<float> row0 = {0.f, 2.f, 1.f};
  const auto want_top = TopLogprobs(row0, 2);
  ASSERT_EQ(drawn[0].top_logprobs.size(), 2u);
  EXPECT_EQ(drawn[0].top_logprobs[0].first, want_top[0].first);
  EXPECT_FLOAT_EQ(drawn[0].top_logprobs[0].second, want_top[0].second);
  const std::vector<float> row1 = {3.f, -1.f, 3.f, -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(drawn[1].id, SampleToken(row1, warm, 8, recent));
  EXPECT_TRUE(drawn[1].top_logprobs.empty());
}

// The drawn token's own logprob: the listed value when it is among the alternatives, and a
// finite value below the best alternative when a hot temperature draws an unlikely token.
TEST(DrawTokens, TheDrawnTokensLogprobIsItsAlternativeOrBelowTheBest) {
  constexpr int64_t kDefined = 40;
  std::vector<float> logits;
  for (int64_t i = 0; i < kDefined; ++i) logits.push_back(-0.25f * static_cast<float>(i));
  logits.push_back(50.f);  // padded away: neither drawn nor counted in the normalisation
  double z = 0;
  for (int64_t i = 0; i < kDefined; ++i) z += std::exp(static_cast<double>(logits[i]));
  SamplingParams hot;
  hot.temperature = 4.f;
  hot.seed = 11;
  int among = 0, outside = 0;
  for (uint64_t position = 0; position < 64; ++position) {
    const TokenDraw with_alternatives{hot, position, {}, 3};
    const TokenDraw own_only{hot, position, {}, 0, /*logprobs=*/true};
    const TokenDraw neither{hot, position, {}, 0};
    std::vector<float> rows = logits;
    rows.insert(rows.end(), logits.begin(), logits.end());
    rows.insert(rows.end(), logits.begin(), logits.end());
    const std::vector<DrawnToken> drawn =
        DrawTokens(rows, kDefined, std::vector<TokenDraw>{with_alternatives, own_only, neither});
    const DrawnToken& d = drawn[0];
    ASSERT_EQ(d.top_logprobs.size(), 3u);
    EXPECT_NEAR(d.logprob, logits[d.id] - std::log(z), 1e-5) << "position " << position;
    bool listed = false;
    for (const auto& [id, lp] : d.top_logprobs) {
      if (id != d.id) continue;
      listed = true;
      EXPECT_EQ(d.logprob, lp) << "position " << position;
    }
    if (!listed) {
      EXPECT_TRUE(std::isfinite(d.logprob)) << "position " << position;
      EXPECT_LT(d.logprob, d.top_logprobs[0].second) << "position " << position;
    }
    (listed ? among : outside) += 1;
    // Asking for the logprob alone gives the same value, without alternatives.
    EXPECT_EQ(drawn[1].id, d.id);
    EXPECT_EQ(drawn[1].logprob, d.logprob);
    EXPECT_TRUE(drawn[1].top_logprobs.empty());
    EXPECT_EQ(drawn[2].logprob, 0.f);
    EXPECT_TRUE(drawn[2].top_logprobs.empty());
  }
  // Seed 11 at temperature 4 draws both kinds of token within 64 positions.
  EXPECT_GT(among, 0);
  EXPECT_GT(outside, 0);
}

TEST(DrawTokens, ANonFiniteLogitIsReportedByItsFirstId) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.f, std::nanf(""), inf, inf};  // id 3 padded: not checked
  const std::vector<TokenDraw> draws = {{}};
  EXPECT_EQ(DrawTokens(logits, 3, draws)[0].nonfinite_id, 1);
  const std::vector<float> padded_only = {0.f, 1.f, 2.f, inf};
  EXPECT_EQ(DrawTokens(padded_only, 3, draws)[0].nonfinite_id, -1);
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

// Equal logits are candidates in id order, and -0 equals +0: three tied candidates among a
// vocabulary large enough for the radix-sorted path, each drawn where its third of [0, 1) says.
TEST(Sampler, TiedCandidatesAndSignedZerosKeepTheirIdOrder) {
  std::vector<float> logits(4096, -1e30f);
  logits[5] = -0.f;
  logits[9] = 0.f;
  logits[2] = -0.f;
  SamplingParams p;
  p.seed = 17;
  const int32_t ids[] = {2, 5, 9};
  for (uint64_t pos = 0; pos < 60; ++pos) {
    const double u = CounterUniform(p.seed, pos);
    const int third = u * 3 < 1 ? 0 : u * 3 < 2 ? 1 : 2;
    EXPECT_EQ(SampleToken(logits, p, pos), ids[third]) << "position " << pos << ", u " << u;
  }
  p.top_k = 2;  // the selected path: the two lowest ids of the tie
  for (uint64_t pos = 0; pos < 60; ++pos) {
    EXPECT_EQ(SampleToken(logits, p, pos), CounterUniform(p.seed, pos) * 2 < 1 ? 2 : 5);
  }
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

// OpenAI's logit_bias: added to the ids' logits before the draw and the logprobs, after the
// constraint's mask (a forbidden id stays forbidden), never to a padded id.
TEST(DrawTokens, LogitBiasMovesTheDrawAndTheLogprobs) {
  const std::vector<float> logits = {3.f, 1.f, 0.f, 9.f};  // id 3 padded away
  SamplingParams greedy;
  greedy.temperature = 0;
  TokenDraw plain{greedy, 1, {}, 3, true};
  EXPECT_EQ(DrawTokens(logits, 3, std::vector<TokenDraw>{plain})[0].id, 0);

  const std::vector<std::pair<int32_t, float>> bias = {{2, 100.f}, {0, -100.f}, {3, 100.f}};
  TokenDraw biased = plain;
  biased.logit_bias = bias;
  const DrawnToken d = DrawTokens(logits, 3, std::vector<TokenDraw>{biased})[0];
  EXPECT_EQ(d.id, 2);
  const std::vector<float> want_row = {-97.f, 1.f, 100.f};
  const auto want = TopLogprobs(want_row, 3);
  ASSERT_EQ(d.top_logprobs.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(d.top_logprobs[k].first, want[k].first);
    EXPECT_FLOAT_EQ(d.top_logprobs[k].second, want[k].second);
  }
  EXPECT_FLOAT_EQ(d.logprob, want[0].second);

  // A constraint that forbids id 2: its bias of +100 does not bring it back.
  const std::vector<uint32_t> allowed = {0b011u};
  biased.allowed = allowed;
  EXPECT_EQ(DrawTokens(logits, 3, std::vector<TokenDraw>{biased})[0].id, 1);

  // A sampled draw with a bias of -100 on every id but one draws that one, seed after seed.
  SamplingParams warm;
  const std::vector<std::pair<int32_t, float>> only_one = {{0, -100.f}, {2, -100.f}};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    warm.seed = seed;
    TokenDraw draw{warm, seed, {}, 0};
    draw.logit_bias = only_one;
    EXPECT_EQ(DrawTokens(logits, 3, std::vector<TokenDraw>{draw})[0].id, 1) << "seed " << seed;
  }
}

TEST(Sampler, ApplyLogitBiasSkipsIdsOutsideTheLogits) {
  std::vector<float> logits = {1.f, 2.f};
  const std::vector<std::pair<int32_t, float>> bias = {{-1, 5.f}, {1, -0.5f}, {2, 7.f}};
  ApplyLogitBias(bias, absl::MakeSpan(logits));
  EXPECT_EQ(logits, (std::vector<float>{1.f, 1.5f}));
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

// Prompt scoring reads row i - 1 for token i, normalised over the defined ids, with the
// alternatives TopLogprobs gives.
TEST(ScoreTokens, EachTokenIsScoredByTheRowBeforeIt) {
  const std::vector<int32_t> tokens = {2, 0, 1, 3};          // 3 is padded away
  const std::vector<float> logits = {0.f,  1.f, 2.f,  50.f,  // after token 2: scores 0
                                     3.f,  1.f, -1.f, 50.f,  // after 0: scores 1
                                     0.5f, 0.f, 0.f,  50.f,  // after 1: scores 3 (undefined)
                                     9.f,  9.f, 9.f,  9.f};  // after 3: nothing left to score
  const std::vector<DrawnToken> scored = ScoreTokens(logits, /*defined_vocab=*/3, tokens, 2);
  ASSERT_EQ(scored.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<float> row(logits.begin() + i * 4, logits.begin() + i * 4 + 3);
    const auto want = TopLogprobs(row, 3);
    EXPECT_EQ(scored[i].id, tokens[i + 1]);
    float own = 0;
    for (const auto& [id, lp] : want) own = id == tokens[i + 1] ? lp : own;
    EXPECT_FLOAT_EQ(scored[i].logprob, own) << i;
    ASSERT_EQ(scored[i].top_logprobs.size(), 2u);
    EXPECT_EQ(scored[i].top_logprobs[0], want[0]);
    EXPECT_EQ(scored[i].top_logprobs[1], want[1]);
  }
  EXPECT_EQ(scored[2].id, 3);
  EXPECT_EQ(scored[2].logprob, -std::numeric_limits<float>::infinity());
  // The sum of a prompt's logprobs is its log-likelihood: log p(0 | 2) + log p(1 | 0).
  const double z0 = std::exp(0.0) + std::exp(1.0) + std::exp(2.0);
  const double z1 = std::exp(3.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(scored[0].logprob + scored[1].logprob, (0.0 - std::log(z0)) + (1.0 - std::log(z1)),
              1e-6);
  // A one-token prompt has nothing to score: its first token has no logprob.
  EXPECT_TRUE(ScoreTokens(std::vector<float>(4, 0.f), 3, std::vector<int32_t>{1}, 2).empty());
}

TEST(ScoreTokens, ANonFiniteLogitIsReported) {
  const std::vector<float> logits = {0.f, std::nanf(""), 0.f, 0.f};
  const std::vector<DrawnToken> scored = ScoreTokens(logits, 2, std::vector<int32_t>{0, 1}, 0);
  ASSERT_EQ(scored.size(), 1u);
  EXPECT_EQ(scored[0].nonfinite_id, 1);
}

}  // namespace
}  // namespace tost::model
