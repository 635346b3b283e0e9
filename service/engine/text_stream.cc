#include "service/engine/text_stream.h"

#include <algorithm>

namespace tost::service {

TextStream::TextStream(std::vector<std::string> stop_strings, std::string utf8_pending,
                       std::string held)
    : stop_strings_(std::move(stop_strings)), held_(std::move(held)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
  utf8_.Push(utf8_pending);  // incomplete bytes only: nothing is released
}

TextStream::Output TextStream::Push(std::string_view token_bytes) {
  Output out;
  held_ += utf8_.Push(token_bytes);
  // The earliest complete stop string ends the text there.
  size_t stop_at = std::string::npos;
  for (const auto& s : stop_strings_) stop_at = std::min(stop_at, held_.find(s));
  if (stop_at != std::string::npos) {
    out.text = held_.substr(0, stop_at);
    out.stop_matched = true;
    held_.clear();
    return out;
  }
  // Withhold the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stop_strings_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out + utf8_.Flush();
}

}  // namespace tost::service
