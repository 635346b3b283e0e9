#include "base/error_detail.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tost {
namespace {

// A payload type URL of this server's own: nothing outside it reads or writes it.
constexpr absl::string_view kServerDetailPayload = "type.tost-serve/server-detail";

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The longest prefix of `text` of at most `max` bytes that does not end inside a UTF-8 sequence.
std::string_view Utf8Prefix(std::string_view text, size_t max) {
  if (text.size() <= max) return text;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xc0) == 0x80) --n;
  return text.substr(0, n);
}

std::string Bounded(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(Absl(Utf8Prefix(text, max)), "...(", text.size(), " bytes)");
}

std::string InternalMessage(std::string_view request_id) {
  if (request_id.empty()) return "internal error: the server's log has the details";
  return absl::StrCat("internal error (request id ", Absl(request_id),
                      "): the server's log has the details");
}

}  // namespace

absl::Status WithServerDetail(absl::Status status, std::string_view detail) {
  if (status.ok() || detail.empty()) return status;
  std::string all = ServerDetail(status);
  if (!all.empty()) all += "; ";
  all += Bounded(detail, kMaxServerDetailBytes);
  status.SetPayload(kServerDetailPayload, absl::Cord(Bounded(all, kMaxServerDetailBytes)));
  return status;
}

std::string ServerDetail(const absl::Status& status) {
  const auto detail = status.GetPayload(kServerDetailPayload);  // absl's optional, not std's
  return detail.has_value() ? std::string(*detail) : std::string();
}

absl::Status WithMessage(const absl::Status& status, std::string_view message) {
  if (status.ok()) return status;
  absl::Status out(status.code(), Absl(message));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::string FullErrorText(const absl::Status& status) {
  const std::string detail = ServerDetail(status);
  if (detail.empty()) return std::string(status.message());
  return absl::StrCat(status.message(), " [", detail, "]");
}

bool IsServerFailure(absl::StatusCode code) {
  return code == absl::StatusCode::kInternal || code == absl::StatusCode::kUnknown ||
         code == absl::StatusCode::kDataLoss;
}

ClientError ForClient(const absl::Status& status, std::string_view request_id) {
  if (status.ok()) return {status, false};
  const std::string_view message(status.message().data(), status.message().size());
  std::string shown;
  if (IsServerFailure(status.code())) {
    shown = InternalMessage(request_id);
  } else if (message.size() > kMaxClientMessageBytes) {
    const std::string where =
        request_id.empty() ? std::string() : absl::StrCat(" under request id ", Absl(request_id));
    const std::string tail =
        absl::StrCat("... (", message.size(), " bytes; the server's log has all of it", where, ")");
    shown = absl::StrCat(Absl(Utf8Prefix(message, kMaxClientMessageBytes - tail.size())), tail);
  } else {
    shown = std::string(message);
  }
  const bool has_detail = status.GetPayload(kServerDetailPayload).has_value();
  if (shown == message && !has_detail) return {status, false};
  absl::Status out = WithMessage(status, shown);
  out.ErasePayload(kServerDetailPayload);
  return {std::move(out), true};
}

}  // namespace tost
