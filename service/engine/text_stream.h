// Turns generated token bytes into text a client may see: complete UTF-8 characters only, and
// nothing that could still turn out to be the start of a stop string. Its whole state (incomplete
// character bytes + withheld text) is plain data, so it travels with an exported session.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/text/tokenizer.h"

namespace tost::service {

class TextStream {
 public:
  struct Output {
    std::string text;           // releasable now
    bool stop_matched = false;  // a stop string completed; `text` ends before it
  };

  explicit TextStream(std::vector<std::string> stop_strings, std::string utf8_pending = {},
                      std::string held = {});

  Output Push(std::string_view token_bytes);
  // At the end of a one-shot generation: releases withheld text, and an incomplete character as
  // U+FFFD. A session that will continue does not flush: its pending bytes and withheld text are
  // part of its state, so a stop string may still complete in the next call.
  std::string Flush();

  const std::string& utf8_pending() const { return utf8_.pending(); }
  const std::string& held() const { return held_; }
  const std::vector<std::string>& stop_strings() const { return stop_strings_; }

 private:
  std::vector<std::string> stop_strings_;
  model::Utf8Assembler utf8_;
  std::string held_;
};

}  // namespace tost::service
