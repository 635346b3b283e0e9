// Byte-level tokenizer: ids 0-255 are bytes, ids >= 256 are special tokens (e.g. end of text), and
// an incremental UTF-8 assembler so streamed text only ever contains complete characters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tost::model {

class ByteTokenizer {
 public:
  ByteTokenizer(int64_t vocab_size, int64_t eos_token_id) : vocab_size_(vocab_size), eos_token_id_(eos_token_id) {}

  std::vector<int32_t> Encode(std::string_view text) const;
  // The bytes a token stands for: one byte for 0-255, nothing for specials.
  std::string TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const { return id >= 256; }
  int64_t eos_token_id() const { return eos_token_id_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  int64_t vocab_size_;
  int64_t eos_token_id_;
};

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
