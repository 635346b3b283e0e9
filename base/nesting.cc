#include "base/nesting.h"

namespace tost {
namespace {

// One scan for the three syntaxes: openers and closers, and the quoted regions (strings,
// character classes, comments) in which they do not count.
struct Syntax {
  char open_a, open_b, close_a, close_b;  // open_b / close_b: 0 when unused
  bool strings;                           // "..." (and EBNF's '...')
  bool char_classes;                      // [...]
  bool comments;                          // '#' to the end of the line
};

std::optional<NestingExcess> Scan(std::string_view text, size_t max_depth, const Syntax& s) {
  size_t depth = 0;
  char quote = 0;           // inside a string opened by this character
  bool in_class = false;    // inside [...]
  bool in_comment = false;  // inside # ... \n
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_comment) {
      in_comment = c != '\n';
      continue;
    }
    if (c == '\\') {  // an escape: the next byte is literal, wherever it is
      ++i;
      continue;
    }
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (in_class) {
      in_class = c != ']';
      continue;
    }
    if (s.strings && (c == '"' || (s.comments && c == '\''))) {
      quote = c;
    } else if (s.char_classes && c == '[') {
      in_class = true;
    } else if (s.comments && c == '#') {
      in_comment = true;
    } else if (c == s.open_a || (s.open_b != 0 && c == s.open_b)) {
      if (++depth > max_depth) return NestingExcess{depth, i};
    } else if ((c == s.close_a || (s.close_b != 0 && c == s.close_b)) && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<NestingExcess> JsonNestingPast(std::string_view text, size_t max_depth) {
  return Scan(text, max_depth, Syntax{'[', '{', ']', '}', true, false, false});
}

std::optional<NestingExcess> RegexNestingPast(std::string_view text, size_t max_depth) {
  return Scan(text, max_depth, Syntax{'(', 0, ')', 0, false, true, false});
}

std::optional<NestingExcess> GrammarNestingPast(std::string_view text, size_t max_depth) {
  return Scan(text, max_depth, Syntax{'(', 0, ')', 0, true, true, true});
}

}  // namespace tost
