#include "service/structured/constraint_matcher.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tost::structured {
namespace {

// Clears bits [begin, end) of `words`.
void ClearBits(absl::Span<uint32_t> words, int64_t begin, int64_t end) {
  for (int64_t id = begin; id < end;) {
    const int64_t word = id / 32;
    const int bit = static_cast<int>(id % 32);
    if (bit == 0 && end - id >= 32) {
      words[word] = 0;
      id += 32;
    } else {
      words[word] &= ~(uint32_t{1} << bit);
      ++id;
    }
  }
}

}  // namespace

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled)
    : compiled_(std::move(compiled)), matcher_(compiled_->grammar) {}

void ConstraintMatcher::FillAllowed(absl::Span<uint32_t> bitmask_words) {
  const GrammarVocabulary& vocabulary = *compiled_->vocabulary;
  const int64_t words = vocabulary.bitmask_words();
  if (static_cast<int64_t>(bitmask_words.size()) < words || matcher_.IsTerminated()) {
    std::fill(bitmask_words.begin(),
              bitmask_words.begin() + std::min<int64_t>(words, bitmask_words.size()), 0u);
    return;
  }
  int64_t shape = words;
  DLTensor tensor;
  tensor.data = bitmask_words.data();  // int32 words as XGrammar writes them, same bits
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = &shape;
  tensor.strides = nullptr;
  tensor.byte_offset = 0;
  matcher_.FillNextTokenBitmask(&tensor);
  // XGrammar treats padding ids as special tokens and never allows them; clearing them here too
  // keeps the guarantee this class documents independent of that.
  ClearBits(bitmask_words, vocabulary.tokenizer_vocab_size(), words * 32);
}

absl::Status ConstraintMatcher::Accept(int32_t token) {
  const GrammarVocabulary& vocabulary = *compiled_->vocabulary;
  if (matcher_.IsTerminated()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "constraint ", KindName(compiled_->kind), ": expected no token after end-of-text (",
        vocabulary.eos_token_id(), "), received token ", token));
  }
  if (token < 0 || token >= vocabulary.model_vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint ", KindName(compiled_->kind), ": expected a token id in [0, ",
        vocabulary.model_vocab_size(), "), received ", token, " at position ", tokens_accepted_));
  }
  if (!matcher_.AcceptToken(token)) {
    const auto& decoded = compiled_->grammar.GetTokenizerInfo().GetDecodedVocab();
    const std::string bytes =
        token < static_cast<int32_t>(decoded.size()) ? decoded[token] : std::string();
    return absl::InvalidArgumentError(
        absl::StrCat("constraint ", KindName(compiled_->kind), ": token ", token, " (\"",
                     absl::CHexEscape(bytes), "\") is not allowed at position ", tokens_accepted_));
  }
  ++tokens_accepted_;
  return absl::OkStatus();
}

bool ConstraintMatcher::CanEnd() const {
  return !matcher_.IsTerminated() && matcher_.IsCompleted();
}

bool ConstraintMatcher::Ended() const { return matcher_.IsTerminated(); }

absl::Status ConstraintMatcher::Replay(absl::Span<const int32_t> tokens) {
  matcher_.Reset();
  tokens_accepted_ = 0;
  for (const int32_t token : tokens) {
    if (absl::Status accepted = Accept(token); !accepted.ok()) {
      matcher_.Reset();
      tokens_accepted_ = 0;
      return absl::Status(accepted.code(), absl::StrCat("replaying ", tokens.size(),
                                                        " tokens: ", accepted.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tost::structured
