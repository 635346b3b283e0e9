#include "service/observability/logging.h"

#include <atomic>
#include <cstdio>

#include <nlohmann/json.hpp>

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
    case LogLevel::kInfo:
      return format == LogFormat::kJson ? "info" : "INFO";
    case LogLevel::kWarning:
      return format == LogFormat::kJson ? "warning" : "WARN";
    case LogLevel::kError:
      return format == LogFormat::kJson ? "error" : "ERROR";
  }
  return "?";
}

// Text values are quoted only when they would otherwise be ambiguous (spaces, quotes, '=', any
// control character). Control characters are escaped, so a client's string cannot forge a line
// (a \r or an ANSI escape sequence), and a value is cut at kMaxTextValueBytes.
constexpr size_t kMaxTextValueBytes = 4096;

std::string TextValue(const std::string& s) {
  const auto needs_quotes = [](unsigned char c) {
    return c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f;
  };
  const std::string_view shown = std::string_view(s).substr(0, kMaxTextValueBytes);
  bool plain = !s.empty() && shown.size() == s.size();
  for (unsigned char c : shown) plain = plain && !needs_quotes(c);
  if (plain) return s;
  std::string out = "\"";
  for (unsigned char c : shown) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < ' ' || c == 0x7f) {
          absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  if (shown.size() < s.size()) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

}  // namespace

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
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
  if (format == LogFormat::kJson) {
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["level"] = LevelName(level, format);
    j["msg"] = std::string(message);
    for (const LogField& f : fields) {
      std::visit([&](const auto& v) { j[std::string(f.key)] = v; }, f.value);
    }
    // Invalid UTF-8 (from a client, say) becomes U+FFFD instead of throwing.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = absl::StrCat(ts, " ", LevelName(level, format), " ", std::string(message));
  for (const LogField& f : fields) {
    absl::StrAppend(&line, " ", std::string(f.key), "=");
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            line += TextValue(v);
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
