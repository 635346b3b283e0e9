// The tool calls of a chat reply read as the reply is generated, so that a stream sends them in
// OpenAI's deltas while the model writes them: the text before the template's call marker as
// content (with "auto"; text that may be the start of the marker is held until it is decided),
// each call's start once its name is read (a function the request offers), and its arguments in
// fragments as they come. The calls' JSON (an array of {"name", "arguments"}, or one such object)
// is scanned one character at a time without being parsed whole; the arguments are passed on as
// the model wrote them without the whitespace between JSON tokens (inside strings kept), which is
// also the form the unstreamed reply gives (ParseToolCalls), so both assemble to the same text.
//
// What can be taken back is never sent: a reply that turns out to hold no call (no marker, JSON
// that does not read as calls, a name the request did not offer, a cut before the first call's
// name) goes out as content when it ends, exactly as the unstreamed reply's content. Once a call
// has started, what follows is its: a call cut by max_tokens is streamed as far as it came (the
// unstreamed reply keeps only the complete calls), and JSON that breaks after a call started ends
// the calls there.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "service/openai/request.h"

namespace tost::service::openai {

struct ToolCallDelta {
  enum class Kind { kContent, kCallStart, kArguments };
  Kind kind = Kind::kContent;
  size_t call = 0;   // kCallStart, kArguments: the call's index in the reply
  std::string text;  // kContent: text; kCallStart: the function's name; kArguments: a fragment
};

class ToolCallStream {
 public:
  // `request` (its tools and a tool_choice other than "none") outlives the stream. With "auto" the
  // calls follow `call_begin` (none without one); with "required" or a named function the whole
  // reply is the calls.
  ToolCallStream(const OpenAiRequest& request, std::string call_begin);

  // The deltas that `text` (the next released text of the reply) decides.
  std::vector<ToolCallDelta> Push(std::string_view text);
  // The reply ended: the held text, as content when no call started.
  std::vector<ToolCallDelta> Finish();

  size_t calls_started() const { return started_; }
  // The arguments of each call whose object closed, in order, as streamed.
  const std::vector<std::string>& complete_arguments() const { return complete_; }

 private:
  enum class State {
    kStart,       // before the calls' '[' or '{'
    kItemOrEnd,   // in the array: a call's '{' or ']'
    kNextOrEnd,   // after a call: ',' or ']'
    kKeyOrEnd,    // in a call: a key's '"' or '}'
    kKey,         // inside a key
    kColon,       // after a key
    kValue,       // inside a value (and before its first character)
    kAfterValue,  // ',' or '}'
    kDone,        // the calls ended; what follows is ignored
    kBroken,      // not calls: no more deltas
  };
  enum class Target { kName, kArguments, kOther };

  void ScanCalls(std::string_view text, std::vector<ToolCallDelta>& out);
  void Scan(char c, std::vector<ToolCallDelta>& out);
  void ScanValue(char c, std::vector<ToolCallDelta>& out);
  void BeginObject();
  void EndObject();
  void EndValue(std::vector<ToolCallDelta>& out);
  void ValueChar(char c, std::vector<ToolCallDelta>& out);
  void Break() { state_ = State::kBroken; }
  static void Append(std::vector<ToolCallDelta>& out, ToolCallDelta::Kind kind, size_t call,
                     std::string_view text);

  const OpenAiRequest& request_;
  const std::string call_begin_;  // auto's marker (empty: no calls); else empty
  bool in_calls_ = false;         // past the marker (or from the start)
  std::string held_;              // auto, before the marker: text that may begin it
  std::string raw_;               // the calls' text as received (content if no call starts)

  State state_ = State::kStart;
  bool array_ = false;
  size_t objects_ = 0;  // call objects begun
  std::string key_;
  bool key_escaped_ = false;
  Target target_ = Target::kOther;
  // The value being read: nesting, inside a string (after a backslash), a bare scalar begun.
  int depth_ = 0;
  bool value_started_ = false, in_string_ = false, escaped_ = false, scalar_ = false;
  std::string name_raw_;  // the "name" value's JSON text
  // The current call: its name read (and started), its arguments so far and whether they ended.
  bool named_ = false;
  std::string arguments_;
  size_t arguments_sent_ = 0;  // of arguments_, the bytes already in deltas
  bool arguments_done_ = false;
  size_t started_ = 0;
  std::vector<std::string> complete_;
};

}  // namespace tost::service::openai
