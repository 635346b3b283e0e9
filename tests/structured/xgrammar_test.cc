// XGrammar's C++ core as this project builds it (cmake/TostXGrammar.cmake, from the pinned sdist
// with the patches under third_party/xgrammar/patches), driven through its public API: a
// byte-level vocabulary, schemas and regexes compiled to token masks, random walks through the
// masks checked against a strict JSON reader.
#include <xgrammar/xgrammar.h>

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace {

using xgrammar::CompiledGrammar;
using xgrammar::GrammarCompiler;
using xgrammar::GrammarMatcher;
using xgrammar::TokenizerInfo;

// Token i < 256 is the single byte i; the last token ends the text.
constexpr int32_t kEndOfText = 256;
constexpr int kVocabSize = 257;

TokenizerInfo ByteLevelTokenizer() {
  std::vector<std::string> vocab;
  for (int byte = 0; byte < 256; ++byte) vocab.emplace_back(1, static_cast<char>(byte));
  vocab.emplace_back("<|endoftext|>");
  return TokenizerInfo(vocab, xgrammar::VocabType::RAW, kVocabSize,
                       std::vector<int32_t>{kEndOfText});
}

// The token mask of one step, as a one-dimensional int32 DLTensor over its own buffer.
class TokenMask {
 public:
  TokenMask() : words_(xgrammar::GetBitmaskSize(kVocabSize)), shape_{int64_t(words_.size())} {
    tensor_.data = words_.data();
    tensor_.device = DLDevice{kDLCPU, 0};
    tensor_.ndim = 1;
    tensor_.dtype = xgrammar::GetBitmaskDLType();
    tensor_.shape = &shape_;
    tensor_.strides = nullptr;
    tensor_.byte_offset = 0;
  }
  TokenMask(const TokenMask&) = delete;
  TokenMask& operator=(const TokenMask&) = delete;

  std::vector<int32_t> Fill(GrammarMatcher& matcher) {
    matcher.FillNextTokenBitmask(&tensor_);
    std::vector<int32_t> allowed;
    for (int32_t token = 0; token < kVocabSize; ++token) {
      if ((static_cast<uint32_t>(words_[token / 32]) >> (token % 32)) & 1u)
        allowed.push_back(token);
    }
    return allowed;
  }

 private:
  std::vector<int32_t> words_;
  int64_t shape_;
  DLTensor tensor_;
};

// What a strict reading of one document found: `error` is empty when the document is JSON text
// (RFC 8259, UTF-8), else it says what was expected where and what was there instead.
struct JsonCheck {
  std::string error;
  // The string-valued members of the top-level object: name (as spelled) -> length in code
  // points, escapes decoded, a surrogate pair being one (what JSON Schema's minLength counts).
  std::map<std::string, int> string_lengths;
  int escapes = 0;  // escape sequences read in strings
};

class StrictJsonReader {
 public:
  explicit StrictJsonReader(std::string_view text) : text_(text) {}

  JsonCheck Read() && {
    SkipWhitespace();
    if (Value(/*depth=*/0)) {
      SkipWhitespace();
      if (pos_ != text_.size()) Fail("the end of the text after the value");
    }
    return std::move(result_);
  }

 private:
  static constexpr int kMaxDepth = 64;

  bool Fail(std::string_view expected) {
    if (result_.error.empty()) {
      result_.error = absl::StrCat(
          "at byte ", pos_, ": expected ", absl::string_view(expected.data(), expected.size()),
          ", found ",
          pos_ < text_.size() ? absl::StrCat("byte 0x", absl::Hex(Byte(pos_), absl::kZeroPad2))
                              : std::string("the end of the text"));
    }
    return false;
  }
  uint8_t Byte(size_t at) const { return static_cast<uint8_t>(text_[at]); }
  bool At(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool AtDigit() const { return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; }
  bool Expect(char c, std::string_view what) {
    if (!At(c)) return Fail(what);
    ++pos_;
    return true;
  }
  void SkipWhitespace() {
    while (At(' ') || At('\t') || At('\n') || At('\r')) ++pos_;
  }

  bool Value(int depth) {
    if (depth > kMaxDepth) return Fail("a value nested less deeply");
    if (At('{')) return Object(depth);
    if (At('[')) return Array(depth);
    if (At('"')) return String(nullptr, nullptr);
    if (At('-') || AtDigit()) return Number();
    for (std::string_view literal : {"true", "false", "null"}) {
      if (text_.substr(pos_, literal.size()) == literal) {
        pos_ += literal.size();
        return true;
      }
    }
    return Fail("a value");
  }

  bool Object(int depth) {
    ++pos_;
    SkipWhitespace();
    if (At('}')) return ++pos_, true;
    while (true) {
      std::string name;
      if (!At('"')) return Fail("'\"' opening a member name");
      if (!String(&name, nullptr)) return false;
      SkipWhitespace();
      if (!Expect(':', "':' after a member name")) return false;
      SkipWhitespace();
      if (depth == 0 && At('"')) {
        int length = 0;
        if (!String(nullptr, &length)) return false;
        result_.string_lengths[name] = length;
      } else if (!Value(depth + 1)) {
        return false;
      }
      SkipWhitespace();
      if (At('}')) return ++pos_, true;
      if (!Expect(',', "',' or '}' after a member")) return false;
      SkipWhitespace();
    }
  }

  bool Array(int depth) {
    ++pos_;
    SkipWhitespace();
    if (At(']')) return ++pos_, true;
    while (true) {
      if (!Value(depth + 1)) return false;
      SkipWhitespace();
      if (At(']')) return ++pos_, true;
      if (!Expect(',', "',' or ']' after an element")) return false;
      SkipWhitespace();
    }
  }

  bool Digits() {
    if (!AtDigit()) return Fail("a digit");
    while (AtDigit()) ++pos_;
    return true;
  }

  bool Number() {
    if (At('-')) ++pos_;
    if (At('0')) {
      ++pos_;
    } else if (!Digits()) {
      return false;
    }
    if (At('.')) {
      ++pos_;
      if (!Digits()) return false;
    }
    if (At('e') || At('E')) {
      ++pos_;
      if (At('+') || At('-')) ++pos_;
      if (!Digits()) return false;
    }
    return true;
  }

  // Four hex digits after "\u"; -1 (having failed) when they are not.
  int Hex4() {
    int value = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      if (pos_ >= text_.size()) return Fail("a hex digit of a \\u escape"), -1;
      const char c = text_[pos_];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return Fail("a hex digit of a \\u escape"), -1;
      value = value * 16 + digit;
    }
    return value;
  }

  // One UTF-8 encoded code point at pos_ (RFC 3629: no overlong forms, no surrogates).
  bool Utf8CodePoint() {
    const uint8_t lead = Byte(pos_);
    int continuation = 0;
    uint8_t low = 0x80, high = 0xBF;  // the range of the first continuation byte
    if (lead < 0x80) {
      continuation = 0;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuation = 2;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuation = 3;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return Fail("a UTF-8 lead byte");
    }
    ++pos_;
    for (int i = 0; i < continuation; ++i, ++pos_) {
      if (pos_ >= text_.size() || Byte(pos_) < (i == 0 ? low : 0x80) ||
          Byte(pos_) > (i == 0 ? high : 0xBF)) {
        return Fail("a UTF-8 continuation byte");
      }
    }
    return true;
  }

  // A string literal at pos_; its raw spelling into *raw and its length in code points into
  // *code_points, when given.
  bool String(std::string* raw, int* code_points) {
    ++pos_;
    const size_t begin = pos_;
    int length = 0;
    while (true) {
      if (pos_ >= text_.size()) return Fail("'\"' closing the string");
      const uint8_t c = Byte(pos_);
      if (c == '"') break;
      if (c < 0x20) return Fail("a string character (U+0000-U+001F only escaped)");
      if (c == '\\') {
        ++pos_;
        ++result_.escapes;
        if (At('u')) {
          ++pos_;
          const int unit = Hex4();
          if (unit < 0) return false;
          // A high surrogate followed by a low one escapes a single code point.
          if (unit >= 0xD800 && unit <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t saved = pos_;
            pos_ += 2;
            const int next = Hex4();
            if (next < 0) return false;
            if (next < 0xDC00 || next > 0xDFFF) pos_ = saved;  // the next escape stands alone
          }
        } else if (pos_ < text_.size() &&
                   std::string_view("\"\\/bfnrt").find(text_[pos_]) != std::string_view::npos) {
          ++pos_;
        } else {
          return Fail("one of \" \\ / b f n r t u after '\\'");
        }
      } else if (!Utf8CodePoint()) {
        return false;
      }
      ++length;
    }
    if (raw != nullptr) *raw = std::string(text_.substr(begin, pos_ - begin));
    if (code_points != nullptr) *code_points = length;
    ++pos_;
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  JsonCheck result_;
};

JsonCheck ReadStrictJson(std::string_view text) { return StrictJsonReader(text).Read(); }

// A printable spelling of generated bytes for failure messages.
std::string Printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte >= 0x20 && byte < 0x7F && c != '\\') {
      out += c;
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    }
  }
  return out;
}

struct Walk {
  std::string text;     // the bytes generated before the end-of-text token
  bool ended = false;   // the walk picked end-of-text, which the matcher accepted
  std::string failure;  // what the matcher did that it should not have; empty if nothing
};

// Generates one output the way a sampler would under the grammar's mask, choosing uniformly among
// the tokens the mask allows at each step, until end-of-text is chosen or max_steps tokens.
Walk RandomWalk(const CompiledGrammar& grammar, std::mt19937& rng, int max_steps) {
  GrammarMatcher matcher(grammar);
  TokenMask mask;
  Walk walk;
  for (int step = 0; step < max_steps; ++step) {
    const std::vector<int32_t> allowed = mask.Fill(matcher);
    if (allowed.empty()) {
      walk.failure = absl::StrCat("the mask allows no token after \"", Printable(walk.text), "\"");
      return walk;
    }
    const int32_t token =
        allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (!matcher.AcceptToken(token)) {
      walk.failure = absl::StrCat("the matcher rejected token ", token,
                                  ", which its mask allowed, after \"", Printable(walk.text), "\"");
      return walk;
    }
    if (token == kEndOfText) {
      walk.ended = matcher.IsTerminated();
      if (!walk.ended) walk.failure = "the matcher accepted end-of-text but is not terminated";
      return walk;
    }
    walk.text.push_back(static_cast<char>(token));
  }
  return walk;
}

// Whether the grammar accepts `text` as a whole output: every byte, then end-of-text.
bool AcceptsWhole(const CompiledGrammar& grammar, const std::string& text) {
  GrammarMatcher matcher(grammar);
  return matcher.AcceptString(text) && matcher.AcceptToken(kEndOfText) && matcher.IsTerminated();
}

constexpr char kBoundedStringSchema[] =
    R"({"type":"object","properties":{"s":{"type":"string","minLength":1,"maxLength":8}},)"
    R"("required":["s"]})";

class XGrammarTest : public testing::Test {
 protected:
  XGrammarTest() : compiler_(ByteLevelTokenizer(), /*max_threads=*/1) {}

  CompiledGrammar CompileBoundedStringSchema() {
    return compiler_.CompileJSONSchema(kBoundedStringSchema, /*any_whitespace=*/false);
  }

  GrammarCompiler compiler_;
};

// Every output sampled under a bounded string's mask is strict JSON whose string has 1 to 8 code
// points: no raw control character inside the string (XGrammar 0.2.8's bounded-string rule
// admitted them, and no escapes), ending within the steps the longest valid output needs.
TEST_F(XGrammarTest, RandomWalksOfABoundedStringSchemaAreStrictJson) {
  const CompiledGrammar grammar = CompileBoundedStringSchema();
  // {"s": "<8 characters of at most 6 bytes each (\uXXXX)>"} is under 70 bytes.
  constexpr int kMaxSteps = 128;
  constexpr int kWalks = 2000;
  std::mt19937 rng(20240611);
  int escapes = 0;
  int non_ascii_walks = 0;
  for (int i = 0; i < kWalks; ++i) {
    const Walk walk = RandomWalk(grammar, rng, kMaxSteps);
    ASSERT_TRUE(walk.failure.empty()) << "walk " << i << ": " << walk.failure;
    ASSERT_TRUE(walk.ended) << "walk " << i << " did not end within " << kMaxSteps << " tokens: \""
                            << Printable(walk.text) << "\"";
    const JsonCheck check = ReadStrictJson(walk.text);
    ASSERT_TRUE(check.error.empty()) << "walk " << i << " generated \"" << Printable(walk.text)
                                     << "\", which is not strict JSON: " << check.error;
    ASSERT_EQ(check.string_lengths.count("s"), 1u)
        << "walk " << i << " generated \"" << Printable(walk.text) << "\": expected a string \"s\"";
    const int length = check.string_lengths.at("s");
    EXPECT_GE(length, 1) << "walk " << i << ": \"" << Printable(walk.text) << "\"";
    EXPECT_LE(length, 8) << "walk " << i << ": \"" << Printable(walk.text) << "\"";
    escapes += check.escapes;
    for (const char c : walk.text) {
      if (static_cast<uint8_t>(c) >= 0x80) {
        ++non_ascii_walks;
        break;
      }
    }
  }
  // The walks reached both the escapes and multi-byte UTF-8, not only printable ASCII.
  EXPECT_GT(escapes, 0) << "no walk of " << kWalks << " generated an escape sequence";
  EXPECT_GT(non_ascii_walks, 0) << "no walk of " << kWalks << " generated a non-ASCII character";
}

// The bounds count characters as decoded: an escape sequence is one, a raw control character or a
// surrogate spelled in UTF-8 is no character at all.
TEST_F(XGrammarTest, BoundedStringCountsEscapesAsOneCharacter) {
  const CompiledGrammar grammar = CompileBoundedStringSchema();
  const std::vector<std::pair<std::string, bool>> cases = {
      {R"({"s": "a"})", true},
      {R"({"s": "abcdefgh"})", true},
      {R"({"s": ""})", false},           // below minLength
      {R"({"s": "abcdefghi"})", false},  // above maxLength
      {R"({"s": "\n\"\\\u00e9"})", true},
      {R"({"s": "\t\t\t\t\t\t\t\t"})", true},     // eight escapes: eight characters
      {R"({"s": "\t\t\t\t\t\t\t\t\t"})", false},  // nine
      {R"({"s": "\u00E9\u00e9\/\b\f\r\t\n"})", true},
      {R"({"s": "é日本"})", true},                    // three code points, eight bytes
      {"{\"s\": \"a\tb\"}", false},                   // a raw tab
      {std::string("{\"s\": \"a\0b\"}", 12), false},  // a raw NUL
      {"{\"s\": \"\x1f\"}", false},
      {R"({"s": "\x"})", false},  // not an escape
      {R"({"s": "\u00g0"})", false},
      {R"({"s": "\ud83d\ude00"})", true},       // a surrogate pair, escaped: two of the eight
      {"{\"s\": \"\xed\xa0\x80\"}", false},     // U+D800 in UTF-8's form: not UTF-8
      {"{\"s\": \"\xf0\x9f\x98\x80\"}", true},  // U+1F600
  };
  for (const auto& [text, accepted] : cases) {
    EXPECT_EQ(AcceptsWhole(grammar, text), accepted)
        << "\"" << Printable(text) << "\": expected the grammar to "
        << (accepted ? "accept" : "reject") << " it";
  }
}

// An unbounded string keeps to what JSON allows too: no raw control character, no surrogate
// spelled in UTF-8, any escape.
TEST_F(XGrammarTest, UnboundedStringRejectsWhatJsonForbids) {
  const CompiledGrammar grammar = compiler_.CompileJSONSchema(R"({"type":"string"})");
  EXPECT_TRUE(AcceptsWhole(grammar, R"("a\n\u00e9 \ud83d\ude00")"));
  EXPECT_TRUE(AcceptsWhole(grammar, "\"\xf0\x9f\x98\x80\""));
  EXPECT_FALSE(AcceptsWhole(grammar, "\"a\tb\""));
  EXPECT_FALSE(AcceptsWhole(grammar, "\"\xed\xa0\x80\""));
}

// String formats admit only values a strict reader of the format accepts: calendar dates (the
// days each month has, February 29 in leap years, no year 0000) and IPv4 octets without leading
// zeros, alone or inside an IPv6 address. XGrammar 0.2.8's patterns admitted each refused case.
TEST_F(XGrammarTest, StringFormatsAdmitOnlyValidDatesAndAddresses) {
  const auto accepts = [&](const char* format, const std::string& value) {
    const std::string schema = std::string(R"({"type":"string","format":")") + format + "\"}";
    return AcceptsWhole(compiler_.CompileJSONSchema(schema), "\"" + value + "\"");
  };
  const std::vector<std::tuple<const char*, std::string, bool>> cases = {
      {"date", "2024-02-29", true},
      {"date", "2000-02-29", true},
      {"date", "2023-02-28", true},
      {"date", "2023-12-31", true},
      {"date", "0001-01-01", true},
      {"date", "2023-02-29", false},
      {"date", "1900-02-29", false},
      {"date", "2023-02-31", false},
      {"date", "2023-04-31", false},
      {"date", "0000-01-01", false},
      {"date", "2023-13-01", false},
      {"date-time", "2024-02-29T12:00:00Z", true},
      {"date-time", "2023-02-30T12:00:00Z", false},
      {"ipv4", "10.0.0.255", true},
      {"ipv4", "0.0.0.0", true},
      {"ipv4", "88.181.28.000", false},
      {"ipv4", "010.1.1.1", false},
      {"ipv4", "1.1.1.256", false},
      {"ipv6", "::ffff:10.0.0.1", true},
      {"ipv6", "::ffff:10.0.0.01", false},
  };
  for (const auto& [format, value, accepted] : cases) {
    EXPECT_EQ(accepts(format, value), accepted)
        << "format " << format << ", \"" << value << "\": expected the grammar to "
        << (accepted ? "accept" : "reject") << " it";
  }
}

// An escape past U+10FFFF is not overflowed into another character: XGrammar 0.2.8 read
// \x80000000 into an int (undefined behaviour; the regex a\x80000000b matched "a\v"). A grammar
// refuses it; the regex converter, as for any escape it does not recognise, matches the escaped
// text literally (and logs a warning).
TEST_F(XGrammarTest, EscapesPastTheLastCodePointDoNotOverflow) {
  const CompiledGrammar regex = compiler_.CompileRegex(R"(a\x80000000b)");
  EXPECT_FALSE(AcceptsWhole(regex, "a\vb"));
  EXPECT_TRUE(AcceptsWhole(regex, "ax80000000b"));
  EXPECT_FALSE(AcceptsWhole(compiler_.CompileRegex(R"(\Uffffffff)"), "\xff"));
  for (const std::string grammar :
       {R"(root ::= "\x80000000")", R"(root ::= [\U7fffffff])", R"(root ::= "\U00110000")"}) {
    EXPECT_THROW(compiler_.CompileGrammar(grammar, "root"), std::exception) << grammar;
  }
  // The last code point itself is still one.
  EXPECT_TRUE(AcceptsWhole(compiler_.CompileRegex(R"(a\x10FFFF-)"), "a\xf4\x8f\xbf\xbf-"));
  EXPECT_TRUE(AcceptsWhole(compiler_.CompileGrammar(R"(root ::= "\U0010FFFF")", "root"),
                           "\xf4\x8f\xbf\xbf"));
}

// A schema that cannot be converted is an exception naming the problem, not a crash.
TEST_F(XGrammarTest, InvalidSchemasAreErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"string","minLength":5,"maxLength":2})",
       "minLength 5 is greater than maxLength 2"},
      {R"({"type":"string","minLength":"five"})", "minLength must be an integer"},
      {R"({"type":"object",)", ""},  // not JSON at all
  };
  for (const auto& [schema, message] : cases) {
    try {
      compiler_.CompileJSONSchema(schema);
      ADD_FAILURE() << "schema " << schema << ": expected an exception, got a compiled grammar";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_FALSE(what.empty()) << "schema " << schema << ": the exception has no message";
      EXPECT_NE(what.find(message), std::string::npos)
          << "schema " << schema << ": expected the message to say \"" << message << "\", got \""
          << what << "\"";
    }
  }
}

// A regex grammar accepts what the regex matches, and its mask keeps to it.
TEST_F(XGrammarTest, RegexGrammarAcceptsMatchingStrings) {
  const CompiledGrammar grammar =
      compiler_.CompileGrammar(xgrammar::Grammar::FromRegex(R"([a-z]+@[a-z]+\.(com|org))"));
  EXPECT_TRUE(AcceptsWhole(grammar, "alice@example.org"));
  EXPECT_TRUE(AcceptsWhole(grammar, "bob@mail.com"));
  EXPECT_FALSE(AcceptsWhole(grammar, "alice@example.net"));
  EXPECT_FALSE(AcceptsWhole(grammar, "Alice@example.org"));
  EXPECT_FALSE(AcceptsWhole(grammar, "alice@example.org "));

  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    const Walk walk = RandomWalk(grammar, rng, /*max_steps=*/4096);
    ASSERT_TRUE(walk.failure.empty()) << "walk " << i << ": " << walk.failure;
    if (!walk.ended) continue;  // [a-z]+ may run past the step limit
    const size_t at = walk.text.find('@');
    ASSERT_NE(at, std::string::npos) << "\"" << Printable(walk.text) << "\" has no '@'";
    const std::string_view domain = std::string_view(walk.text).substr(walk.text.size() - 4);
    EXPECT_TRUE(domain == ".com" || domain == ".org") << "\"" << Printable(walk.text) << "\"";
  }
}

}  // namespace
