// GPT-2's byte-level BPE, the tokenizer of language models trained with the official ToST code,
// loaded from the files such a user already has (nothing is downloaded):
//   - encoder.json + vocab.bpe (OpenAI's GPT-2 release and Hugging Face's gpt2 files): tokens
//     written in GPT-2's bytes-to-unicode alphabet, and the merges in rank order;
//   - or a tiktoken rank file (gpt2.tiktoken): base64 token bytes and their rank, which is the id.
//
// Encoding: GPT-2's pre-tokenisation regex splits the text into pieces (contractions, letters,
// numbers, other symbols, whitespace; PCRE2 with Unicode properties, since the pattern needs \p{L}
// and a look-ahead), then each piece's bytes are merged pairwise, lowest rank first. With
// encoder.json + vocab.bpe a pair merges when vocab.bpe lists it (Hugging Face's rule); with a rank
// file when the two parts' concatenation has a rank (tiktoken's rule); for GPT-2's own files the
// two agree. "<|endoftext|>" inside text is text: only the model emits end of text.
//
// Text that is not valid UTF-8 still encodes: the regex runs over its valid stretches, and each
// run of bytes between them is a piece of its own.
//
// Merging uses a heap over adjacent pairs, so a piece of n bytes costs O(n log n) even when a
// hostile prompt is one million letters long.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "model/text/tokenizer.h"

namespace tost::model {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  ~Gpt2Tokenizer() override;

  // From the text of encoder.json and vocab.bpe. `eos_token_id` must be the id encoder.json gives
  // "<|endoftext|>". Errors name the file (`encoder_source`, `merges_source`) and the entry.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> FromEncoderAndMerges(
      std::string_view encoder_json, const std::string& encoder_source,
      std::string_view merges_text, const std::string& merges_source, int64_t eos_token_id);

  // From a tiktoken rank file's text: the ranks are the ids 0 .. n-1, and `eos_token_id` (the end
  // of text, a special id) must be >= n.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> FromRanks(std::string_view ranks_text,
                                                                  const std::string& source,
                                                                  int64_t eos_token_id);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  const char* type() const override { return "gpt2"; }

  // GPT-2's pre-tokenisation: the pieces merges never cross (their concatenation is `text`).
  std::vector<std::string_view> PreTokenize(std::string_view text) const;

 private:
  class Pattern;
  Gpt2Tokenizer(int64_t vocab_size, int64_t eos_token_id, std::unique_ptr<Pattern> pattern);
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Make(int64_t vocab_size,
                                                             int64_t eos_token_id);
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;
  // The merge of tokens `left` and `right`: {rank, id of the merged token}; rank -1 if they do
  // not merge.
  struct Merged {
    int32_t rank = -1;
    int32_t id = -1;
  };
  Merged Merge(int32_t left, int32_t right) const;

  std::unique_ptr<Pattern> pattern_;
  std::vector<std::string> bytes_of_;                // id -> bytes (empty: special or unused)
  absl::flat_hash_map<std::string, int32_t> id_of_;  // bytes -> id (special tokens excluded)
  std::vector<int32_t> byte_id_;                     // byte value -> id of that one byte
  absl::flat_hash_map<uint64_t, Merged> merges_;     // vocab.bpe: (left << 32 | right) -> merge
  bool rank_by_concatenation_ = false;               // a rank file: a join's rank is its id
};

}  // namespace tost::model
