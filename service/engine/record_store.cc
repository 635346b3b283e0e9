#include "service/engine/record_store.h"

#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"

namespace tost::service {

absl::Status ValidateRecordStoreOptions(const RecordStoreOptions& o) {
  if (o.ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--response_ttl_s must be > 0, got ", absl::FormatDuration(o.ttl)));
  }
  if (o.max_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--response_store_max_bytes must be >= 1, got ", o.max_bytes));
  }
  if (o.max_record_bytes < 1 || o.max_record_bytes > o.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a stored response's size limit must be in [1, --response_store_max_bytes=", o.max_bytes,
        "] bytes, got ", o.max_record_bytes));
  }
  return absl::OkStatus();
}

absl::Status RecordNotFound(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("record ", QuoteClientText(id),
                                          " not found (deleted, expired, evicted, or not yours)"));
}

}  // namespace tost::service
