// A model's vocabulary as XGrammar sees it, and the grammar compiler bound to it: every token's
// byte string, the model's full logit width (which may pad the tokenizer's vocabulary), and the
// end-of-text token that ends a constrained output. One per model vocabulary: compiled grammars
// are only valid for the vocabulary they were compiled against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <xgrammar/xgrammar.h>

#include "absl/status/statusor.h"
#include "model/text/tokenizer.h"

namespace tost::structured {

struct GrammarVocabularyOptions {
  // Threads one compile uses to build a grammar's token masks. 1 keeps a compile from taking more
  // than one core from the forward passes it runs beside; the cache bounds how many run at once.
  int compile_threads = 1;
};

class GrammarVocabulary {
 public:
  // FAILED_PRECONDITION, naming the model, for a tokenizer that does not encode text (no byte
  // strings to match a grammar against) or whose end-of-text id is not one of its tokens;
  // INVALID_ARGUMENT when model_vocab_size is below the tokenizer's vocabulary. Ids from the
  // tokenizer's vocab_size up to model_vocab_size are padding: they stand for no bytes, and no
  // constraint ever allows them.
  static absl::StatusOr<std::shared_ptr<GrammarVocabulary>> Create(
      const model::Tokenizer& tokenizer, int64_t model_vocab_size, std::string_view model_name,
      const GrammarVocabularyOptions& options = {});
  // The same from the tokens' byte strings (id order) and the end-of-text id: how a compile
  // worker (compile_worker.h), which has no tokenizer, builds the vocabulary the server has.
  // INVALID_ARGUMENT for an empty vocabulary, a model_vocab_size below it, or an end-of-text id
  // outside it.
  static absl::StatusOr<std::shared_ptr<GrammarVocabulary>> FromTokens(
      std::vector<std::string> tokens, int64_t model_vocab_size, int32_t eos_token_id,
      std::string_view model_name, const GrammarVocabularyOptions& options = {});

  GrammarVocabulary(const GrammarVocabulary&) = delete;
  GrammarVocabulary& operator=(const GrammarVocabulary&) = delete;

  const std::string& model_name() const { return model_name_; }
  int64_t model_vocab_size() const { return model_vocab_size_; }
  int64_t tokenizer_vocab_size() const { return tokenizer_vocab_size_; }
  int32_t eos_token_id() const { return eos_token_id_; }
  // Every token's byte string, in id order (tokenizer_vocab_size of them): what a compile worker
  // is sent to build this vocabulary again.
  const std::vector<std::string>& tokens() const { return tokens_; }
  // 32-bit words of a bitmask over model_vocab_size ids.
  int64_t bitmask_words() const { return (model_vocab_size_ + 31) / 32; }

  // XGrammar's compiler is safe to call from several threads at once (its own cache is off: the
  // GrammarCache above it is the one that bounds memory).
  xgrammar::GrammarCompiler& compiler() { return compiler_; }

 private:
  GrammarVocabulary(std::string model_name, int64_t model_vocab_size,
                    std::vector<std::string> tokens, int32_t eos_token_id,
                    xgrammar::TokenizerInfo info, int compile_threads);

  std::string model_name_;
  int64_t model_vocab_size_;
  int64_t tokenizer_vocab_size_;
  int32_t eos_token_id_;
  std::vector<std::string> tokens_;
  xgrammar::GrammarCompiler compiler_;
};

}  // namespace tost::structured
