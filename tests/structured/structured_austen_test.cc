// service/structured over the shipped language model's tokenizer (models/tost-austen: byte-level
// BPE, 2048 tokens, end-of-text 2047): outputs sampled under the masks are what the constraint
// asks for, Replay rebuilds a matcher, the cache hits, misses, evicts and bounds its compiles.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "model/config/config.h"
#include "model/text/tokenizer.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"
#include "service/structured/constraint_matcher.h"
#include "service/structured/grammar_cache.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModelName[] = "tost-austen";

const model::Tokenizer& AustenTokenizer() {
  static const model::Tokenizer* tokenizer = [] {
    const std::string dir = absl::StrCat(TOST_SOURCE_DIR, "/models/tost-austen");
    auto config = model::LoadModelConfig(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    auto loaded = model::LoadTokenizer(dir, config->language);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded->release();
  }();
  return *tokenizer;
}

std::shared_ptr<GrammarVocabulary> AustenVocabulary(int64_t model_vocab_size = 0) {
  const model::Tokenizer& tokenizer = AustenTokenizer();
  auto vocabulary = GrammarVocabulary::Create(
      tokenizer, model_vocab_size > 0 ? model_vocab_size : tokenizer.vocab_size(), kModelName);
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  return *vocabulary;
}

std::shared_ptr<const CompiledConstraint> MustCompile(
    const std::shared_ptr<GrammarVocabulary>& vocabulary, const Constraint& constraint) {
  auto compiled = CompileConstraint(vocabulary, constraint);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  return compiled.ok() ? *compiled : nullptr;
}

Constraint Schema(std::string schema) {
  return Constraint{Constraint::Kind::kJsonSchema, std::move(schema), {}};
}

std::vector<int32_t> AllowedIds(const std::vector<uint32_t>& words, int64_t vocab_size) {
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < static_cast<int32_t>(words.size()) * 32; ++id) {
    if ((words[id / 32] >> (id % 32)) & 1u) allowed.push_back(id);
  }
  EXPECT_TRUE(allowed.empty() || allowed.back() < vocab_size);
  return allowed;
}

struct Walk {
  std::vector<int32_t> tokens;  // end-of-text included when the walk ended
  std::string text;             // the output's bytes
  bool ended = false;
  std::string failure;
};

// Samples one output as a sampler would under the masks: uniformly among the allowed ids, until
// end-of-text is picked or max_steps tokens. The mask is checked against CanEnd at every step.
Walk RandomWalk(const std::shared_ptr<const CompiledConstraint>& compiled, std::mt19937& rng,
                int max_steps) {
  const model::Tokenizer& tokenizer = AustenTokenizer();
  const int32_t eos = compiled->vocabulary->eos_token_id();
  ConstraintMatcher matcher(compiled);
  std::vector<uint32_t> words(matcher.bitmask_words());
  Walk walk;
  for (int step = 0; step < max_steps; ++step) {
    matcher.FillAllowed(absl::MakeSpan(words));
    const std::vector<int32_t> allowed =
        AllowedIds(words, compiled->vocabulary->model_vocab_size());
    if (allowed.empty()) {
      walk.failure = absl::StrCat("no token allowed after \"", absl::CHexEscape(walk.text), "\"");
      return walk;
    }
    const bool eos_allowed = std::binary_search(allowed.begin(), allowed.end(), eos);
    if (eos_allowed != matcher.CanEnd()) {
      walk.failure = absl::StrCat("the mask ", eos_allowed ? "allows" : "does not allow",
                                  " end-of-text but CanEnd() is ", matcher.CanEnd());
      return walk;
    }
    const int32_t token =
        allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (absl::Status accepted = matcher.Accept(token); !accepted.ok()) {
      walk.failure = absl::StrCat("an allowed token was refused: ", accepted.message());
      return walk;
    }
    walk.tokens.push_back(token);
    if (token == eos) {
      walk.ended = matcher.Ended();
      if (!walk.ended) walk.failure = "end-of-text accepted but Ended() is false";
      return walk;
    }
    walk.text += tokenizer.TokenBytes(token);
  }
  return walk;
}

int CodePoints(const std::string& utf8) {
  return static_cast<int>(
      std::count_if(utf8.begin(), utf8.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// 20 walks under `schema`, each strict JSON that `check` accepts (it adds failures itself).
void WalkSchema(const std::string& schema, uint32_t seed,
                const std::function<void(const nlohmann::json&, const std::string&)>& check) {
  auto compiled = MustCompile(AustenVocabulary(), Schema(schema));
  ASSERT_NE(compiled, nullptr);
  std::mt19937 rng(seed);
  constexpr int kMaxSteps = 512;  // every schema below bounds its output well under this
  for (int i = 0; i < 20; ++i) {
    const Walk walk = RandomWalk(compiled, rng, kMaxSteps);
    ASSERT_TRUE(walk.failure.empty()) << "walk " << i << ": " << walk.failure;
    ASSERT_TRUE(walk.ended) << "walk " << i << " did not end in " << kMaxSteps << " tokens: \""
                            << absl::CHexEscape(walk.text) << "\"";
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(walk.text);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "walk " << i << " generated \"" << absl::CHexEscape(walk.text)
                    << "\", which is not JSON: " << e.what();
      continue;
    }
    check(value, absl::StrCat("walk ", i, ": ", walk.text));
  }
}

TEST(StructuredAusten, WalksUnderANestedObjectSchema) {
  WalkSchema(R"({"type":"object","properties":{)"
             R"("name":{"type":"string","maxLength":8},)"
             R"("address":{"type":"object","properties":{)"
             R"("city":{"type":"string","maxLength":10},)"
             R"("zip":{"type":"integer","minimum":0,"maximum":99999}},"required":["city","zip"]}},)"
             R"("required":["name","address"]})",
             1, [](const nlohmann::json& v, const std::string& what) {
               ASSERT_TRUE(v.is_object()) << what;
               ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << what;
               EXPECT_LE(CodePoints(v["name"].get<std::string>()), 8) << what;
               ASSERT_TRUE(v.contains("address") && v["address"].is_object()) << what;
               const nlohmann::json& address = v["address"];
               ASSERT_TRUE(address.contains("city") && address["city"].is_string()) << what;
               EXPECT_LE(CodePoints(address["city"].get<std::string>()), 10) << what;
               ASSERT_TRUE(address.contains("zip") && address["zip"].is_number_integer()) << what;
               EXPECT_GE(address["zip"].get<int64_t>(), 0) << what;
               EXPECT_LE(address["zip"].get<int64_t>(), 99999) << what;
               for (const auto& [key, unused] : v.items()) {
                 EXPECT_TRUE(key == "name" || key == "address") << what;  // strict: no other keys
               }
             });
}

TEST(StructuredAusten, WalksUnderAnArrayOfEnums) {
  WalkSchema(R"({"type":"array","items":{"enum":["red","green","blue"]},"minItems":1,)"
             R"("maxItems":4})",
             2, [](const nlohmann::json& v, const std::string& what) {
               ASSERT_TRUE(v.is_array()) << what;
               EXPECT_GE(v.size(), 1u) << what;
               EXPECT_LE(v.size(), 4u) << what;
               for (const nlohmann::json& item : v) {
                 ASSERT_TRUE(item.is_string()) << what;
                 const std::string color = item.get<std::string>();
                 EXPECT_TRUE(color == "red" || color == "green" || color == "blue") << what;
               }
             });
}

TEST(StructuredAusten, WalksUnderRequiredFields) {
  WalkSchema(R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,)"
             R"("maximum":1000},"ok":{"type":"boolean"},"note":{"type":"string","maxLength":6}},)"
             R"("required":["id","ok"]})",
             3, [](const nlohmann::json& v, const std::string& what) {
               ASSERT_TRUE(v.is_object()) << what;
               ASSERT_TRUE(v.contains("id") && v["id"].is_number_integer()) << what;
               EXPECT_GE(v["id"].get<int64_t>(), 1) << what;
               EXPECT_LE(v["id"].get<int64_t>(), 1000) << what;
               ASSERT_TRUE(v.contains("ok") && v["ok"].is_boolean()) << what;
               if (v.contains("note")) {
                 ASSERT_TRUE(v["note"].is_string()) << what;
                 EXPECT_LE(CodePoints(v["note"].get<std::string>()), 6) << what;
               }
             });
}

TEST(StructuredAusten, WalksUnderAnIntegerRange) {
  WalkSchema(R"({"type":"integer","minimum":-50,"maximum":120})", 4,
             [](const nlohmann::json& v, const std::string& what) {
               ASSERT_TRUE(v.is_number_integer()) << what;
               EXPECT_GE(v.get<int64_t>(), -50) << what;
               EXPECT_LE(v.get<int64_t>(), 120) << what;
             });
}

TEST(StructuredAusten, WalksUnderAStringMaxLength) {
  WalkSchema(R"({"type":"string","maxLength":12})", 5,
             [](const nlohmann::json& v, const std::string& what) {
               ASSERT_TRUE(v.is_string()) << what;
               EXPECT_LE(CodePoints(v.get<std::string>()), 12) << what;
             });
}

TEST(StructuredAusten, WalksUnderAnyJsonObject) {
  // Unbounded: a walk may run past the cap; the ones that end are JSON objects.
  auto compiled = MustCompile(AustenVocabulary(), {Constraint::Kind::kJsonObject, "", {}});
  ASSERT_NE(compiled, nullptr);
  std::mt19937 rng(6);
  int ended = 0;
  for (int i = 0; i < 20; ++i) {
    const Walk walk = RandomWalk(compiled, rng, /*max_steps=*/256);
    ASSERT_TRUE(walk.failure.empty()) << walk.failure;
    EXPECT_EQ(walk.text.substr(0, 1), "{");
    if (!walk.ended) continue;
    ++ended;
    EXPECT_TRUE(nlohmann::json::parse(walk.text).is_object()) << walk.text;
  }
  EXPECT_GT(ended, 0);
}

TEST(StructuredAusten, RegexWalksMatchTheRegex) {
  const std::string pattern = R"([a-z]{1,8}@(example|test)\.(com|org))";
  auto compiled = MustCompile(AustenVocabulary(), {Constraint::Kind::kRegex, pattern, {}});
  ASSERT_NE(compiled, nullptr);
  const std::regex regex(pattern);
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    const Walk walk = RandomWalk(compiled, rng, /*max_steps=*/64);
    ASSERT_TRUE(walk.failure.empty()) << walk.failure;
    ASSERT_TRUE(walk.ended) << walk.text;
    EXPECT_TRUE(std::regex_match(walk.text, regex)) << walk.text;
  }
}

TEST(StructuredAusten, ChoiceWalksGiveOneOfTheChoices) {
  const std::vector<std::string> choices = {"yes",
                                            "no",
                                            "say \"hi\"",
                                            "a\\b",
                                            "x\ny",
                                            "caf\xc3\xa9",
                                            "\x01"
                                            "control",
                                            "yes!"};
  auto compiled = MustCompile(AustenVocabulary(), {Constraint::Kind::kChoice, "", choices});
  ASSERT_NE(compiled, nullptr);
  std::mt19937 rng(8);
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const Walk walk = RandomWalk(compiled, rng, /*max_steps=*/32);
    ASSERT_TRUE(walk.failure.empty()) << walk.failure;
    ASSERT_TRUE(walk.ended) << walk.text;
    EXPECT_NE(std::find(choices.begin(), choices.end(), walk.text), choices.end())
        << "\"" << absl::CHexEscape(walk.text) << "\" is not a choice";
    seen.insert(walk.text);
  }
  EXPECT_GE(seen.size(), 4u);  // not stuck on one choice
}

TEST(StructuredAusten, EndOfTextIsAllowedExactlyWhenTheOutputIsComplete) {
  auto compiled =
      MustCompile(AustenVocabulary(), {Constraint::Kind::kChoice, "", {"yes", "yes please"}});
  ASSERT_NE(compiled, nullptr);
  ConstraintMatcher matcher(compiled);
  EXPECT_FALSE(matcher.CanEnd());
  for (const int32_t token : AustenTokenizer().Encode("yes"))
    ASSERT_TRUE(matcher.Accept(token).ok());
  EXPECT_TRUE(matcher.CanEnd());
  std::vector<uint32_t> words(matcher.bitmask_words());
  matcher.FillAllowed(absl::MakeSpan(words));
  const int32_t eos = compiled->vocabulary->eos_token_id();
  EXPECT_TRUE((words[eos / 32] >> (eos % 32)) & 1u);
  ASSERT_TRUE(matcher.Accept(eos).ok());
  EXPECT_TRUE(matcher.Ended());
  EXPECT_FALSE(matcher.CanEnd());
  matcher.FillAllowed(absl::MakeSpan(words));
  EXPECT_TRUE(AllowedIds(words, compiled->vocabulary->model_vocab_size()).empty());
  absl::Status after = matcher.Accept(0);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.message(), HasSubstr("expected no token after end-of-text"));
}

// vLLM's structured_outputs.structural_tag: XGrammar's structural tag, compiled as such. One
// that spells a fixed string allows exactly that string's tokens, then end-of-text.
TEST(StructuredAusten, AStructuralTagCompilesToWhatItSpells) {
  auto compiled = MustCompile(
      AustenVocabulary(),
      {Constraint::Kind::kStructuralTag,
       R"({"type": "structural_tag", "format": {"type": "const_string", "value": "yes"}})",
       {}});
  ASSERT_NE(compiled, nullptr);
  ConstraintMatcher matcher(compiled);
  for (int32_t id : AustenTokenizer().Encode("yes")) ASSERT_TRUE(matcher.Accept(id).ok()) << id;
  EXPECT_TRUE(matcher.CanEnd());
  EXPECT_EQ(matcher.Accept(AustenTokenizer().Encode("no")[0]).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Validate({Constraint::Kind::kStructuralTag, "", {}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_STREQ(KindName(Constraint::Kind::kStructuralTag), "structural_tag");
}

TEST(StructuredAusten, AcceptRefusesADisallowedTokenNamingIt) {
  auto compiled = MustCompile(AustenVocabulary(), {Constraint::Kind::kChoice, "", {"yes"}});
  ASSERT_NE(compiled, nullptr);
  ConstraintMatcher matcher(compiled);
  const std::vector<int32_t> no = AustenTokenizer().Encode("no");
  absl::Status refused = matcher.Accept(no[0]);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("token ", no[0], " (\"n")));
  EXPECT_THAT(refused.message(), HasSubstr("is not allowed at position 0"));
  absl::Status out_of_range = matcher.Accept(5000);
  EXPECT_THAT(out_of_range.message(), HasSubstr("expected a token id in [0, 2048), received 5000"));
  // The matcher is unchanged: "yes" still goes through.
  for (const int32_t token : AustenTokenizer().Encode("yes"))
    ASSERT_TRUE(matcher.Accept(token).ok());
  EXPECT_TRUE(matcher.CanEnd());
}

TEST(StructuredAusten, InvalidConstraintsAreInvalidArgumentWithTheCompilersMessage) {
  auto vocabulary = AustenVocabulary();
  auto schema = CompileConstraint(vocabulary, Schema(R"({"type":"string","minLength":5,)"
                                                     R"("maxLength":2})"));
  ASSERT_FALSE(schema.ok());
  EXPECT_EQ(schema.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(schema.status().message(), HasSubstr("constraint json_schema for model tost-austen"));
  EXPECT_THAT(schema.status().message(), HasSubstr("minLength 5 is greater than maxLength 2"));
  // Not the compiler's log prefix: no time, no source path of this server's file system.
  EXPECT_THAT(schema.status().message(), Not(HasSubstr(".cc:")));
  EXPECT_THAT(schema.status().message(), Not(HasSubstr("xgrammar")));

  auto not_json = CompileConstraint(vocabulary, Schema(R"({"type":"object",)"));
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);

  auto regex = CompileConstraint(vocabulary, {Constraint::Kind::kRegex, "[a-", {}});
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(regex.status().message(), HasSubstr("constraint regex"));

  auto grammar = CompileConstraint(vocabulary, {Constraint::Kind::kGrammar, "root ::= ", {}});
  EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(grammar.status().message(), HasSubstr("constraint grammar"));

  auto grammar_ok =
      CompileConstraint(vocabulary, {Constraint::Kind::kGrammar, R"(root ::= "a" [0-9]*)", {}});
  EXPECT_TRUE(grammar_ok.ok()) << grammar_ok.status();
}

TEST(StructuredAusten, ReplayGivesTheSameMaskAsStepping) {
  auto compiled = MustCompile(
      AustenVocabulary(), Schema(R"({"type":"object","properties":{"a":{"type":"array",)"
                                 R"("items":{"type":"integer"},"maxItems":3},"b":{"type":"string",)"
                                 R"("maxLength":5}},"required":["a","b"]})"));
  ASSERT_NE(compiled, nullptr);
  std::mt19937 rng(9);
  const Walk walk = RandomWalk(compiled, rng, /*max_steps=*/256);
  ASSERT_TRUE(walk.failure.empty()) << walk.failure;
  ASSERT_GT(walk.tokens.size(), 4u);
  ConstraintMatcher stepped(compiled);
  std::vector<uint32_t> stepped_words(stepped.bitmask_words());
  std::vector<uint32_t> replayed_words(stepped.bitmask_words());
  for (size_t prefix = 0; prefix <= walk.tokens.size(); ++prefix) {
    if (prefix > 0) {
      ASSERT_TRUE(stepped.Accept(walk.tokens[prefix - 1]).ok());
    }
    ConstraintMatcher replayed(compiled);
    ASSERT_TRUE(replayed.Replay(absl::MakeConstSpan(walk.tokens).subspan(0, prefix)).ok());
    stepped.FillAllowed(absl::MakeSpan(stepped_words));
    replayed.FillAllowed(absl::MakeSpan(replayed_words));
    EXPECT_EQ(stepped_words, replayed_words) << "after " << prefix << " tokens";
    EXPECT_EQ(stepped.CanEnd(), replayed.CanEnd()) << "after " << prefix << " tokens";
    EXPECT_EQ(stepped.Ended(), replayed.Ended()) << "after " << prefix << " tokens";
    EXPECT_EQ(replayed.tokens_accepted(), static_cast<int64_t>(prefix));
  }
  // A replay the constraint refuses names the position and leaves the matcher at the start.
  ConstraintMatcher bad(compiled);
  std::vector<int32_t> tokens = {walk.tokens[0], AustenTokenizer().Encode("}")[0]};
  absl::Status replayed = bad.Replay(tokens);
  EXPECT_EQ(replayed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(replayed.message(), HasSubstr("replaying 2 tokens"));
  EXPECT_THAT(replayed.message(), HasSubstr("at position 1"));
  EXPECT_EQ(bad.tokens_accepted(), 0);
}

TEST(StructuredAusten, ATokenizerWithoutTextIsRefused) {
  const model::NoTextTokenizer tokenizer(/*vocab_size=*/512, /*eos_token_id=*/-1);
  auto vocabulary = GrammarVocabulary::Create(tokenizer, 512, "ids-only");
  ASSERT_FALSE(vocabulary.ok());
  EXPECT_EQ(vocabulary.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(vocabulary.status().message(), HasSubstr("model ids-only"));
  EXPECT_THAT(vocabulary.status().message(), HasSubstr("\"none\""));

  auto smaller = GrammarVocabulary::Create(AustenTokenizer(), 1000, kModelName);
  EXPECT_EQ(smaller.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(smaller.status().message(), HasSubstr("at least the tokenizer's 2048 ids"));
}

TEST(StructuredAusten, PaddedIdsAreNeverAllowed) {
  constexpr int64_t kPadded = 2048 + 77;  // not a multiple of 32: the last word is partial
  auto vocabulary = AustenVocabulary(kPadded);
  ASSERT_EQ(vocabulary->bitmask_words(), (kPadded + 31) / 32);
  for (const Constraint& constraint :
       {Constraint{Constraint::Kind::kJsonObject, "", {}},
        Constraint{Constraint::Kind::kGrammar, R"(root ::= [^\x00]*)", {}}}) {
    auto compiled = MustCompile(vocabulary, constraint);
    ASSERT_NE(compiled, nullptr);
    ConstraintMatcher matcher(compiled);
    std::mt19937 rng(10);
    // Two words past the mask, which FillAllowed must leave as they are.
    std::vector<uint32_t> words(matcher.bitmask_words() + 2, 0xFFFFFFFFu);
    for (int step = 0; step < 30 && !matcher.Ended(); ++step) {
      matcher.FillAllowed(absl::MakeSpan(words));
      EXPECT_EQ(words[words.size() - 1], 0xFFFFFFFFu);
      EXPECT_EQ(words[words.size() - 2], 0xFFFFFFFFu);
      words.resize(matcher.bitmask_words());
      const std::vector<int32_t> allowed = AllowedIds(words, kPadded);
      ASSERT_FALSE(allowed.empty());
      EXPECT_LT(allowed.back(), 2048) << "a padded id is allowed at step " << step;
      ASSERT_TRUE(matcher.Accept(allowed[rng() % allowed.size()]).ok());
      words.assign(matcher.bitmask_words() + 2, 0xFFFFFFFFu);
    }
    // Accepting a padded id is refused, though it is within the model's vocabulary.
    ConstraintMatcher fresh(compiled);
    EXPECT_EQ(fresh.Accept(2050).code(), absl::StatusCode::kInvalidArgument);
  }
}

// --- the cache ------------------------------------------------------------------------------

Constraint Numbered(int i) {
  return Schema(absl::StrCat(R"({"type":"integer","minimum":0,"maximum":)", i, "}"));
}

TEST(StructuredCache, HitsMissesEvictsAndCounts) {
  GrammarCacheOptions options;
  options.max_entries = 2;
  GrammarCache cache(AustenVocabulary(), options);
  auto a = cache.Get(Numbered(1));
  ASSERT_TRUE(a.ok()) << a.status();
  auto a_again = cache.Get(Numbered(1));
  ASSERT_TRUE(a_again.ok());
  EXPECT_EQ(a->get(), a_again->get());  // the same compiled constraint, not a recompile
  ASSERT_TRUE(cache.Get(Numbered(2)).ok());
  ASSERT_TRUE(cache.Get(Numbered(1)).ok());  // a hit: 1 is now the most recently used
  ASSERT_TRUE(cache.Get(Numbered(3)).ok());  // evicts 2
  GrammarCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 3);
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.entries, 2);
  EXPECT_GT(stats.compile_micros_total, 0);

  ASSERT_TRUE(cache.Get(Numbered(1)).ok());  // still there
  EXPECT_EQ(cache.stats().hits, 3);
  ASSERT_TRUE(cache.Get(Numbered(2)).ok());  // evicted: compiled again
  EXPECT_EQ(cache.stats().misses, 4);

  auto bad = cache.Get(Schema(R"({"type":"string","minLength":5,"maxLength":2})"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto invalid = cache.Get({Constraint::Kind::kChoice, "", {}});  // refused before compiling
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  stats = cache.stats();
  EXPECT_EQ(stats.compile_errors, 1);
  EXPECT_EQ(stats.misses, 5);
  EXPECT_EQ(stats.timeouts, 0);
}

// The cache holds at most max_bytes of compiled constraints (least recently used out), and a
// constraint whose compiled form takes more than an eighth of that is refused, not kept.
TEST(StructuredCache, BytesAreBoundedAndAnOversizedCompileIsRefused) {
  auto vocabulary = AustenVocabulary();
  // One grammar under sixteen keys of one length: the title is in the text, not in the grammar.
  const auto titled = [](int i) {
    return Schema(absl::StrCat(R"({"type":"integer","title":"t)", 10 + i, R"("})"));
  };
  auto one = CompileConstraint(vocabulary, titled(0));
  ASSERT_TRUE(one.ok()) << one.status();
  // An entry holds its compiled form and its key.
  const int64_t each = (*one)->bytes + static_cast<int64_t>(ContentKey(titled(0)).size());
  ASSERT_GT(each, 0);
  GrammarCacheOptions options;
  options.max_bytes = 12 * each;  // an entry fits in an eighth; one and a half do not
  GrammarCache cache(vocabulary, options);
  for (int i = 1; i <= 16; ++i) {  // twelve fit
    const auto compiled = cache.Get(titled(i));
    ASSERT_TRUE(compiled.ok()) << i << ": " << compiled.status();
  }
  GrammarCacheStats stats = cache.stats();
  EXPECT_LE(stats.bytes, options.max_bytes);
  EXPECT_EQ(stats.bytes, stats.entries * each) << "entries of one schema shape weigh the same";
  EXPECT_EQ(stats.entries, 12);
  EXPECT_EQ(stats.evictions, 4);

  const absl::StatusOr<std::shared_ptr<const CompiledConstraint>> big =
      cache.Get({Constraint::Kind::kRegex, "[a-z]{1,5000}", {}});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()),
              testing::AllOf(testing::HasSubstr("compiled, it takes"),
                             testing::HasSubstr(absl::StrCat("at most ", options.max_bytes / 8))));
  EXPECT_EQ(cache.stats().compile_errors, 1);
  EXPECT_EQ(cache.stats().entries, stats.entries);
}

// A compile function that blocks until told to go on, so a wait times out deterministically (no
// timing assumption about how long a real compile takes); then the real compile.
class GatedCompile {
 public:
  explicit GatedCompile(std::shared_ptr<GrammarVocabulary> vocabulary)
      : vocabulary_(std::move(vocabulary)) {}

  GrammarCache::CompileFunction Function() {
    return [this](const Constraint& constraint) {
      Gate(constraint.text).WaitForNotification();
      compiles_.fetch_add(1);
      return CompileConstraint(vocabulary_, constraint);
    };
  }
  void Release(const Constraint& constraint) { Gate(constraint.text).Notify(); }
  int compiles() const { return compiles_.load(); }

 private:
  absl::Notification& Gate(const std::string& text) {
    absl::MutexLock lock(&mu_);
    return gates_[text];
  }

  std::shared_ptr<GrammarVocabulary> vocabulary_;
  absl::Mutex mu_;
  std::map<std::string, absl::Notification> gates_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> compiles_{0};
};

TEST(StructuredCache, ACompilePastTheDeadlineIsRefusedAndFinishesInTheBackground) {
  auto vocabulary = AustenVocabulary();
  GatedCompile gated(vocabulary);
  GrammarCacheOptions options;
  options.max_compile_ms = 1;
  GrammarCache cache(vocabulary, options, gated.Function());
  auto timed_out = cache.Get(Numbered(7));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(timed_out.status().message(),
              HasSubstr("compiling the json_schema constraint for model tost-austen took longer "
                        "than 1 ms"));
  EXPECT_EQ(cache.stats().timeouts, 1);
  gated.Release(Numbered(7));
  cache.WaitForCompiles();
  auto hit = cache.Get(Numbered(7));  // the background compile filled the cache
  EXPECT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(gated.compiles(), 1);
}

// Without a worker a compile cannot be stopped: it holds its slot until it ends, and the slots
// bound how many run at once, per caller and in all.
TEST(StructuredCache, CompilesHoldSlotsPerCallerUntilTheyEnd) {
  auto vocabulary = AustenVocabulary();
  GatedCompile gated(vocabulary);
  GrammarCacheOptions options;
  options.max_compile_ms = 1;
  options.max_compiles = 2;
  options.max_compiles_per_caller = 1;
  GrammarCache cache(vocabulary, options, gated.Function());
  EXPECT_EQ(cache.Get(Numbered(1), "alice").status().code(), absl::StatusCode::kResourceExhausted);
  // Alice's compile is blocked: a second constraint of hers would take a second slot of hers.
  auto refused = cache.Get(Numbered(2), "alice");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("one of this caller's 1 compiles running"));
  // The same constraint joins the compile in flight instead, whoever asks (and times out again).
  EXPECT_THAT(cache.Get(Numbered(1), "bob").status().message(), HasSubstr("took longer than 1 ms"));
  // Bob has a slot of his own; then every slot is taken.
  EXPECT_THAT(cache.Get(Numbered(2), "bob").status().message(), HasSubstr("took longer than 1 ms"));
  EXPECT_THAT(cache.Get(Numbered(3), "carol").status().message(),
              HasSubstr("one of the 2 compiles running (--constraint_compile_slots)"));
  EXPECT_EQ(cache.stats().compiles_running, 2);
  gated.Release(Numbered(1));
  gated.Release(Numbered(2));
  cache.WaitForCompiles();
  EXPECT_EQ(gated.compiles(), 2);
  EXPECT_TRUE(cache.Get(Numbered(1), "carol").ok());
  EXPECT_TRUE(cache.Get(Numbered(2), "alice").ok());
  const GrammarCacheStats stats = cache.stats();
  EXPECT_EQ(stats.timeouts, 3);
  EXPECT_EQ(stats.slot_refusals, 2);
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.entries, 2);
  EXPECT_EQ(stats.compiles_running, 0);
}

TEST(StructuredCache, ConcurrentGetsOfOneConstraintCompileItOnce) {
  auto vocabulary = AustenVocabulary();
  GatedCompile gated(vocabulary);
  GrammarCache cache(vocabulary, GrammarCacheOptions{}, gated.Function());
  std::vector<std::thread> threads;
  std::vector<const CompiledConstraint*> got(4, nullptr);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto compiled = cache.Get(Numbered(42));
      if (compiled.ok()) got[i] = compiled->get();
    });
  }
  // Every Get is waiting on the one compile once all four have missed.
  while (cache.stats().misses < 4) std::this_thread::yield();
  gated.Release(Numbered(42));
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(gated.compiles(), 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(got[i], nullptr);
    EXPECT_EQ(got[i], got[0]);
  }
}

}  // namespace
}  // namespace tost::structured
