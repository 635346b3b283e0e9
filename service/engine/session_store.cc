#include "service/engine/session_store.h"

#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "service/engine/client_text.h"

namespace tost::service {

absl::Status ValidateSessionStoreOptions(const SessionStoreOptions& o) {
  if (o.max_sessions < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("max_sessions must be >= 1, got ", o.max_sessions));
  if (o.max_state_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_budget_bytes must be >= 1, got ", o.max_state_bytes));
  }
  if (o.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("session_idle_timeout must be > 0, got ",
                                                   absl::FormatDuration(o.idle_timeout)));
  }
  return absl::OkStatus();
}

std::string NewSessionId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // The OS CSPRNG failing is not recoverable: an id must never be guessable.
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::Status SessionNotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session ", QuoteClientText(id),
                                          " not found (closed, expired, evicted, or not yours)"));
}

absl::Status SessionBusy(const std::string& id, SessionUse use) {
  const char* advice = "";
  switch (use) {
    case SessionUse::kGenerate:
      advice = " is in use by another Generate; a session runs one generation at a time";
      break;
    case SessionUse::kRead:
      advice = " is generating; wait for its stream to end";
      break;
    case SessionUse::kClose:
      advice = " is generating; cancel its stream first";
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat("session ", QuoteClientText(id), advice));
}

absl::Status SessionStore::CheckinAndWait(const std::string& id, GenerationState state) {
  absl::Notification finished;
  absl::Status outcome;
  Checkin(id, std::move(state), [&](absl::Status s) {
    outcome = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return outcome;
}

}  // namespace tost::service
