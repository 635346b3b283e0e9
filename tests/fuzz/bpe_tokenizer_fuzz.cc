// libFuzzer target: the "tost-bpe-v1" tokenizer (model/text/bpe_tokenizer.h).
//
// Input without a NUL byte: text, encoded with the shipped tost-austen tokenizer
// (models/tost-austen/tokenizer.json). Input with one: tokenizer.json text, NUL, text; the file
// is parsed (BpeTokenizer::Parse, with the vocabulary size and end-of-text id its merges imply, as
// a matching config.json would give them) and, when it parses, encodes the text.
//
// Encodings must round-trip: the ids are in the vocabulary, never end of text, and their bytes
// concatenate to the text. Pre-tokenisation must split the text into non-empty pieces of at most
// max_piece_bytes that concatenate to it.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/utf8.h"
#include "model/text/bpe_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::model::BpeTokenizer;

struct Vocabulary {
  int64_t size = 257;
  int64_t eos = 256;
};

// What config.json would say for this file: 256 bytes + merges + end of text. Without a list of
// merges Parse refuses the file anyway.
Vocabulary VocabularyOf(std::string_view json_text) {
  const nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  Vocabulary v;
  if (doc.is_object() && doc.contains("merges") && doc["merges"].is_array()) {
    v.eos = 256 + static_cast<int64_t>(doc["merges"].size());
    v.size = v.eos + 1;
  }
  return v;
}

void CheckEncoding(const BpeTokenizer& tok, std::string_view text) {
  const std::vector<int32_t> ids = tok.Encode(text);
  std::string bytes;
  for (const int32_t id : ids) {
    TOST_FUZZ_CHECK(id >= 0 && id < tok.vocab_size() && id != tok.eos_token_id());
    bytes += tok.TokenBytes(id);
  }
  TOST_FUZZ_CHECK(bytes == text);
  TOST_FUZZ_CHECK(ids.size() <= text.size());
}

void CheckPreTokenize(std::string_view text, int64_t max_piece_bytes) {
  std::string joined;
  for (const std::string_view piece : BpeTokenizer::PreTokenize(text, max_piece_bytes)) {
    TOST_FUZZ_CHECK(!piece.empty() && static_cast<int64_t>(piece.size()) <= max_piece_bytes);
    joined += piece;
  }
  TOST_FUZZ_CHECK(joined == text);
}

const BpeTokenizer& Austen() {
  static const BpeTokenizer* const tok = [] {
    const std::string text = tost::fuzz::ReadSourceFile("models/tost-austen/tokenizer.json");
    const Vocabulary v = VocabularyOf(text);
    auto parsed = BpeTokenizer::Parse(text, "tokenizer.json", v.size, v.eos);
    TOST_FUZZ_CHECK(parsed.ok());
    return parsed->release();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Austen();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts =
      tost::fuzz::SplitAtNul(tost::fuzz::Bytes(data, size), 2);
  if (parts.size() == 1) {
    CheckEncoding(Austen(), parts[0]);
    CheckPreTokenize(parts[0], 1 + static_cast<int64_t>(size % 40));
    return 0;
  }
  const Vocabulary v = VocabularyOf(parts[0]);
  const auto tok = BpeTokenizer::Parse(parts[0], "tokenizer.json", v.size, v.eos);
  if (!tok.ok()) {
    // Load errors reach ListModels: valid UTF-8 whatever bytes the file holds.
    TOST_FUZZ_CHECK(
        !tost::model::FirstInvalidUtf8(std::string(tok.status().message())).has_value());
    return 0;
  }
  TOST_FUZZ_CHECK((*tok)->vocab_size() == v.size && (*tok)->eos_token_id() == v.eos);
  TOST_FUZZ_CHECK((*tok)->merges() == v.eos - 256);
  TOST_FUZZ_CHECK((*tok)->TokenBytes(static_cast<int32_t>(v.eos)).empty());
  CheckEncoding(**tok, parts[1]);
  return 0;
}
