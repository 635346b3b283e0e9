// libFuzzer target: the GPT-2 tokenizer (model/text/gpt2_tokenizer.h): its files and its encoding.
//
// Input without a NUL byte: text, encoded by the tokenizer built from the test fixtures
// (tests/model/fixtures/gpt2) in both file forms, encoder.json + vocab.bpe and gpt2.tiktoken.
// Input with NUL bytes, by its first byte:
//   '{'  encoder.json NUL vocab.bpe NUL text  (FromEncoderAndMerges, end of text as encoder.json
//        gives it)
//   else rank file NUL text                   (FromRanks, end of text the id after the ranks)
// and the text is encoded when the files load.
//
// Encodings must round-trip: ids in the vocabulary, never end of text, their bytes concatenating
// to the text (which need not be valid UTF-8); pre-tokenisation must cover the text exactly.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/utf8.h"
#include "model/text/gpt2_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::model::Gpt2Tokenizer;

constexpr char kFixtures[] = "tests/model/fixtures/gpt2/";

void CheckEncoding(const Gpt2Tokenizer& tok, std::string_view text) {
  std::string joined;
  for (const std::string_view piece : tok.PreTokenize(text)) {
    TOST_FUZZ_CHECK(!piece.empty());
    joined += piece;
  }
  TOST_FUZZ_CHECK(joined == text);
  std::string bytes;
  for (const int32_t id : tok.Encode(text)) {
    TOST_FUZZ_CHECK(id >= 0 && id < tok.vocab_size() && id != tok.eos_token_id());
    bytes += tok.TokenBytes(id);
  }
  TOST_FUZZ_CHECK(bytes == text);
}

// encoder.json's id for "<|endoftext|>", what config.json must give as eos_token_id.
int64_t EndOfTextOf(std::string_view encoder_json) {
  const nlohmann::json doc =
      nlohmann::json::parse(encoder_json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("<|endoftext|>") &&
      doc["<|endoftext|>"].is_number_integer()) {
    return doc["<|endoftext|>"].get<int64_t>();
  }
  return 50256;
}

// The number of non-empty lines: the id after the ranks of a well-formed rank file.
int64_t RanksIn(std::string_view text) {
  int64_t n = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    size_t len = end - at;
    if (len > 0 && text[at + len - 1] == '\r') --len;
    if (len > 0) ++n;
    at = end + 1;
  }
  return n;
}

struct Fixture {
  std::unique_ptr<Gpt2Tokenizer> from_encoder;
  std::unique_ptr<Gpt2Tokenizer> from_ranks;
};

const Fixture& Fixtures() {
  static const Fixture* const f = [] {
    const std::string dir = kFixtures;
    const std::string encoder = tost::fuzz::ReadSourceFile(dir + "encoder.json");
    const std::string merges = tost::fuzz::ReadSourceFile(dir + "vocab.bpe");
    const std::string ranks = tost::fuzz::ReadSourceFile(dir + "gpt2.tiktoken");
    const int64_t eos = EndOfTextOf(encoder);
    auto a = Gpt2Tokenizer::FromEncoderAndMerges(encoder, "encoder.json", merges, "vocab.bpe", eos);
    auto b = Gpt2Tokenizer::FromRanks(ranks, "gpt2.tiktoken", eos);
    TOST_FUZZ_CHECK(a.ok() && b.ok());
    return new Fixture{*std::move(a), *std::move(b)};
  }();
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fixtures();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = tost::fuzz::Bytes(data, size);
  const std::vector<std::string_view> parts = tost::fuzz::SplitAtNul(input, 3);
  if (parts.size() == 1) {
    CheckEncoding(*Fixtures().from_encoder, input);
    CheckEncoding(*Fixtures().from_ranks, input);
    return 0;
  }
  if (input[0] == '{') {
    const std::string_view text = parts.size() > 2 ? parts[2] : std::string_view();
    const auto tok = Gpt2Tokenizer::FromEncoderAndMerges(parts[0], "encoder.json", parts[1],
                                                         "vocab.bpe", EndOfTextOf(parts[0]));
    if (tok.ok()) CheckEncoding(**tok, text);
    // Load errors reach ListModels: valid UTF-8 whatever bytes the files hold.
    if (!tok.ok())
      TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(std::string(tok.status().message())));
    return 0;
  }
  // A rank file and its text: rejoin what a second NUL split off.
  const std::string_view text = input.substr(parts[0].size() + 1);
  const auto tok = Gpt2Tokenizer::FromRanks(parts[0], "gpt2.tiktoken", RanksIn(parts[0]));
  if (tok.ok()) CheckEncoding(**tok, text);
  // Load errors reach ListModels: valid UTF-8 whatever bytes the files hold.
  if (!tok.ok())
    TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(std::string(tok.status().message())));
  return 0;
}
