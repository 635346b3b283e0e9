// How deeply a client's text nests: JSON's arrays and objects, a regular expression's or an EBNF
// grammar's groups. Every later reader of such text (nlohmann's dump, XGrammar's schema and regex
// converters, its EBNF parser) recurses once per level, so a text nested 100,000 deep overflows
// the stack of whatever thread reads it. These scans are linear and iterative, and run before any
// of them: past the limit, the text is refused with the level and the byte offset.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace tost {

struct NestingExcess {
  size_t depth = 0;   // the first depth past the limit (limit + 1)
  size_t offset = 0;  // byte offset of the bracket that reached it
};

// JSON: '[' and '{' outside strings (escapes honoured). Malformed JSON is scanned all the same: a
// parser reports it better.
std::optional<NestingExcess> JsonNestingPast(std::string_view text, size_t max_depth);

// A regular expression (ECMAScript / PCRE syntax as XGrammar reads it): '(' outside character
// classes, escapes honoured.
std::optional<NestingExcess> RegexNestingPast(std::string_view text, size_t max_depth);

// XGrammar's EBNF: '(' outside string literals, character classes and comments ('#' to end of
// line), escapes honoured.
std::optional<NestingExcess> GrammarNestingPast(std::string_view text, size_t max_depth);

}  // namespace tost
