// Structured server logs on stderr: one line per event, either human-readable text
//   2026-11-21T22:30:01.123456Z INFO rpc rpc=Classify code=OK duration_ms=1.92 request_id=5f0c...
// or, with --log_format=json, one JSON object per line (log shippers parse it without patterns)
//   {"ts":"2026-11-21T22:30:01.123456Z","level":"info","msg":"rpc","rpc":"Classify","code":"OK",...}
// Lines are written whole under a lock, so concurrent events never interleave, from any thread.
// Every string of a line (message, keys, values) goes through EscapeForLog: whatever bytes a client
// sends, a line stays one line of valid UTF-8 without control characters, and a JSON line parses.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tost::service {

enum class LogFormat { kText, kJson };
// kDebug: only gRPC core's lines with GRPC_VERBOSITY=DEBUG (observability/grpc_log_bridge.h).
enum class LogLevel { kDebug, kInfo, kWarning, kError };

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

// `bytes` as they appear inside a quoted string of a `format` line (without the quotes): `"` and
// `\` backslashed; \n, \r, \t and the other C0 controls and DEL as \n, \r, \t, \xNN (text) or
// \u00NN (JSON); C1 controls, U+2028/U+2029 and the bidirectional controls (which move or break a
// line on display) as \uNNNN; bytes that are not UTF-8 as \xNN (text) or \ufffd (JSON, which must
// be UTF-8). Everything else (printable ASCII, other valid UTF-8) is copied.
std::string EscapeForLog(std::string_view bytes, LogFormat format);

// Formats one event as a line (without the newline) in `format`; what Log() writes. In text, the
// message and each value are bare where a reader cannot mistake where they end (printable ASCII
// without quotes, '=' or backslashes; values also without spaces), else quoted and escaped.
std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view message,
                          std::initializer_list<LogField> fields);
std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view message,
                          absl::Span<const LogField> fields);
void Log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields = {});
// For a line whose fields depend on the event (optional ones appended to a vector).
void Log(LogLevel level, std::string_view message, absl::Span<const LogField> fields);

// A request id for a call that did not bring a usable one: 16 random hex digits. Not a secret.
std::string NewRequestId();
// A client-supplied x-request-id is kept if it is 1..64 characters of [A-Za-z0-9._:-]; anything
// else (which could forge log fields or bloat lines) is replaced by a new id.
bool IsValidRequestId(std::string_view id);

}  // namespace tost::service
