// libFuzzer target: a request's output constraint through its checks and its compile
// (service/structured: Validate, then CompileConstraint, what GrammarCache runs on a miss, with
// XGrammar's JSON-schema, regex and EBNF front ends and its token-mask compiler), then a few steps
// of a ConstraintMatcher over a small byte-level vocabulary. The first input byte picks the kind
// (JSON schema, regex, EBNF grammar, choices); the rest is the constraint's text (for choices, its
// first byte is the separator the rest is split at).
//
// The work per input is bounded by Validate's limits (constraint.h: 64 KiB of text, 1024 choices
// of at most 4 KiB), which are what bound a request's compile on the serving path: the GrammarCache
// only stops waiting after max_compile_ms, the compile itself runs to its end (it cannot be
// interrupted), so its time is not bounded here either; a compile that runs past libFuzzer's
// -timeout is a finding.
//
// Properties: an input Validate refuses is refused by the compile with the same status; the
// compile answers OK or INVALID_ARGUMENT, nothing else (an exception of XGrammar's escaping it, a
// crash or a sanitizer report inside it is a finding); a mask never allows a padding id or a bit
// past the model's vocabulary, never writes past its words, and allows end-of-text exactly when
// the matcher says the output may end; every allowed token is accepted; a forbidden token is
// refused and leaves the matcher as it was; after end-of-text nothing is allowed and nothing is
// accepted; replaying the accepted tokens on a fresh matcher gives the same mask.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "model/text/tokenizer.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"
#include "service/structured/constraint_matcher.h"
#include "service/structured/grammar_vocabulary.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::structured::CompileConstraint;
using tost::structured::Constraint;
using tost::structured::ConstraintMatcher;
using tost::structured::GrammarVocabulary;

// Ids 0-255 are the bytes, 256 ends the text; the model's vocabulary pads them to 300 (ids
// 257-299 stand for nothing and are never allowed), and the last of its 10 mask words has bits
// past 300, which are never set either.
constexpr int64_t kTokenizerVocab = 257;
constexpr int32_t kEndOfText = 256;
constexpr int64_t kModelVocab = 300;
constexpr int64_t kWords = (kModelVocab + 31) / 32;
constexpr int kSteps = 12;
constexpr uint32_t kGuardWord = 0xA5A5A5A5u;  // after the mask: FillAllowed must not write it

const std::shared_ptr<GrammarVocabulary>& Vocabulary() {
  static const std::shared_ptr<GrammarVocabulary>* vocabulary = [] {
    static const tost::model::ByteTokenizer tokenizer(kTokenizerVocab, kEndOfText);
    auto created = GrammarVocabulary::Create(tokenizer, kModelVocab, "fuzz-bytes");
    TOST_FUZZ_CHECK(created.ok());
    return new std::shared_ptr<GrammarVocabulary>(*std::move(created));
  }();
  return *vocabulary;
}

Constraint FromInput(uint8_t selector, std::string_view text) {
  Constraint c;
  switch (selector % 4) {
    case 0:
      c.kind = Constraint::Kind::kJsonSchema;
      break;
    case 1:
      c.kind = Constraint::Kind::kRegex;
      break;
    case 2:
      c.kind = Constraint::Kind::kGrammar;
      break;
    default:
      c.kind = Constraint::Kind::kChoice;
      if (text.empty()) return c;  // no choices: Validate refuses it
      {
        const char separator = text.front();
        text.remove_prefix(1);
        while (true) {
          const size_t at = text.find(separator);
          c.choices.emplace_back(text.substr(0, at));
          if (at == std::string_view::npos) break;
          text.remove_prefix(at + 1);
        }
      }
      return c;
  }
  c.text = std::string(text);
  return c;
}

// The allowed ids of one FillAllowed, checking the mask's promises.
std::vector<int32_t> Allowed(ConstraintMatcher& matcher, std::vector<uint32_t>* words_out) {
  std::vector<uint32_t> words(kWords + 1, 0xFFFFFFFFu);
  words[kWords] = kGuardWord;
  matcher.FillAllowed(absl::MakeSpan(words.data(), kWords));
  TOST_FUZZ_CHECK(words[kWords] == kGuardWord);
  std::vector<int32_t> allowed;
  for (int32_t id = 0; id < 32 * kWords; ++id) {
    if (((words[id / 32] >> (id % 32)) & 1u) == 0) continue;
    TOST_FUZZ_CHECK(id < kTokenizerVocab);  // no padding id, no bit past the vocabulary
    allowed.push_back(id);
  }
  words.pop_back();
  if (words_out != nullptr) *words_out = std::move(words);
  return allowed;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  for (const int32_t i : ids) {
    if (i == id) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text = tost::fuzz::Bytes(data + 1, size - 1);
  const Constraint constraint = FromInput(data[0], text);

  const absl::Status valid = tost::structured::Validate(constraint);
  const auto compiled = CompileConstraint(Vocabulary(), constraint);
  if (!valid.ok()) {
    TOST_FUZZ_CHECK(valid.code() == absl::StatusCode::kInvalidArgument);
    TOST_FUZZ_CHECK(compiled.status() == valid);
    return 0;
  }
  TOST_FUZZ_CHECK(compiled.ok() || compiled.status().code() == absl::StatusCode::kInvalidArgument);
  if (!compiled.ok()) return 0;

  ConstraintMatcher matcher(*compiled);
  TOST_FUZZ_CHECK(matcher.bitmask_words() == kWords);
  TOST_FUZZ_CHECK(matcher.Accept(-1).code() == absl::StatusCode::kInvalidArgument);
  TOST_FUZZ_CHECK(matcher.Accept(kModelVocab).code() == absl::StatusCode::kInvalidArgument);
  // A padding id is refused too; once per process: XGrammar logs a warning every time.
  static bool padding_checked = false;
  if (!padding_checked) {
    TOST_FUZZ_CHECK(matcher.Accept(kTokenizerVocab).code() == absl::StatusCode::kInvalidArgument);
    padding_checked = true;
  }

  std::vector<int32_t> accepted;
  std::vector<uint32_t> words;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<int32_t> allowed = Allowed(matcher, &words);
    TOST_FUZZ_CHECK(Contains(allowed, kEndOfText) == matcher.CanEnd());
    if (allowed.empty()) break;  // a dead end: nothing may follow, not even the end
    // A forbidden token is refused and changes nothing.
    for (int32_t id = 0; id < kTokenizerVocab; ++id) {
      if (Contains(allowed, id)) continue;
      TOST_FUZZ_CHECK(matcher.Accept(id).code() == absl::StatusCode::kInvalidArgument);
      std::vector<uint32_t> again;
      Allowed(matcher, &again);
      TOST_FUZZ_CHECK(again == words);
      break;
    }
    // The next token, chosen by the input's bytes: the end only when nothing else is allowed or
    // at the last step, so that the walk goes some way into the constraint.
    std::vector<int32_t> candidates;
    for (const int32_t id : allowed) {
      if (id != kEndOfText) candidates.push_back(id);
    }
    const bool end = candidates.empty() || step == kSteps - 1;
    if (end && !Contains(allowed, kEndOfText)) break;
    const size_t pick = (text.empty() ? 0 : static_cast<uint8_t>(text[step % text.size()])) +
                        static_cast<size_t>(step) * 31;
    const int32_t token = end ? kEndOfText : candidates[pick % candidates.size()];
    TOST_FUZZ_CHECK(matcher.Accept(token).ok());
    accepted.push_back(token);
    if (token == kEndOfText) {
      TOST_FUZZ_CHECK(matcher.Ended() && !matcher.CanEnd());
      TOST_FUZZ_CHECK(Allowed(matcher, nullptr).empty());
      TOST_FUZZ_CHECK(matcher.Accept(0).code() == absl::StatusCode::kFailedPrecondition);
      break;
    }
  }
  TOST_FUZZ_CHECK(matcher.tokens_accepted() == static_cast<int64_t>(accepted.size()));

  // A sequence resumed elsewhere rebuilds the same progress.
  ConstraintMatcher replayed(*compiled);
  TOST_FUZZ_CHECK(replayed.Replay(accepted).ok());
  TOST_FUZZ_CHECK(replayed.tokens_accepted() == matcher.tokens_accepted());
  TOST_FUZZ_CHECK(replayed.Ended() == matcher.Ended());
  std::vector<uint32_t> mine, theirs;
  Allowed(matcher, &mine);
  Allowed(replayed, &theirs);
  TOST_FUZZ_CHECK(mine == theirs);
  return 0;
}
