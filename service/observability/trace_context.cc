#include "service/observability/trace_context.h"

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/observability/logging.h"

namespace tost::service {
namespace {

constexpr size_t kVersion00Size = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool AllZeros(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

int HexValue(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

std::string NewSpanId() {
  thread_local absl::BitGen gen;
  // Zero is not a span id; one draw in 2^64 is redrawn.
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return absl::StrFormat("%016x", id);
}

}  // namespace

std::optional<TraceParent> ParseTraceParent(std::string_view value) {
  // Debian's Abseil has its own string_view type.
  const absl::string_view stripped =
      absl::StripAsciiWhitespace(absl::string_view(value.data(), value.size()));
  value = std::string_view(stripped.data(), stripped.size());
  if (value.size() < kVersion00Size) return std::nullopt;
  const std::string_view version = value.substr(0, 2);
  if (!IsLowerHex(version) || version == "ff") return std::nullopt;
  if (version == "00" ? value.size() != kVersion00Size
                      : value.size() > kVersion00Size && value[kVersion00Size] != '-') {
    return std::nullopt;
  }
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  const std::string_view trace_id = value.substr(3, 32);
  const std::string_view parent_id = value.substr(36, 16);
  const std::string_view flags = value.substr(53, 2);
  if (!IsLowerHex(trace_id) || !IsLowerHex(parent_id) || !IsLowerHex(flags)) return std::nullopt;
  if (AllZeros(trace_id) || AllZeros(parent_id)) return std::nullopt;
  return TraceParent{.trace_id = std::string(trace_id),
                     .parent_id = std::string(parent_id),
                     .flags = static_cast<uint8_t>(HexValue(flags[0]) * 16 + HexValue(flags[1]))};
}

RequestIdentity IdentifyRequest(std::string_view x_request_id, std::string_view traceparent) {
  RequestIdentity out;
  if (const std::optional<TraceParent> trace = ParseTraceParent(traceparent)) {
    out.trace_id = trace->trace_id;
    out.span_id = NewSpanId();
  }
  if (IsValidRequestId(x_request_id)) {
    out.request_id = std::string(x_request_id);
  } else if (!out.trace_id.empty()) {
    out.request_id = absl::StrCat(out.trace_id, "-", out.span_id);
  } else {
    out.request_id = NewRequestId();
  }
  return out;
}

}  // namespace tost::service
