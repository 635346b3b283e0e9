#include "model/text/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/config/json_utf8.h"

namespace tost::model {
namespace {

using json = nlohmann::json;

constexpr char kEndOfText[] = "<|endoftext|>";

// GPT-2's pre-tokenisation pattern. \s and \S are spelled out as Unicode's White_Space property,
// which is what tiktoken's and Hugging Face's regex engines mean by \s (PCRE2's own \s leaves out
// U+0085).
constexpr char kWhite[] =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string PatternText() {
  const std::string s = absl::StrCat("[", kWhite, "]");
  const std::string not_s = absl::StrCat("[^", kWhite, "]");
  return absl::StrCat(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)", kWhite,
                      R"(\p{L}\p{N}]+|)", s, "+(?!", not_s, ")|", s, "+");
}

// This Abseil's string_view is its own type, not std::string_view.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Invalid(const std::string& source, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", AsAbsl(what)));
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// GPT-2's bytes_to_unicode(): every byte is written as one printable code point, the printable
// Latin-1 bytes as themselves and the others as U+0100 onwards, in byte order.
std::vector<char32_t> ByteToCodePoint() {
  std::vector<char32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? static_cast<char32_t>(b) : next++;
  return cp;
}

// A token as encoder.json and vocab.bpe write it (UTF-8 of bytes_to_unicode code points) back to
// its bytes; false for text that is not such a token.
bool DecodeTokenText(std::string_view text, std::string* bytes) {
  static const absl::flat_hash_map<char32_t, char>* const byte_of = [] {
    auto* m = new absl::flat_hash_map<char32_t, char>();
    const std::vector<char32_t> cp = ByteToCodePoint();
    for (int b = 0; b < 256; ++b) (*m)[cp[b]] = static_cast<char>(b);
    return m;
  }();
  bytes->clear();
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    char32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // bytes_to_unicode never leaves U+0000..U+0143
    }
    const auto it = byte_of->find(cp);
    if (it == byte_of->end()) return false;
    bytes->push_back(it->second);
  }
  return !bytes->empty();
}

}  // namespace

class Gpt2Tokenizer::Pattern {
 public:
  static absl::StatusOr<std::unique_ptr<Pattern>> Compile() {
    const std::string text = PatternText();
    int error = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("GPT-2 pre-tokenisation pattern at offset ", at, ": ",
                                              reinterpret_cast<const char*>(message)));
    }
    // JIT is an optimisation only: without it (e.g. no executable memory) matching still works.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<Pattern>(new Pattern(code));
  }
  ~Pattern() { pcre2_code_free(code_); }

  void Split(std::string_view text, std::vector<std::string_view>* out) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t done = 0;  // text before this is in `out`
    while (done < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), done, 0, match, nullptr);
      if (rc < 0) break;  // no further match: what is left is not valid UTF-8
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
      if (span[1] <= span[0]) break;  // the pattern cannot match empty; never loop on it
      // Bytes the pattern skipped are not valid UTF-8: they form a piece of their own.
      if (span[0] > done) out->push_back(text.substr(done, span[0] - done));
      out->push_back(text.substr(span[0], span[1] - span[0]));
      done = span[1];
    }
    if (done < text.size()) out->push_back(text.substr(done));
    pcre2_match_data_free(match);
  }

 private:
  explicit Pattern(pcre2_code* code) : code_(code) {}
  pcre2_code* const code_;
};

Gpt2Tokenizer::Gpt2Tokenizer(int64_t vocab_size, int64_t eos_token_id,
                             std::unique_ptr<Pattern> pattern)
    : Tokenizer(vocab_size, eos_token_id), pattern_(std::move(pattern)) {}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Make(int64_t vocab_size,
                                                                   int64_t eos_token_id) {
  absl::StatusOr<std::unique_ptr<Pattern>> pattern = Pattern::Compile();
  if (!pattern.ok()) return pattern.status();
  std::unique_ptr<Gpt2Tokenizer> tok(
      new Gpt2Tokenizer(vocab_size, eos_token_id, *std::move(pattern)));
  tok->bytes_of_.resize(static_cast<size_t>(vocab_size));
  tok->byte_id_.assign(256, -1);
  return tok;
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::FromEncoderAndMerges(
    std::string_view encoder_json, const std::string& encoder_source, std::string_view merges_text,
    const std::string& merges_source, int64_t eos_token_id) {
  if (absl::Status utf8 = CheckJsonUtf8(encoder_json, encoder_source); !utf8.ok()) return utf8;
  const json encoder = json::parse(encoder_json, nullptr, /*allow_exceptions=*/false);
  if (!encoder.is_object() || encoder.empty()) {
    return Invalid(encoder_source, "must be a JSON object mapping GPT-2 token text to ids");
  }
  const auto n = static_cast<int64_t>(encoder.size());
  if (n > (int64_t{1} << 30)) return Invalid(encoder_source, "holds too many tokens");
  if (!encoder.contains(kEndOfText) || !encoder[kEndOfText].is_number_integer() ||
      encoder[kEndOfText].get<int64_t>() != eos_token_id) {
    return Invalid(encoder_source,
                   absl::StrCat("must give \"", kEndOfText, "\" the id ", eos_token_id,
                                " (config.json tokenizer.eos_token_id), got ",
                                encoder.value(kEndOfText, json()).dump()));
  }
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> made = Make(n, eos_token_id);
  if (!made.ok()) return made.status();
  std::unique_ptr<Gpt2Tokenizer> tok = *std::move(made);
  std::vector<bool> seen(static_cast<size_t>(n), false);
  std::string bytes;
  for (const auto& [text, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= n) {
      return Invalid(encoder_source,
                     absl::StrCat("token \"", absl::CEscape(text.substr(0, 64)), "\" has id ",
                                  value.dump(), ", not in [0, ", n, ")"));
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (seen[static_cast<size_t>(id)]) {
      return Invalid(encoder_source, absl::StrCat("id ", id, " is given to two tokens"));
    }
    seen[static_cast<size_t>(id)] = true;
    if (text == kEndOfText) continue;  // special: its bytes are never produced by text
    if (!DecodeTokenText(text, &bytes)) {
      return Invalid(encoder_source,
                     absl::StrCat("token \"", absl::CEscape(text.substr(0, 64)), "\" (id ", id,
                                  ") is not written in GPT-2's bytes-to-unicode alphabet"));
    }
    if (!tok->id_of_.emplace(bytes, id).second) {
      return Invalid(encoder_source, absl::StrCat("token \"", absl::CEscape(text.substr(0, 64)),
                                                  "\" (id ", id, ") repeats another token"));
    }
    if (bytes.size() == 1) tok->byte_id_[static_cast<unsigned char>(bytes[0])] = id;
    tok->bytes_of_[static_cast<size_t>(id)] = bytes;
  }
  for (int b = 0; b < 256; ++b) {
    if (tok->byte_id_[b] < 0) {
      return Invalid(encoder_source,
                     absl::StrCat("has no token for the byte ", b, ": every byte must encode"));
    }
  }

  int32_t rank = 0;
  int64_t line_number = 0;
  std::string left, right;
  for (absl::string_view line : absl::StrSplit(AsAbsl(merges_text), '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && absl::StartsWith(line, "#version"))) continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 ||
        !DecodeTokenText(std::string_view(parts[0].data(), parts[0].size()), &left) ||
        !DecodeTokenText(std::string_view(parts[1].data(), parts[1].size()), &right)) {
      return Invalid(merges_source,
                     absl::StrCat("line ", line_number, " must be two GPT-2 tokens separated by a ",
                                  "space, got \"", absl::CEscape(line.substr(0, 64)), "\""));
    }
    const auto l = tok->id_of_.find(left), r = tok->id_of_.find(right),
               joined = tok->id_of_.find(left + right);
    if (l == tok->id_of_.end() || r == tok->id_of_.end() || joined == tok->id_of_.end()) {
      return Invalid(merges_source,
                     absl::StrCat("line ", line_number, " merges \"", absl::CEscape(line),
                                  "\", but ", encoder_source, " lacks ",
                                  l == tok->id_of_.end()   ? "its left token"
                                  : r == tok->id_of_.end() ? "its right token"
                                                           : "the merged token"));
    }
    // The first listing of a pair wins, as in GPT-2's own encoder.
    tok->merges_.emplace(PairKey(l->second, r->second), Merged{rank, joined->second});
    ++rank;
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::FromRanks(std::string_view ranks_text,
                                                                        const std::string& source,
                                                                        int64_t eos_token_id) {
  std::vector<std::pair<std::string, int64_t>> entries;
  int64_t line_number = 0;
  int64_t max_rank = -1;
  std::string bytes;
  for (absl::string_view line : absl::StrSplit(AsAbsl(ranks_text), '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    int64_t rank = -1;
    if (parts.size() != 2 || !absl::Base64Unescape(parts[0], &bytes) || bytes.empty() ||
        !absl::SimpleAtoi(parts[1], &rank) || rank < 0 || rank >= (int64_t{1} << 30)) {
      return Invalid(source, absl::StrCat("line ", line_number,
                                          " must be \"<base64 token bytes> <rank>\", got \"",
                                          absl::CEscape(line.substr(0, 64)), "\""));
    }
    max_rank = std::max(max_rank, rank);
    entries.emplace_back(bytes, rank);
  }
  const int64_t n = max_rank + 1;
  if (static_cast<int64_t>(entries.size()) != n) {
    return Invalid(source, absl::StrCat(entries.size(), " tokens with ranks up to ", max_rank,
                                        ": the ranks must be 0 .. n-1, each once"));
  }
  if (eos_token_id < n) {
    return Invalid(source, absl::StrCat("config.json tokenizer.eos_token_id ", eos_token_id,
                                        " is a rank of this file (0 .. ", n - 1,
                                        "); end of text must be a special id after them"));
  }
  absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> made = Make(eos_token_id + 1, eos_token_id);
  if (!made.ok()) return made.status();
  std::unique_ptr<Gpt2Tokenizer> tok = *std::move(made);
  tok->rank_by_concatenation_ = true;
  for (auto& [token, rank] : entries) {
    const auto id = static_cast<int32_t>(rank);
    if (!tok->bytes_of_[static_cast<size_t>(id)].empty()) {
      return Invalid(source, absl::StrCat("rank ", rank, " is given to two tokens"));
    }
    if (!tok->id_of_.emplace(token, id).second) {
      return Invalid(source, absl::StrCat("token with rank ", rank, " repeats another token"));
    }
    if (token.size() == 1) tok->byte_id_[static_cast<unsigned char>(token[0])] = id;
    tok->bytes_of_[static_cast<size_t>(id)] = std::move(token);
  }
  for (int b = 0; b < 256; ++b) {
    if (tok->byte_id_[b] < 0) {
      return Invalid(source,
                     absl::StrCat("has no token for the byte ", b, ": every byte must encode"));
    }
  }
  return tok;
}

Gpt2Tokenizer::Merged Gpt2Tokenizer::Merge(int32_t left, int32_t right) const {
  if (rank_by_concatenation_) {
    const auto it =
        id_of_.find(bytes_of_[static_cast<size_t>(left)] + bytes_of_[static_cast<size_t>(right)]);
    return it == id_of_.end() ? Merged{} : Merged{it->second, it->second};
  }
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? Merged{} : it->second;
}

void Gpt2Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  // One node per byte to start with, linked both ways; a merge folds the right node into the
  // left. Candidate merges wait in a heap ordered by (rank, position): the lowest rank first and,
  // among equal ranks, the leftmost, which is GPT-2's left-to-right merging of a pair.
  const size_t n = piece.size();
  std::vector<int32_t> id(n), next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // (rank, left node, left version, right node, right version)
  using Candidate = std::tuple<int32_t, int32_t, uint32_t, int32_t, uint32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t l) {
    if (l < 0 || next[l] < 0) return;
    const int32_t r = next[l];
    const Merged m = Merge(id[l], id[r]);
    if (m.rank >= 0) heap.emplace(m.rank, l, version[l], r, version[r]);
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const auto [rank, l, lv, r, rv] = heap.top();
    heap.pop();
    // Stale: one side has merged since (its version moved) or is gone.
    if (!alive[l] || !alive[r] || version[l] != lv || version[r] != rv || next[l] != r) continue;
    id[l] = Merge(id[l], id[r]).id;
    ++version[l];
    alive[r] = false;
    next[l] = next[r];
    if (next[r] >= 0) prev[next[r]] = l;
    consider(prev[l]);
    consider(l);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out->push_back(id[i]);
}

std::vector<std::string_view> Gpt2Tokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  pattern_->Split(text, &pieces);
  return pieces;
}

std::vector<int32_t> Gpt2Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const std::string_view piece : PreTokenize(text)) EncodePiece(piece, &ids);
  return ids;
}

std::string Gpt2Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= bytes_of_.size()) return {};
  return bytes_of_[static_cast<size_t>(id)];
}

}  // namespace tost::model
