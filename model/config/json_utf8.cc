#include "model/config/json_utf8.h"

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/utf8.h"

namespace tost::model {
namespace {

using nlohmann::json;

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
    if (path.size() > 128) {
      // Cut at a character boundary: the path is UTF-8 (keys passed the check), and half a
      // character would make the message itself invalid UTF-8.
      size_t cut = 128;
      while (cut > 0 && (static_cast<unsigned char>(path[cut]) & 0xC0) == 0x80) --cut;
      path = path.substr(0, cut) + "...";
    }
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
