// service/structured without a tokenizer: constraint checks and keys; and the mask a constrained
// row's draw applies (model/sampling: MaskDisallowed).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "model/sampling/sampler.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"

namespace tost::structured {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

Constraint Choice(std::vector<std::string> choices) {
  return Constraint{Constraint::Kind::kChoice, "", std::move(choices)};
}

TEST(StructuredConstraint, ValidateAcceptsEachKind) {
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonSchema, R"({"type":"object"})", {}}).ok());
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonObject, "", {}}).ok());
  EXPECT_TRUE(Validate({Constraint::Kind::kRegex, "[a-z]+", {}}).ok());
  EXPECT_TRUE(Validate({Constraint::Kind::kGrammar, R"(root ::= "a")", {}}).ok());
  EXPECT_TRUE(Validate(Choice({"yes", "no", "caf\xc3\xa9"})).ok());
}

TEST(StructuredConstraint, ValidateNamesTheFieldExpectedAndReceived) {
  absl::Status empty_text = Validate({Constraint::Kind::kRegex, "", {}});
  EXPECT_EQ(empty_text.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty_text.message(), HasSubstr("constraint text: expected a non-empty regex"));

  absl::Status big =
      Validate({Constraint::Kind::kJsonSchema, std::string(kMaxConstraintTextBytes + 1, ' '), {}});
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("at most 65536 bytes, received 65537"));

  absl::Status none = Validate(Choice({}));
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(),
              HasSubstr("constraint choices: expected 1 to 1024 choices, received 0"));

  absl::Status too_many =
      Validate(Choice(std::vector<std::string>(kMaxConstraintChoices + 1, "x")));
  EXPECT_THAT(too_many.message(), HasSubstr("received 1025"));

  absl::Status empty_choice = Validate(Choice({"a", ""}));
  EXPECT_EQ(empty_choice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty_choice.message(), HasSubstr("choices[1]: expected a non-empty string"));

  absl::Status not_utf8 = Validate(Choice({"\xff"}));
  EXPECT_THAT(not_utf8.message(), HasSubstr("choices[0]: expected UTF-8 text"));
}

TEST(StructuredConstraint, ValidateRefusesTextNestedPastTheCompilersBound) {
  // 60,000 levels fit in the text bound for a regex or a grammar; the compiler would recurse
  // 60,000 deep.
  const std::string deep_regex = std::string(30000, '(') + "a" + std::string(30000, ')');
  absl::Status s = Validate({Constraint::Kind::kRegex, deep_regex, {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nested at most 256 levels deep"));
  std::string schema;
  for (int i = 0; i < 257; ++i) schema += R"({"items":)";
  schema += "{}" + std::string(257, '}');
  s = Validate({Constraint::Kind::kJsonSchema, schema, {}});
  EXPECT_THAT(s.message(), HasSubstr("level 257"));
  const std::string grammar = "root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')');
  EXPECT_EQ(Validate({Constraint::Kind::kGrammar, grammar, {}}).code(),
            absl::StatusCode::kInvalidArgument);
  // At the bound: accepted (the compiler judges the rest).
  std::string ok_schema;
  for (int i = 0; i < 255; ++i) ok_schema += R"({"items":)";
  ok_schema += "{}" + std::string(255, '}');
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonSchema, ok_schema, {}}).ok());
}

std::string ObjectOf(int properties, const std::string& property_schema) {
  std::string schema = R"({"type":"object","properties":{)";
  for (int i = 0; i < properties; ++i) {
    absl::StrAppend(&schema, i == 0 ? "" : ",", "\"p", i, "\":", property_schema);
  }
  return schema + "}}";
}

TEST(StructuredConstraint, ValidateRefusesSchemasPastTheirCountBounds) {
  // Optional properties: every object's together, nested ones and $defs included; required ones
  // do not count.
  EXPECT_TRUE(
      Validate({Constraint::Kind::kJsonSchema, ObjectOf(1024, R"({"type":"integer"})"), {}}).ok());
  absl::Status s =
      Validate({Constraint::Kind::kJsonSchema, ObjectOf(1025, R"({"type":"integer"})"), {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("expected a json_schema of at most 1024 optional properties (in its "
                        "objects' \"properties\" but not their \"required\", together), received "
                        "1025"));
  const std::string nested =
      absl::StrCat(R"({"$defs":{"d":)", ObjectOf(600, "{}"),
                   R"(},"type":"object","properties":{"a":)", ObjectOf(500, "{}"), "}}");
  EXPECT_THAT(Validate({Constraint::Kind::kJsonSchema, nested, {}}).message(),
              HasSubstr("received 1101"));
  std::string required_all = ObjectOf(2000, "{}");
  required_all.pop_back();
  required_all += R"(,"required":[)";
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&required_all, i == 0 ? "" : ",", "\"p", i, "\"");
  required_all += "]}";
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonSchema, required_all, {}}).ok());

  // Enum values and consts, all enums together; an enum's own values are data, not schemas.
  std::string values;
  for (int i = 0; i < 8193; ++i) absl::StrAppend(&values, i == 0 ? "" : ",", i);
  s = Validate({Constraint::Kind::kJsonSchema, absl::StrCat(R"({"enum":[)", values, "]}"), {}});
  EXPECT_THAT(s.message(), HasSubstr("at most 8192 enum and const values (its enums' together), "
                                     "received 8193"));
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonSchema,
                        R"({"enum":[{"properties":{"a":1},"pattern":"a{5000}"}]})",
                        {}})
                  .ok());
  EXPECT_TRUE(
      Validate({Constraint::Kind::kJsonSchema, R"({"const":"x","default":{"enum":[1,2]}})", {}})
          .ok());

  // Patterns: what a pattern spells out, its repetitions multiplied, nested ones by each other.
  const auto pattern = [](const std::string& re) {
    return Validate({Constraint::Kind::kJsonSchema,
                     absl::StrCat(R"({"type":"object","properties":{"code":{"type":"string",)",
                                  R"("pattern":")", re, R"("}}})"),
                     {}});
  };
  EXPECT_TRUE(pattern("^[a-z]{1000}$").ok());
  EXPECT_TRUE(pattern(R"(^\\d{4}-\\d{2}-\\d{2}$)").ok());
  EXPECT_TRUE(pattern("^(ab|cd){250}x+$").ok());  // 4 per repetition, and 3: 1003
  s = pattern("^[a-z]{30000}$");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("expected each pattern of a json_schema to spell out at most 1024 "
                        "characters (a repetition {n,m} counting what it repeats m times), "
                        "received one that spells out more at /properties/code/pattern"));
  EXPECT_FALSE(pattern("^([a-z]{100}){100}$").ok());           // 10,000 nested
  EXPECT_FALSE(pattern("^[a-z]{1,2000}$").ok());               // the upper bound counts
  EXPECT_FALSE(pattern("^[0-9]{600}[a-z]{600}$").ok());        // the repetitions add up
  EXPECT_FALSE(pattern("^(a{99999999999}){99999999}$").ok());  // saturates, does not overflow
  EXPECT_TRUE(pattern("^a{,5}[{]{}{x}$").ok());                // braces that repeat nothing
  EXPECT_THAT(Validate({Constraint::Kind::kJsonSchema,
                        R"({"patternProperties":{"^x{2000}$":{"type":"integer"}}})",
                        {}})
                  .message(),
              HasSubstr("at /patternProperties/^x{2000}$"));
  // A long name is quoted by its end only, its control bytes escaped.
  const std::string long_name = std::string(5000, 'n') + "\\u0001end";
  EXPECT_THAT(
      Validate({Constraint::Kind::kJsonSchema,
                absl::StrCat(R"({"properties":{")", long_name, R"(":{"pattern":"a{9999}"}}})"),
                {}})
          .message(),
      AllOf(HasSubstr("at ...nnnn"), HasSubstr("n\\x01end/pattern"), Not(HasSubstr(long_name))));
  // A regex or grammar constraint keeps its repetitions as rules: no bound but the text's.
  EXPECT_TRUE(Validate({Constraint::Kind::kRegex, "[a-z]{1000000}", {}}).ok());
  EXPECT_TRUE(Validate({Constraint::Kind::kGrammar, R"(root ::= [a-z]{100000})", {}}).ok());
  // Not JSON: the compiler's to say.
  EXPECT_TRUE(Validate({Constraint::Kind::kJsonSchema, "{not json", {}}).ok());
}

TEST(StructuredConstraint, ContentKeysDifferExactlyWhenTheContentDoes) {
  const std::vector<Constraint> distinct = {
      Choice({"a", "b"}),
      Choice({"a|b"}),
      Choice({"ab"}),
      Choice({"1:a"}),
      Choice({"b", "a"}),
      {Constraint::Kind::kRegex, "a", {}},
      {Constraint::Kind::kGrammar, "a", {}},
      {Constraint::Kind::kJsonSchema, "a", {}},
      {Constraint::Kind::kJsonObject, "", {}},
  };
  for (size_t i = 0; i < distinct.size(); ++i) {
    for (size_t j = i + 1; j < distinct.size(); ++j) {
      EXPECT_NE(ContentKey(distinct[i]), ContentKey(distinct[j])) << i << " vs " << j;
    }
  }
  EXPECT_EQ(ContentKey(Choice({"a", "b"})), ContentKey(Choice({"a", "b"})));
  // Fields a kind does not use do not split the cache.
  EXPECT_EQ(ContentKey({Constraint::Kind::kJsonObject, "ignored", {"x"}}),
            ContentKey({Constraint::Kind::kJsonObject, "", {}}));
}

TEST(StructuredConstraint, ChoiceGrammarEscapesLiterals) {
  EXPECT_EQ(ChoiceGrammar(Choice({"yes", "no"})), R"(root ::= "yes" | "no")");
  EXPECT_EQ(ChoiceGrammar(Choice({"say \"hi\"", "a\\b",
                                  "x\ny\x01"
                                  "1"})),
            R"(root ::= "say \"hi\"" | "a\\b" | "x\u000Ay\u00011")");
}

TEST(StructuredMask, SetsExactlyTheDisallowedIdsToMinusInfinity) {
  constexpr int kLogits = 100;  // three full words and four ids of a fourth
  const std::vector<uint32_t> words = {0xFFFFFFFFu, 0x00000000u, 0x80000001u, 0x0000000Au};
  std::vector<float> logits(kLogits);
  for (int i = 0; i < kLogits; ++i) logits[i] = static_cast<float>(i) * 0.5f;
  model::MaskDisallowed(words, absl::MakeSpan(logits));
  for (int i = 0; i < kLogits; ++i) {
    const bool allowed = (words[i / 32] >> (i % 32)) & 1u;
    if (allowed) {
      EXPECT_EQ(logits[i], static_cast<float>(i) * 0.5f) << "id " << i;
    } else {
      EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0) << "id " << i << ": " << logits[i];
    }
  }
}

TEST(StructuredMask, IdsPastTheMaskAreDisallowed) {
  const std::vector<uint32_t> words = {0xFFFFFFFFu};
  std::vector<float> logits(40, 1.0f);
  model::MaskDisallowed(words, absl::MakeSpan(logits));
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(logits[i], i < 32 ? 1.0f : -std::numeric_limits<float>::infinity()) << "id " << i;
  }
}

}  // namespace
}  // namespace tost::structured
