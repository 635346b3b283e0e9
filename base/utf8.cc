#include "base/utf8.h"

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tost::model {
namespace {

using nlohmann::json;

// Length of the valid UTF-8 sequence at text[i], or 0 when the byte there does not start one.
size_t ValidSequenceAt(std::string_view text, size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  const int len = Utf8SequenceLength(lead);
  if (len == 0 || i + static_cast<size_t>(len) > text.size()) return 0;
  for (int k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(text[i + k]);
    if (k == 1 ? !IsValidUtf8SecondByte(lead, c) : !IsUtf8Continuation(c)) return 0;
  }
  return static_cast<size_t>(len);
}

// Follows a SAX parse and keeps the path of the value being read, so that when the parser stops
// at an invalid byte the field holding it can be named.
class PathTracker final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({true, {}, 0, false});
    return true;
  }
  bool key(string_t& k) override {
    frames_.back().key = k;
    frames_.back().in_value = true;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return Value();
  }
  bool start_array(std::size_t) override {
    frames_.push_back({false, {}, 0, true});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return Value();
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception&) override {
    error_position_ = position;
    return false;
  }

  size_t error_position() const { return error_position_; }

  // Where the parser stopped: "the value of field \"lm.tokenizer.type\"", "a key of object
  // \"lm\"", ...
  std::string Where() const {
    if (frames_.empty()) return "the top-level value";
    std::string path;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      const bool last = i + 1 == frames_.size();
      if (last && f.object && !f.in_value) break;  // between members: reading a key
      if (f.object) {
        if (!path.empty()) path += '.';
        path += f.key;
      } else {
        absl::StrAppend(&path, "[", f.index, "]");
      }
    }
    if (path.size() > 128) path = path.substr(0, 128) + "...";
    const Frame& top = frames_.back();
    if (top.object && !top.in_value) {
      return path.empty() ? "a key of the top-level object"
                          : absl::StrCat("a key of object \"", absl::Utf8SafeCEscape(path), "\"");
    }
    return absl::StrCat("the value of field \"", absl::Utf8SafeCEscape(path), "\"");
  }

 private:
  struct Frame {
    bool object;
    std::string key;  // object: the member being read
    int64_t index;    // array: the element being read
    bool in_value;    // object: after a key, before its value ends
  };

  bool Value() {
    if (frames_.empty()) return true;
    Frame& f = frames_.back();
    if (f.object) {
      f.in_value = false;
    } else {
      ++f.index;
    }
    return true;
  }

  std::vector<Frame> frames_;
  size_t error_position_ = 0;
};

}  // namespace

int Utf8SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

bool IsUtf8Continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

bool IsValidUtf8SecondByte(unsigned char lead, unsigned char second) {
  if (lead == 0xE0) return second >= 0xA0 && second <= 0xBF;
  if (lead == 0xED) return second >= 0x80 && second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90 && second <= 0xBF;
  if (lead == 0xF4) return second >= 0x80 && second <= 0x8F;
  return IsUtf8Continuation(second);
}

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = ValidSequenceAt(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

std::string Utf8Prefix(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  // Back off continuation bytes to the start of the character the cut falls in, and drop it.
  while (end > 0 && IsUtf8Continuation(static_cast<unsigned char>(text[end]))) --end;
  return std::string(text.substr(0, end));
}

std::string EscapeInvalidUtf8(std::string_view text) {
  if (!FirstInvalidUtf8(text).has_value()) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  size_t i = 0;
  while (i < text.size()) {
    const size_t len = ValidSequenceAt(text, i);
    if (len == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

absl::Status WithUtf8Message(const absl::Status& status) {
  const std::string_view message(status.message().data(), status.message().size());
  if (status.ok() || !FirstInvalidUtf8(message).has_value()) return status;
  return absl::Status(status.code(), EscapeInvalidUtf8(message));
}

absl::Status CheckJsonUtf8(std::string_view text, const std::string& source) {
  const std::optional<size_t> bad = FirstInvalidUtf8(text);
  if (!bad.has_value()) return absl::OkStatus();
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < *bad; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  // The parser stops at the invalid byte (JSON text is UTF-8 throughout); if it stopped earlier,
  // at a syntax error, where it stopped says nothing about the byte.
  PathTracker tracker;
  json::sax_parse(text, &tracker);
  const std::string where = tracker.error_position() > *bad
                                ? absl::StrCat(" in ", tracker.Where())
                                : std::string(" (the JSON before it does not parse)");
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: invalid UTF-8 at byte offset %d (line %d, column %d)%s: expected UTF-8 text, found "
      "byte 0x%02x",
      EscapeInvalidUtf8(source), *bad, line, *bad - line_start + 1, where,
      static_cast<unsigned char>(text[*bad])));
}

}  // namespace tost::model
