#include "service/observability/logging.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/base/attributes.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tost::service {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};
ABSL_CONST_INIT absl::Mutex g_write_mu(absl::kConstInit);  // whole lines, never interleaved

const char* LevelName(LogLevel level, LogFormat format) {
  switch (level) {
    case LogLevel::kDebug:
      return format == LogFormat::kJson ? "debug" : "DEBUG";
    case LogLevel::kInfo:
      return format == LogFormat::kJson ? "info" : "INFO";
    case LogLevel::kWarning:
      return format == LogFormat::kJson ? "warning" : "WARN";
    case LogLevel::kError:
      return format == LogFormat::kJson ? "error" : "ERROR";
  }
  return "?";
}

// The length (2 to 4) of the well-formed UTF-8 sequence that starts `s` (whose first byte is not
// ASCII), with its code point in *cp; 0 when it is not one (a stray continuation byte, an overlong
// form, a surrogate, past U+10FFFF, or cut short).
size_t DecodeUtf8(std::string_view s, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range, narrower after some leads
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    if (lead == 0xe0) lo = 0xa0;  // overlong
    if (lead == 0xed) hi = 0x9f;  // surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    if (lead == 0xf0) lo = 0x90;  // overlong
    if (lead == 0xf4) hi = 0x8f;  // past U+10FFFF
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  char32_t c = lead & (0xff >> (n + 1));
  for (size_t i = 1; i < n; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    c = (c << 6) | (byte(i) & 0x3f);
  }
  *cp = c;
  return n;
}

// Valid characters that are escaped all the same: C1 controls (0x9b is a terminal's CSI), the line
// and paragraph separators (a new line in some viewers), and the bidirectional controls (they
// reorder what a reader sees of the rest of the line).
bool IsHiddenControl(char32_t c) {
  return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || c == 0x061c || c == 0x200e ||
         c == 0x200f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

void AppendEscaped(std::string& out, std::string_view bytes, LogFormat format) {
  const bool json = format == LogFormat::kJson;
  size_t i = 0;
  while (i < bytes.size()) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '"' || c == '\\') out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      ++i;
    } else if (c < 0x80) {  // the other C0 controls and DEL
      absl::StrAppend(&out, json ? "\\u00" : "\\x", absl::Hex(c, absl::kZeroPad2));
      ++i;
    } else if (char32_t cp = 0; const size_t n = DecodeUtf8(bytes.substr(i), &cp)) {
      if (IsHiddenControl(cp)) {
        absl::StrAppend(&out, "\\u", absl::Hex(static_cast<uint32_t>(cp), absl::kZeroPad4));
      } else {
        out.append(bytes.substr(i, n));
      }
      i += n;
    } else {  // not UTF-8: the byte's value in text; JSON strings are Unicode, so U+FFFD there
      if (json) {
        out += "\\ufffd";
      } else {
        absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      }
      ++i;
    }
  }
}

void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  AppendEscaped(out, s, LogFormat::kJson);
  out += '"';
}

// Shortest round-trip form, always with a fraction or exponent so readers keep it a float; JSON has
// no NaN or infinity, so those are null.
void AppendJsonDouble(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  const std::string_view digits(buf, ec == std::errc() ? end - buf : 0);
  out += digits;
  if (digits.find_first_of(".e") == std::string_view::npos) out += ".0";
}

// Text: a message or value is written bare when a reader cannot mistake where it ends (printable
// ASCII without quotes, '=' or backslashes; a value also without spaces), else quoted and escaped,
// so a client's string cannot forge a field or a line. A value is cut at kMaxTextValueBytes.
constexpr size_t kMaxTextValueBytes = 4096;

void AppendText(std::string& line, std::string_view s, bool is_value) {
  const std::string_view shown = is_value ? s.substr(0, kMaxTextValueBytes) : s;
  bool plain = !s.empty() && shown.size() == s.size();
  for (char ch : shown) {
    const unsigned char c = static_cast<unsigned char>(ch);
    plain = plain && c >= (is_value ? 0x21 : 0x20) && c < 0x7f && c != '"' && c != '=' && c != '\\';
  }
  if (plain) {
    line += s;
    return;
  }
  line += '"';
  AppendEscaped(line, shown, LogFormat::kText);
  line += '"';
  if (shown.size() < s.size()) absl::StrAppend(&line, "...(", s.size(), " bytes)");
}

}  // namespace

std::string EscapeForLog(std::string_view bytes, LogFormat format) {
  std::string out;
  AppendEscaped(out, bytes, format);
  return out;
}

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format must be \"text\" or \"json\", got \"", std::string(name), "\""));
}

void SetLogFormat(LogFormat format) { g_format.store(format, std::memory_order_relaxed); }
LogFormat GetLogFormat() { return g_format.load(std::memory_order_relaxed); }

std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view message,
                          std::initializer_list<LogField> fields) {
  return FormatLogLine(format, level, message,
                       absl::Span<const LogField>(fields.begin(), fields.size()));
}

std::string FormatLogLine(LogFormat format, LogLevel level, std::string_view message,
                          absl::Span<const LogField> fields) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
  std::string line;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", LevelName(level, format),
                    "\",\"msg\":");
    AppendJsonString(line, message);
    for (const LogField& f : fields) {
      line += ',';
      AppendJsonString(line, f.key);
      line += ':';
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>) {
              AppendJsonString(line, v);
            } else if constexpr (std::is_same_v<V, bool>) {
              line += v ? "true" : "false";
            } else if constexpr (std::is_same_v<V, double>) {
              AppendJsonDouble(line, v);
            } else {
              absl::StrAppend(&line, v);
            }
          },
          f.value);
    }
    line += '}';
    return line;
  }
  absl::StrAppend(&line, ts, " ", LevelName(level, format), " ");
  AppendText(line, message, /*is_value=*/false);
  for (const LogField& f : fields) {
    line += ' ';
    AppendText(line, f.key, /*is_value=*/true);
    line += '=';
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            AppendText(line, v, /*is_value=*/true);
          } else if constexpr (std::is_same_v<V, bool>) {
            line += v ? "true" : "false";
          } else if constexpr (std::is_same_v<V, double>) {
            line += absl::StrFormat("%g", v);
          } else {
            absl::StrAppend(&line, v);
          }
        },
        f.value);
  }
  return line;
}

void Log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields) {
  Log(level, message, absl::Span<const LogField>(fields.begin(), fields.size()));
}

void Log(LogLevel level, std::string_view message, absl::Span<const LogField> fields) {
  std::string line = FormatLogLine(GetLogFormat(), level, message, fields);
  line += '\n';
  absl::MutexLock lock(&g_write_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

bool IsValidRequestId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-')
      return false;
  }
  return true;
}

}  // namespace tost::service
