#include "service/store/redis_record_store.h"

#include <openssl/sha.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/error_detail.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"
#include "service/observability/logging.h"

namespace tost::store {
namespace {

using service::QuoteClientText;
using service::RecordNotFound;

// The stored value's header: the owner's digest, the version, then the id's digest. The scripts
// read the first two only: the id is checked by the replica that reads the record.
constexpr size_t kOwnerDigestBytes = SHA256_DIGEST_LENGTH;
constexpr size_t kVersionDigits = 16;
constexpr size_t kIdDigestBytes = SHA256_DIGEST_LENGTH;
constexpr size_t kHeaderBytes = kOwnerDigestBytes + kVersionDigits + kIdDigestBytes;
static_assert(kOwnerDigestBytes + kVersionDigits == 48,
              "the scripts below read the owner and version as bytes 0..47");

// What a caller refused for a store that cannot serve is told to wait: long enough for a
// reconnect (the client's timeouts are about a second), short enough for a restart's blip.
constexpr int64_t kRetryAfterMs = 1000;

// The scripts answer {code[, version]}.
constexpr int64_t kNotFound = 0;
constexpr int64_t kNotOwner = 1;
constexpr int64_t kVersionMoved = 2;  // {2, the current version's hex digits}
constexpr int64_t kDone = 3;

// KEYS: record. ARGV: owner digest, expected version (hex), new value, ttl ms. GETRANGE reads the
// header without the data, and answers "" for a missing key.
const RedisScript& ReplaceScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local head = redis.call('GETRANGE', KEYS[1], 0, 47)
if head == '' then return {0} end
if string.sub(head, 1, 32) ~= ARGV[1] then return {1} end
local ver = string.sub(head, 33, 48)
if ver ~= ARGV[2] then return {2, ver} end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return {3}
)lua");
  return *script;
}

// KEYS: record. ARGV: owner digest.
const RedisScript& DeleteScript() {
  static const RedisScript* script = new RedisScript(R"lua(
local owner = redis.call('GETRANGE', KEYS[1], 0, 31)
if owner == '' then return {0} end
if owner ~= ARGV[1] then return {1} end
redis.call('DEL', KEYS[1])
return {3}
)lua");
  return *script;
}

// The owner as the store sees it: a digest, so that the store holds no caller names (API key
// names may say more than they should). Raw bytes, not hex: it is paid for by every record.
// Tagged apart from the session store's digest, so that the two cannot be matched up.
std::string OwnerDigest(const std::string& owner) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  const std::string tagged = absl::StrCat("tost-record-owner", std::string(1, '\0'), owner);
  SHA256(reinterpret_cast<const unsigned char*>(tagged.data()), tagged.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

// The id the value was written under, so that a value moved or copied to another key (RENAME,
// COPY) is not served as that id's record. A digest rather than the id: fixed size, and the
// store's values name no ids. Not a MAC: it catches values put under the wrong key, not a writer
// of the store who rewrites it (docs/sessions.md).
std::string IdDigest(const std::string& id) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  const std::string tagged = absl::StrCat("tost-record-id", std::string(1, '\0'), id);
  SHA256(reinterpret_cast<const unsigned char*>(tagged.data()), tagged.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string VersionHex(int64_t version) {
  return absl::StrCat(absl::Hex(static_cast<uint64_t>(version), absl::kZeroPad16));
}

// Strict: exactly 16 lowercase hex digits, as VersionHex writes them.
bool ParseVersionHex(absl::string_view hex, int64_t* version) {
  if (hex.size() != kVersionDigits) return false;
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  uint64_t v = 0;
  if (!absl::SimpleHexAtoi(hex, &v)) return false;
  *version = static_cast<int64_t>(v);
  return true;
}

absl::StatusOr<int64_t> ReplyCode(const RedisReply& reply, const char* script) {
  if (!reply.is_array() || reply.elements.empty() || !reply.elements[0].is_integer()) {
    return absl::InternalError(absl::StrCat("record store: the ", script,
                                            " script answered an unexpected reply: expected "
                                            "{code, ...}, got ",
                                            reply.DebugString()));
  }
  return reply.elements[0].integer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisRecordStore>> RedisRecordStore::Make(
    std::unique_ptr<RedisClient> client, RedisRecordStoreOptions options) {
  TOST_RETURN_IF_ERROR(service::ValidateRecordStoreOptions(options.records));
  if (options.key_prefix.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_store_key_prefix must be at most 64 bytes, got ", options.key_prefix.size()));
  }
  if (client == nullptr) {
    return absl::InvalidArgumentError("the shared record store needs a client, got none");
  }
  return std::unique_ptr<RedisRecordStore>(
      new RedisRecordStore(std::move(client), std::move(options)));
}

std::string RedisRecordStore::RecordKey(const std::string& id) const {
  return absl::StrCat(options_.key_prefix, "r:", id);
}

std::string RedisRecordStore::TtlMs() const {
  // PX refuses 0: a ttl under a millisecond (valid, if useless) is one.
  return absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.records.ttl)));
}

std::string RedisRecordStore::Value(const std::string& id, const std::string& owner,
                                    int64_t version, const std::string& data) const {
  std::string value;
  value.reserve(kHeaderBytes + data.size());
  absl::StrAppend(&value, OwnerDigest(owner), VersionHex(version), IdDigest(id), data);
  return value;
}

absl::Status RedisRecordStore::CheckSize(const std::string& id, const std::string& data) const {
  if (static_cast<int64_t>(data.size()) > options_.records.max_record_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("record ", QuoteClientText(id), ": its data must be at most ",
                     options_.records.max_record_bytes, " bytes, got ", data.size()));
  }
  return absl::OkStatus();
}

absl::Status RedisRecordStore::StoreError(const absl::Status& status, const char* what,
                                          const std::string& id) const {
  // The client's message names the store. A store out of memory (maxmemory with noeviction) cannot
  // be written either; it may have room again once records expire.
  const bool cannot_serve = status.code() == absl::StatusCode::kUnavailable ||
                            (status.code() == absl::StatusCode::kInternal &&
                             absl::StrContains(status.message(), "'OOM "));
  if (!cannot_serve) {
    return WithMessage(status, absl::StrCat("could not ", what, " record ", QuoteClientText(id),
                                            ": ", status.message()));
  }
  return WithServerDetail(absl::UnavailableError(absl::StrCat(
                              "could not ", what, " record ", QuoteClientText(id), ": ",
                              status.message(), "; retry after about ", kRetryAfterMs, " ms")),
                          ServerDetail(status));
}

absl::Status RedisRecordStore::Create(const std::string& id, const std::string& owner,
                                      std::string data) {
  TOST_RETURN_IF_ERROR(CheckSize(id, data));
  auto reply =
      client_->Command({"SET", RecordKey(id), Value(id, owner, 1, data), "NX", "PX", TtlMs()});
  if (!reply.ok()) return StoreError(reply.status(), "create", id);
  if (reply->is_nil()) {
    return absl::AlreadyExistsError(
        absl::StrCat("record ", QuoteClientText(id), " already exists; ids are never reused"));
  }
  if (!reply->is_status()) {
    return absl::InternalError(absl::StrCat("record store: SET of record ", QuoteClientText(id),
                                            ": expected OK or nil, got ", reply->DebugString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<service::StoredRecord> RedisRecordStore::Get(const std::string& id,
                                                            const std::string& owner) {
  auto reply = client_->Command({"GET", RecordKey(id)});
  if (!reply.ok()) return StoreError(reply.status(), "read", id);
  if (reply->is_nil()) return RecordNotFound(id);
  if (!reply->is_string() || reply->str.size() < kHeaderBytes) {
    return WithServerDetail(
        absl::DataLossError(absl::StrCat(
            "the record store (--session_store): record ", QuoteClientText(id), " holds ",
            reply->DebugString(), ", expected a string of at least ", kHeaderBytes,
            " bytes (owner digest, version and id digest); it was not written by this server")),
        StoreDetail(client_->endpoint()));
  }
  const absl::string_view value = reply->str;
  if (value.substr(0, kOwnerDigestBytes) != OwnerDigest(owner)) return RecordNotFound(id);
  service::StoredRecord record;
  if (!ParseVersionHex(value.substr(kOwnerDigestBytes, kVersionDigits), &record.version)) {
    return WithServerDetail(
        absl::DataLossError(absl::StrCat(
            "the record store (--session_store): record ", QuoteClientText(id),
            " has no version where expected (16 hex digits after the owner digest); it was not "
            "written by this server")),
        StoreDetail(client_->endpoint()));
  }
  if (value.substr(kOwnerDigestBytes + kVersionDigits, kIdDigestBytes) != IdDigest(id)) {
    // Another record's id is not quoted back: it is its owner's to know.
    absl::Status refusal = absl::DataLossError(absl::StrCat(
        "the record store (--session_store): record ", QuoteClientText(id),
        " holds another record's value (written under another id, then moved or copied to this "
        "one's key, or written before records were bound to their ids); it is refused"));
    service::Log(service::LogLevel::kError, "record store: stored record refused",
                 {{"store", client_->endpoint().Address()}, {"error", refusal.message()}});
    return refusal;
  }
  record.data = std::move(reply->str);
  record.data.erase(0, kHeaderBytes);
  return record;
}

absl::StatusOr<int64_t> RedisRecordStore::Replace(const std::string& id, const std::string& owner,
                                                  int64_t expected_version, std::string data) {
  TOST_RETURN_IF_ERROR(CheckSize(id, data));
  const int64_t version = expected_version + 1;
  auto reply = client_->Eval(
      ReplaceScript(), {RecordKey(id)},
      {OwnerDigest(owner), VersionHex(expected_version), Value(id, owner, version, data), TtlMs()});
  if (!reply.ok()) return StoreError(reply.status(), "replace", id);
  TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "replace"));
  switch (code) {
    case kNotFound:
    case kNotOwner:
      return RecordNotFound(id);
    case kVersionMoved: {
      int64_t now_at = 0;
      const bool known =
          reply->elements.size() > 1 && ParseVersionHex(reply->elements[1].str, &now_at);
      return absl::AbortedError(absl::StrCat(
          "record ", QuoteClientText(id), " was changed by another request: expected version ",
          expected_version, ", it is at ", known ? absl::StrCat("version ", now_at) : "another",
          "; read it again and retry"));
    }
    case kDone:
      return version;
    default:
      return absl::InternalError(absl::StrCat("record store: the replace script answered code ",
                                              code, ", expected 0 to 3"));
  }
}

absl::Status RedisRecordStore::Delete(const std::string& id, const std::string& owner) {
  auto reply = client_->Eval(DeleteScript(), {RecordKey(id)}, {OwnerDigest(owner)});
  if (!reply.ok()) return StoreError(reply.status(), "delete", id);
  TOST_ASSIGN_OR_RETURN(const int64_t code, ReplyCode(*reply, "delete"));
  switch (code) {
    case kNotFound:
    case kNotOwner:
      return RecordNotFound(id);
    case kDone:
      return absl::OkStatus();
    default:
      return absl::InternalError(absl::StrCat("record store: the delete script answered code ",
                                              code, ", expected 0, 1 or 3"));
  }
}

}  // namespace tost::store
