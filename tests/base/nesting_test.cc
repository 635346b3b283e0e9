// The nesting scans that guard every recursive reader of a client's JSON, regex or grammar.
#include "base/nesting.h"

#include <string>

#include <gtest/gtest.h>

namespace tost {
namespace {

std::string Nested(const std::string& open, const std::string& inner, const std::string& close,
                   size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += open;
  s += inner;
  for (size_t i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(JsonNesting, CountsArraysAndObjectsUpToTheLimit) {
  EXPECT_FALSE(JsonNestingPast(Nested("[", "", "]", 64), 64).has_value());
  const auto past = JsonNestingPast(Nested("{\"a\":", "1", "}", 65), 64);
  ASSERT_TRUE(past.has_value());
  EXPECT_EQ(past->depth, 65u);
  EXPECT_EQ(past->offset, 64u * 5);
  // Siblings do not add up: depth is the deepest path, not the count of brackets.
  EXPECT_FALSE(JsonNestingPast(R"([[1],[2],[3],{"a":[4]}])", 3).has_value());
}

TEST(JsonNesting, BracketsInsideStringsAndEscapedQuotesDoNotCount) {
  EXPECT_FALSE(JsonNestingPast(R"({"a": "[[[[{{{{", "b": "\"[[[["})", 1).has_value());
  EXPECT_TRUE(JsonNestingPast(R"({"a": "\"", "b": [[1]]})", 2).has_value());
}

TEST(JsonNesting, AHundredThousandLevelsAreScannedWithoutRecursion) {
  const auto past = JsonNestingPast(Nested("[", "", "]", 100000), 128);
  ASSERT_TRUE(past.has_value());
  EXPECT_EQ(past->depth, 129u);
}

TEST(RegexNesting, CountsGroupsOutsideClassesAndEscapes) {
  EXPECT_FALSE(RegexNestingPast("((a|b)+)", 2).has_value());
  EXPECT_TRUE(RegexNestingPast("(((a)))", 2).has_value());
  EXPECT_FALSE(RegexNestingPast(R"([(((]\(\(\((a))", 2).has_value());
  EXPECT_TRUE(RegexNestingPast(Nested("(", "a+", ")+", 60000), 64).has_value());
}

TEST(GrammarNesting, CountsGroupsOutsideStringsClassesAndComments) {
  EXPECT_FALSE(GrammarNestingPast("root ::= (\"((((\" | [(((]) # ((((\n", 1).has_value());
  EXPECT_FALSE(GrammarNestingPast("root ::= ('(((' | \"a\")", 1).has_value());
  EXPECT_TRUE(GrammarNestingPast("root ::= ((\"a\"))", 1).has_value());
  EXPECT_TRUE(GrammarNestingPast("root ::= " + Nested("(", "\"a\"", ")", 60000), 64).has_value());
}

}  // namespace
}  // namespace tost
