#include "service/openai/tool_call_stream.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace tost::service::openai {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The longest end of `text` that is a proper prefix of `marker`: text that may begin it.
size_t MarkerPrefixAtEnd(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ToolCallStream::ToolCallStream(const OpenAiRequest& request, std::string call_begin)
    : request_(request),
      call_begin_(request.tool_choice == ToolChoice::kAuto ? std::move(call_begin) : ""),
      in_calls_(request.tool_choice != ToolChoice::kAuto) {}

void ToolCallStream::Append(std::vector<ToolCallDelta>& out, ToolCallDelta::Kind kind, size_t call,
                            std::string_view text) {
  if (text.empty() && kind != ToolCallDelta::Kind::kCallStart) return;
  if (!out.empty() && out.back().kind == kind && kind != ToolCallDelta::Kind::kCallStart &&
      out.back().call == call) {
    out.back().text.append(text);
    return;
  }
  out.push_back({kind, call, std::string(text)});
}

std::vector<ToolCallDelta> ToolCallStream::Push(std::string_view text) {
  std::vector<ToolCallDelta> out;
  if (in_calls_) {
    ScanCalls(text, out);
    return out;
  }
  if (call_begin_.empty()) {  // "auto" without a marker: nothing is a call
    Append(out, ToolCallDelta::Kind::kContent, 0, text);
    return out;
  }
  held_.append(text);
  if (const size_t at = held_.find(call_begin_); at != std::string::npos) {
    Append(out, ToolCallDelta::Kind::kContent, 0, std::string_view(held_).substr(0, at));
    const std::string rest = held_.substr(at + call_begin_.size());
    held_.clear();
    in_calls_ = true;
    ScanCalls(rest, out);
    return out;
  }
  const size_t keep = MarkerPrefixAtEnd(held_, call_begin_);
  Append(out, ToolCallDelta::Kind::kContent, 0,
         std::string_view(held_).substr(0, held_.size() - keep));
  held_.erase(0, held_.size() - keep);
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::Finish() {
  std::vector<ToolCallDelta> out;
  if (!in_calls_) {
    Append(out, ToolCallDelta::Kind::kContent, 0, held_);
    held_.clear();
  } else if (started_ == 0) {
    // No call: the marker and what followed it are content, as in the unstreamed reply.
    Append(out, ToolCallDelta::Kind::kContent, 0, call_begin_ + raw_);
  }
  return out;
}

void ToolCallStream::ScanCalls(std::string_view text, std::vector<ToolCallDelta>& out) {
  if (started_ == 0) raw_.append(text);  // content if no call starts
  for (char c : text) {
    if (state_ == State::kDone || state_ == State::kBroken) return;
    Scan(c, out);
  }
}

void ToolCallStream::Scan(char c, std::vector<ToolCallDelta>& out) {
  switch (state_) {
    case State::kStart:
      if (IsSpace(c)) return;
      if (c == '[') {
        array_ = true;
        state_ = State::kItemOrEnd;
      } else if (c == '{') {
        BeginObject();
      } else {
        Break();
      }
      return;
    case State::kItemOrEnd:
      if (IsSpace(c)) return;
      if (c == '{') return BeginObject();
      if (c == ']') {
        state_ = State::kDone;
        return;
      }
      return Break();
    case State::kNextOrEnd:
      if (IsSpace(c)) return;
      if (c == ',') {
        state_ = State::kItemOrEnd;
      } else if (c == ']') {
        state_ = State::kDone;
      } else {
        Break();
      }
      return;
    case State::kKeyOrEnd:
      if (IsSpace(c)) return;
      if (c == '"') {
        key_.clear();
        key_escaped_ = false;
        state_ = State::kKey;
        return;
      }
      if (c == '}') return EndObject();
      return Break();
    case State::kKey:
      if (key_escaped_) {
        key_escaped_ = false;
      } else if (c == '\\') {
        key_escaped_ = true;
      } else if (c == '"') {
        state_ = State::kColon;
        return;
      }
      key_ += c;
      return;
    case State::kColon:
      if (IsSpace(c)) return;
      if (c != ':') return Break();
      target_ = key_ == "name"        ? Target::kName
                : key_ == "arguments" ? Target::kArguments
                                      : Target::kOther;
      if ((target_ == Target::kName && !name_raw_.empty()) ||
          (target_ == Target::kArguments && !arguments_.empty())) {
        return Break();  // a key twice: not a call the unstreamed reply reads either
      }
      depth_ = 0;
      value_started_ = in_string_ = escaped_ = scalar_ = false;
      state_ = State::kValue;
      return;
    case State::kValue:
      return ScanValue(c, out);
    case State::kAfterValue:
      if (IsSpace(c)) return;
      if (c == ',') {
        state_ = State::kKeyOrEnd;
      } else if (c == '}') {
        EndObject();
      } else {
        Break();
      }
      return;
    case State::kDone:
    case State::kBroken:
      return;
  }
}

// One character of a value, which is copied without the whitespace between its JSON tokens. A
// string or a container ends with its closing character; a bare scalar (a number, true, false,
// null) with the first character past it, which then belongs to the call's object.
void ToolCallStream::ScanValue(char c, std::vector<ToolCallDelta>& out) {
  if (!value_started_) {
    if (IsSpace(c)) return;
    value_started_ = true;
  }
  if (in_string_) {
    ValueChar(c, out);
    if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (depth_ == 0) EndValue(out);
    }
    return;
  }
  if (IsSpace(c)) {
    if (scalar_ && depth_ == 0) EndValue(out);
    return;
  }
  if ((c == ']' || c == '}' || c == ',') && depth_ == 0) {
    if (!scalar_) return Break();  // a value that never began
    EndValue(out);
    return Scan(c, out);  // the object's own ',' or '}'
  }
  ValueChar(c, out);
  if (c == '"') {
    in_string_ = true;
  } else if (c == '[' || c == '{') {
    ++depth_;
  } else if (c == ']' || c == '}') {
    if (--depth_ == 0) EndValue(out);
  } else if (depth_ == 0) {
    scalar_ = true;
  }
}

void ToolCallStream::ValueChar(char c, std::vector<ToolCallDelta>& out) {
  if (target_ == Target::kName) {
    name_raw_ += c;
  } else if (target_ == Target::kArguments) {
    arguments_ += c;
    if (named_) {
      Append(out, ToolCallDelta::Kind::kArguments, objects_ - 1,
             std::string_view(arguments_).substr(arguments_sent_));
      arguments_sent_ = arguments_.size();
    }
  }
}

void ToolCallStream::EndValue(std::vector<ToolCallDelta>& out) {
  state_ = State::kAfterValue;
  if (target_ == Target::kArguments) {
    arguments_done_ = true;
    return;
  }
  if (target_ != Target::kName) return;
  const nlohmann::json name = nlohmann::json::parse(name_raw_, nullptr, /*allow_exceptions=*/false);
  const auto offered = [&](const ToolFunction& f) {
    return f.name == name.get_ref<const std::string&>();
  };
  if (!name.is_string() || std::none_of(request_.tools.begin(), request_.tools.end(), offered)) {
    return Break();  // not a function the request offers: the unstreamed reply has no calls
  }
  named_ = true;
  ++started_;
  Append(out, ToolCallDelta::Kind::kCallStart, objects_ - 1, name.get<std::string>());
  // Arguments written before the name go out now.
  Append(out, ToolCallDelta::Kind::kArguments, objects_ - 1, arguments_);
  arguments_sent_ = arguments_.size();
}

void ToolCallStream::BeginObject() {
  ++objects_;
  name_raw_.clear();
  named_ = false;
  arguments_.clear();
  arguments_sent_ = 0;
  arguments_done_ = false;
  state_ = State::kKeyOrEnd;
}

void ToolCallStream::EndObject() {
  // Not a call without both, or with arguments that are not JSON (only their brackets and strings
  // were followed on the way).
  if (!named_ || !arguments_done_ || !nlohmann::json::accept(arguments_)) return Break();
  complete_.push_back(arguments_);
  state_ = array_ ? State::kNextOrEnd : State::kDone;
}

}  // namespace tost::service::openai
