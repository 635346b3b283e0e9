// Tokenizers of the language models: the interface the service uses, the byte tokenizer, and the
// loader that picks one from a model's config (the byte-level BPE one is in bpe_tokenizer.h). Also
// an incremental UTF-8 assembler so streamed text only ever contains complete characters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::model {

struct LanguageConfig;

// Text <-> token ids. Every tokenizer here is byte-level: any byte string encodes (no unknown
// token), and a token stands for a fixed byte string (empty for special tokens such as end of
// text). Thread-safe: Encode and TokenBytes are const and keep no mutable state.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // The bytes token `id` stands for: empty for special tokens and for ids outside the vocabulary.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // "byte", "bpe", "gpt2" or "none", as config.json names it.
  virtual const char* type() const = 0;
  // False for a model without a text tokenizer: it takes token ids and gives token ids only.
  virtual bool encodes_text() const { return true; }
  // The ids this tokenizer defines (0 .. vocab_size-1). A model may have more (GPT-2's vocabulary
  // is padded from 50257 to 50304): those ids mean nothing, and are never sampled.
  int64_t vocab_size() const { return vocab_size_; }
  int64_t eos_token_id() const { return eos_token_id_; }

 protected:
  Tokenizer(int64_t vocab_size, int64_t eos_token_id)
      : vocab_size_(vocab_size), eos_token_id_(eos_token_id) {}

 private:
  int64_t vocab_size_;
  int64_t eos_token_id_;
};

// Ids 0-255 are bytes, ids >= 256 are special tokens (e.g. end of text).
class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer(int64_t vocab_size, int64_t eos_token_id) : Tokenizer(vocab_size, eos_token_id) {}

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  const char* type() const override { return "byte"; }
  bool IsSpecial(int32_t id) const { return id >= 256; }
};

// No text tokenizer (config.json tokenizer.type "none"): for models whose vocabulary is not a
// text one this server knows. Token-id prompts and token-id output only; every id is valid.
class NoTextTokenizer final : public Tokenizer {
 public:
  NoTextTokenizer(int64_t vocab_size, int64_t eos_token_id) : Tokenizer(vocab_size, eos_token_id) {}

  std::vector<int32_t> Encode(std::string_view) const override { return {}; }
  std::string TokenBytes(int32_t) const override { return {}; }
  const char* type() const override { return "none"; }
  bool encodes_text() const override { return false; }
};

// The tokenizer config.json's "tokenizer" object describes (LanguageConfig::tokenizer), reading
// its file from `model_dir` when it has one. Errors name the file and what is wrong with it.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir,
                                                         const LanguageConfig& config);

// Accumulates bytes and releases the longest prefix made of complete UTF-8 characters. Invalid
// sequences are released as U+FFFD so a bad byte never blocks the stream.
class Utf8Assembler {
 public:
  // Appends `bytes`; returns the text that is now complete.
  std::string Push(std::string_view bytes);
  // Releases whatever is held (an incomplete trailing character becomes U+FFFD).
  std::string Flush();
  const std::string& pending() const { return pending_; }

 private:
  std::string pending_;
};

}  // namespace tost::model
