#include "service/structured/grammar_vocabulary.h"

#include <exception>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/error_detail.h"

namespace tost::structured {
namespace {

// The one way both constructors build XGrammar's view of a vocabulary: a compile worker's
// compiled grammar holds for the server's vocabulary only when the two are built alike.
xgrammar::TokenizerInfo MakeTokenizerInfo(const std::vector<std::string>& tokens,
                                          int64_t model_vocab_size, int32_t eos) {
  // Raw bytes: XGrammar takes each entry as the token's exact byte string; an empty one (a special
  // token) is never allowed, end-of-text aside, which is the stop token.
  return xgrammar::TokenizerInfo(tokens, xgrammar::VocabType::RAW,
                                 static_cast<int>(model_vocab_size), std::vector<int32_t>{eos});
}

}  // namespace

absl::StatusOr<std::shared_ptr<GrammarVocabulary>> GrammarVocabulary::Create(
    const model::Tokenizer& tokenizer, int64_t model_vocab_size, std::string_view model_name,
    const GrammarVocabularyOptions& options) {
  const absl::string_view name(model_name.data(), model_name.size());
  if (!tokenizer.encodes_text()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", name,
                     ": structured output needs a text tokenizer (its tokens' bytes are what a "
                     "grammar matches), but the model's tokenizer is \"",
                     tokenizer.type(), "\""));
  }
  const int64_t tokenizer_vocab = tokenizer.vocab_size();
  if (tokenizer_vocab <= 0 || model_vocab_size < tokenizer_vocab ||
      model_vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": expected a model vocabulary of at least the tokenizer's ",
                     tokenizer_vocab, " ids (and below 2^31), received ", model_vocab_size));
  }
  const int64_t eos = tokenizer.eos_token_id();
  if (eos < 0 || eos >= tokenizer_vocab) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", name, ": expected an end-of-text id below the tokenizer's ",
                     tokenizer_vocab, " tokens (it ends a constrained output), received ", eos));
  }
  std::vector<std::string> vocab;
  vocab.reserve(static_cast<size_t>(tokenizer_vocab));
  for (int64_t id = 0; id < tokenizer_vocab; ++id) {
    vocab.push_back(tokenizer.TokenBytes(static_cast<int32_t>(id)));
  }
  try {
    xgrammar::TokenizerInfo info =
        MakeTokenizerInfo(vocab, model_vocab_size, static_cast<int32_t>(eos));
    return std::shared_ptr<GrammarVocabulary>(new GrammarVocabulary(
        std::string(name), model_vocab_size, std::move(vocab), static_cast<int32_t>(eos),
        std::move(info), options.compile_threads < 1 ? 1 : options.compile_threads));
  } catch (const std::exception& e) {
    return WithServerDetail(
        absl::InternalError(absl::StrCat("model ", name, ": XGrammar refused the vocabulary")),
        absl::StrCat("XGrammar: ", e.what()));
  }
}

absl::StatusOr<std::shared_ptr<GrammarVocabulary>> GrammarVocabulary::FromTokens(
    std::vector<std::string> tokens, int64_t model_vocab_size, int32_t eos_token_id,
    std::string_view model_name, const GrammarVocabularyOptions& options) {
  const absl::string_view name(model_name.data(), model_name.size());
  const auto tokenizer_vocab = static_cast<int64_t>(tokens.size());
  if (tokenizer_vocab <= 0 || model_vocab_size < tokenizer_vocab ||
      model_vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": expected a model vocabulary of at least the ",
                     tokenizer_vocab, " tokens (and below 2^31), received ", model_vocab_size));
  }
  if (eos_token_id < 0 || eos_token_id >= tokenizer_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": expected an end-of-text id below the ", tokenizer_vocab,
                     " tokens, received ", eos_token_id));
  }
  try {
    xgrammar::TokenizerInfo info = MakeTokenizerInfo(tokens, model_vocab_size, eos_token_id);
    return std::shared_ptr<GrammarVocabulary>(new GrammarVocabulary(
        std::string(name), model_vocab_size, std::move(tokens), eos_token_id, std::move(info),
        options.compile_threads < 1 ? 1 : options.compile_threads));
  } catch (const std::exception& e) {
    return WithServerDetail(
        absl::InternalError(absl::StrCat("model ", name, ": XGrammar refused the vocabulary")),
        absl::StrCat("XGrammar: ", e.what()));
  }
}

GrammarVocabulary::GrammarVocabulary(std::string model_name, int64_t model_vocab_size,
                                     std::vector<std::string> tokens, int32_t eos_token_id,
                                     xgrammar::TokenizerInfo info, int compile_threads)
    : model_name_(std::move(model_name)),
      model_vocab_size_(model_vocab_size),
      tokenizer_vocab_size_(static_cast<int64_t>(tokens.size())),
      eos_token_id_(eos_token_id),
      tokens_(std::move(tokens)),
      compiler_(info, compile_threads, /*cache_enabled=*/false) {}

}  // namespace tost::structured
