#include "base/utf8.h"

#include "absl/strings/str_format.h"

namespace tost::model {
namespace {

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

}  // namespace tost::model
