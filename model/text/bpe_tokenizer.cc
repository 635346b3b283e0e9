#include "model/text/bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/utf8.h"
#include "model/config/json_utf8.h"

namespace tost::model {
namespace {

using json = nlohmann::json;

constexpr char kFormat[] = "tost-bpe-v1";
constexpr char kEndOfText[] = "<|endoftext|>";
// Longer pieces would only make hostile input slower to encode (the cost per piece is quadratic).
constexpr int64_t kMaxPieceBytesLimit = 1024;

enum ByteClass : uint8_t { kLetter, kDigit, kSpace, kOther };

// tools/bpe.py's byte classes: letters include every byte >= 0x80, so UTF-8 stays inside words.
ByteClass ClassOf(unsigned char b) {
  switch (b) {
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
    case ' ':
      return kSpace;
    default:
      break;
  }
  if (b >= '0' && b <= '9') return kDigit;
  if ((b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || b >= 0x80) return kLetter;
  return kOther;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

}  // namespace

std::vector<std::string_view> BpeTokenizer::PreTokenize(std::string_view text,
                                                        int64_t max_piece_bytes) {
  std::vector<std::string_view> pieces;
  const size_t n = text.size();
  const auto cls = [&](size_t i) { return ClassOf(static_cast<unsigned char>(text[i])); };
  const auto emit = [&](size_t start, size_t end) {
    for (size_t s = start; s < end; s += static_cast<size_t>(max_piece_bytes)) {
      pieces.push_back(text.substr(s, std::min(end, s + static_cast<size_t>(max_piece_bytes)) - s));
    }
  };
  size_t i = 0;
  while (i < n) {
    size_t start = i;
    if (cls(i) == kSpace) {
      size_t j = i;
      while (j < n && cls(j) == kSpace) ++j;
      if (j < n && text[j - 1] == ' ') {
        // The run's last ' ' leads the word (or number, or punctuation) that follows.
        if (j - 1 > i) emit(i, j - 1);
        start = j - 1;
        i = j;
      } else {
        emit(i, j);
        i = j;
        continue;
      }
    }
    const ByteClass c = cls(i);
    size_t j = i;
    while (j < n && cls(j) == c) ++j;
    emit(start, j);
    i = j;
  }
  return pieces;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Parse(std::string_view json_text,
                                                                  const std::string& source,
                                                                  int64_t vocab_size,
                                                                  int64_t eos_token_id) {
  // Before parsing: the parser's own message would quote the invalid bytes raw.
  if (absl::Status utf8 = CheckJsonUtf8(json_text, source); !utf8.ok()) return utf8;
  json doc;
  try {
    doc = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return Invalid(source, absl::StrCat("not valid JSON: ", EscapeInvalidUtf8(e.what())));
  }
  if (!doc.is_object()) return Invalid(source, "expected a JSON object");
  if (!doc.contains("format") || doc["format"] != kFormat) {
    return Invalid(source, absl::StrCat("field \"format\" must be \"", kFormat, "\", got ",
                                        doc.value("format", json()).dump()));
  }
  if (!doc.contains("max_piece_bytes") || !doc["max_piece_bytes"].is_number_integer() ||
      doc["max_piece_bytes"].get<int64_t>() < 1 ||
      doc["max_piece_bytes"].get<int64_t>() > kMaxPieceBytesLimit) {
    return Invalid(source, absl::StrCat("field \"max_piece_bytes\" must be an integer in [1, ",
                                        kMaxPieceBytesLimit, "], got ",
                                        doc.value("max_piece_bytes", json()).dump()));
  }
  if (!doc.contains("merges") || !doc["merges"].is_array()) {
    return Invalid(source, "field \"merges\" must be a list of [left, right] id pairs");
  }
  const json& merges = doc["merges"];
  const int64_t defined = 256 + static_cast<int64_t>(merges.size());
  if (vocab_size != defined + 1) {
    return Invalid(source, absl::StrCat("256 bytes + ", merges.size(),
                                        " merges + end-of-text make a vocabulary of ", defined + 1,
                                        " ids, but config.json says vocab_size ", vocab_size));
  }
  if (eos_token_id != defined) {
    return Invalid(source, absl::StrCat("the end-of-text id is ", defined,
                                        " (after the merges), but config.json says "
                                        "tokenizer.eos_token_id ",
                                        eos_token_id));
  }
  const json specials = doc.value("special_tokens", json::object());
  if (!specials.is_object() || !specials.contains(kEndOfText) ||
      !specials[kEndOfText].is_number_integer() || specials[kEndOfText].get<int64_t>() != defined) {
    return Invalid(source, absl::StrCat("field \"special_tokens\" must map \"", kEndOfText,
                                        "\" to ", defined, ", got ", specials.dump()));
  }

  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer(vocab_size, eos_token_id));
  tok->max_piece_bytes_ = doc["max_piece_bytes"].get<int64_t>();
  tok->vocab_.reserve(static_cast<size_t>(defined));
  for (int b = 0; b < 256; ++b) tok->vocab_.emplace_back(1, static_cast<char>(b));
  tok->rank_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    const int64_t next_id = 256 + static_cast<int64_t>(r);
    if (!m.is_array() || m.size() != 2 || !m[0].is_number_integer() || !m[1].is_number_integer()) {
      return Invalid(source, absl::StrCat("merge ", r, " must be a [left, right] pair of ids, got ",
                                          m.dump()));
    }
    const int64_t left = m[0].get<int64_t>(), right = m[1].get<int64_t>();
    if (left < 0 || left >= next_id || right < 0 || right >= next_id) {
      return Invalid(source, absl::StrCat("merge ", r, " [", left, ", ", right,
                                          "] refers to an id outside [0, ", next_id,
                                          "): a merge may only use bytes and earlier merges"));
    }
    const auto [it, inserted] = tok->rank_.emplace(
        PairKey(static_cast<int32_t>(left), static_cast<int32_t>(right)), static_cast<int32_t>(r));
    if (!inserted) {
      return Invalid(source, absl::StrCat("merge ", r, " [", left, ", ", right, "] repeats merge ",
                                          it->second));
    }
    // No piece is longer than max_piece_bytes, so no longer token can ever be produced; refusing
    // it also keeps a small file from doubling a token's bytes merge after merge.
    const size_t joined = tok->vocab_[static_cast<size_t>(left)].size() +
                          tok->vocab_[static_cast<size_t>(right)].size();
    if (joined > static_cast<size_t>(tok->max_piece_bytes_)) {
      return Invalid(
          source, absl::StrCat("merge ", r, " [", left, ", ", right, "] makes a token of ", joined,
                               " bytes, longer than max_piece_bytes ", tok->max_piece_bytes_));
    }
    tok->vocab_.push_back(tok->vocab_[static_cast<size_t>(left)] +
                          tok->vocab_[static_cast<size_t>(right)]);
  }
  return tok;
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  for (const unsigned char b : piece) ids.push_back(b);
  while (ids.size() > 1) {
    // The adjacent pair with the lowest rank ...
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t first = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto it = rank_.find(PairKey(ids[i], ids[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second, first = i;
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    // ... replaced everywhere, left to right without overlaps.
    const int32_t left = ids[first], right = ids[first + 1];
    size_t w = first;
    for (size_t i = first; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && ids[i] == left && ids[i + 1] == right) {
        ids[w++] = 256 + best;
        ++i;
      } else {
        ids[w++] = ids[i];
      }
    }
    ids.resize(w);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const std::string_view piece : PreTokenize(text, max_piece_bytes_)) EncodePiece(piece, &ids);
  return ids;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_.size()) return {};
  return vocab_[static_cast<size_t>(id)];
}

}  // namespace tost::model
