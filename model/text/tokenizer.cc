#include "model/text/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/utf8.h"
#include "model/config/config.h"
#include "model/text/bpe_tokenizer.h"
#include "model/text/gpt2_tokenizer.h"

namespace tost::model {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::TokenBytes(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  return {};
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir,
                                                         const LanguageConfig& config) {
  if (config.tokenizer == "byte") {
    return std::make_unique<ByteTokenizer>(config.vocab_size, config.eos_token_id);
  }
  if (config.tokenizer == "bpe") {
    const std::string path = model_dir + "/" + config.tokenizer_file;
    absl::StatusOr<std::string> text =
        ReadRegularFile(path, kMaxTokenizerFileBytes, "tokenizer file");
    if (!text.ok()) return text.status();
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe =
        BpeTokenizer::Parse(*text, path, config.vocab_size, config.eos_token_id);
    if (!bpe.ok()) return bpe.status();
    return std::unique_ptr<Tokenizer>(*std::move(bpe));
  }
  if (config.tokenizer == "none") {
    return std::make_unique<NoTextTokenizer>(config.vocab_size, config.eos_token_id);
  }
  if (config.tokenizer == "gpt2") {
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> gpt2;
    if (!config.tokenizer_ranks_file.empty()) {
      const std::string path = model_dir + "/" + config.tokenizer_ranks_file;
      absl::StatusOr<std::string> ranks =
          ReadRegularFile(path, kMaxTokenizerFileBytes, "tokenizer file");
      if (!ranks.ok()) return ranks.status();
      gpt2 = Gpt2Tokenizer::FromRanks(*ranks, path, config.eos_token_id);
    } else {
      const std::string encoder_path = model_dir + "/" + config.tokenizer_encoder_file;
      const std::string merges_path = model_dir + "/" + config.tokenizer_merges_file;
      absl::StatusOr<std::string> encoder =
          ReadRegularFile(encoder_path, kMaxTokenizerFileBytes, "tokenizer file");
      if (!encoder.ok()) return encoder.status();
      absl::StatusOr<std::string> merges =
          ReadRegularFile(merges_path, kMaxTokenizerFileBytes, "tokenizer file");
      if (!merges.ok()) return merges.status();
      gpt2 = Gpt2Tokenizer::FromEncoderAndMerges(*encoder, encoder_path, *merges, merges_path,
                                                 config.eos_token_id);
    }
    if (!gpt2.ok()) return gpt2.status();
    if ((*gpt2)->vocab_size() > config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_dir, "/config.json: the gpt2 tokenizer defines ", (*gpt2)->vocab_size(),
          " ids, more than the model's vocab_size ", config.vocab_size));
    }
    return std::unique_ptr<Tokenizer>(*std::move(gpt2));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      model_dir,
      "/config.json: tokenizer.type must be \"byte\", \"bpe\", \"gpt2\" or \"none\", got \"",
      config.tokenizer, "\""));
}

std::string Utf8Assembler::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto lead = static_cast<unsigned char>(pending_[i]);
    const int len = Utf8SequenceLength(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Validate as many bytes as we have; stop (and wait) if the character is merely incomplete.
    bool invalid = false;
    size_t have = 1;
    for (; have < static_cast<size_t>(len) && i + have < pending_.size(); ++have) {
      const auto c = static_cast<unsigned char>(pending_[i + have]);
      if (have == 1 ? !IsValidUtf8SecondByte(lead, c) : !IsUtf8Continuation(c)) {
        invalid = true;
        break;
      }
    }
    if (invalid) {
      out += kReplacement;
      i += have;  // drop the bad prefix; the offending byte is examined again as a lead
      continue;
    }
    if (have < static_cast<size_t>(len)) break;  // incomplete: hold it back
    out.append(pending_, i, len);
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::Flush() {
  std::string out = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace tost::model
