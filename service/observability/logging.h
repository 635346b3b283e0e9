// Structured server logs on stderr: one line per event, either human-readable text
//   2026-11-21T22:30:01.123456Z INFO rpc rpc=Classify code=OK duration_ms=1.92 request_id=5f0c...
// or, with --log_format=json, one JSON object per line (log shippers parse it without patterns)
//   {"ts":"2026-11-21T22:30:01.123456Z","level":"info","msg":"rpc","rpc":"Classify","code":"OK",...}
// Lines are written whole under a lock, so concurrent events never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tost::service {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// "text" or "json"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);
// Process-wide; text until set. Set it once at startup, before the server's threads start.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();

// One key=value of an event. Integers, floating point, booleans and strings keep their JSON type.
struct LogField {
  template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) LogField(std::string_view k, T v)
      : key(k), value(static_cast<int64_t>(v)) {}
  LogField(std::string_view k, bool v) : key(k), value(v) {}
  LogField(std::string_view k, double v) : key(k), value(v) {}
  LogField(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
#ifndef ABSL_USES_STD_STRING_VIEW  // Debian's Abseil: absl::string_view is its own type
                                   // (Status::message)
  LogField(std::string_view k, absl::string_view v) : key(k), value(std::string(v)) {}
#endif

  std::string_view key;
  std::variant<std::string, int64_t, double, bool> value;
};

// Formats one event as a line (without the newline) in `format`; what Log() writes.
std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view message,
                          std::initializer_list<LogField> fields);
void Log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields = {});

// A request id for a call that did not bring a usable one: 16 random hex digits. Not a secret.
std::string NewRequestId();
// A client-supplied x-request-id is kept if it is 1..64 characters of [A-Za-z0-9._:-]; anything
// else (which could forge log fields or bloat lines) is replaced by a new id.
bool IsValidRequestId(std::string_view id);

}  // namespace tost::service
