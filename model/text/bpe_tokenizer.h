// Byte-level BPE tokenizer "tost-bpe-v1": the server side of tools/bpe.py, which trains the merges
// and documents the encoding; the two are held equal by tests/model/text_test.cc on fixtures the
// Python encoder writes. Ids 0-255 are the bytes, 256 + r is merge r, then the end-of-text id.
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

class BpeTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json text. `source` names the file in errors; the vocabulary it defines must
  // have `vocab_size` ids with `eos_token_id` as its end-of-text id (both from config.json).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Parse(std::string_view json_text,
                                                             const std::string& source,
                                                             int64_t vocab_size,
                                                             int64_t eos_token_id);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  const char* type() const override { return "bpe"; }

  // Step 1 of the encoding: the pieces merges never cross (their concatenation is `text`).
  static std::vector<std::string_view> PreTokenize(std::string_view text, int64_t max_piece_bytes);
  int64_t merges() const { return static_cast<int64_t>(vocab_.size()) - 256; }

 private:
  BpeTokenizer(int64_t vocab_size, int64_t eos_token_id) : Tokenizer(vocab_size, eos_token_id) {}
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;

  int64_t max_piece_bytes_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> rank_;  // (left << 32 | right) -> merge rank
  std::vector<std::string> vocab_;               // bytes of ids 0 .. 255 + merges - 1
};

}  // namespace tost::model
