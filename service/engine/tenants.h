// Tenants: who shares a server, with what weight, within what quotas.
//
// A tenant is a caller identity as Authenticator::Identify gives it: an API key's name, "tls:" and
// a TLS client certificate's identity, or "anonymous" (every caller without a key or certificate:
// one tenant). The operator names tenants in a tenants file (--tenants_file) or on the lines of the
// API-keys file, after the key; a tenant named nowhere has weight 1 and no quota.
//
// A line is `name [field=value ...]` (the API-keys file: `name key [field=value ...]`), `#` starts
// a comment. Fields:
//   weight=W                     its share of decode slots and prefill tokens against the other
//                                tenants with work waiting, in (0, 1000] (default 1)
//   max_concurrent=N             generations admitted at once (queued, parked or running)
//   tokens_per_minute=N          prompt and generated tokens over any minute (the window's length
//                                is TenantOptions::token_window)
//   max_sessions=N               sessions held in the session store
//   max_session_bytes=N          bytes of their states (GenerationState::ByteSize)
//   highest_priority=P           the lowest (most urgent) priority its calls may ask for, within
//                                [-max_priority, max_priority]; a call asking for a lower one is
//                                refused (PERMISSION_DENIED). Left out: any in the range
// Each quota is a positive integer; a field left out is no quota. Parsing refuses a duplicate name,
// an unknown field, a weight, quota or priority that is not a number in range (zero included for
// quotas), naming the file, line and field; ValidateTenantOptions, a highest_priority outside
// --max_priority's range, naming its file and line too.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::service {

struct TenantQuotas {
  std::optional<int64_t> max_concurrent;
  std::optional<int64_t> tokens_per_minute;
  std::optional<int64_t> max_sessions;
  std::optional<int64_t> max_session_bytes;
};

struct TenantSpec {
  std::string name;
  double weight = 1.0;
  TenantQuotas quotas;
  std::optional<int32_t> highest_priority;
};

// The widest --max_priority takes, and so the widest a highest_priority field may be.
inline constexpr int32_t kMaxPriorityLimit = 1'000'000;

inline constexpr double kMaxTenantWeight = 1000.0;

// What a line holds before its fields: a tenants file names the tenant only; an API-keys file
// names it and then its key (skipped here; Authenticator reads it).
enum class TenantLineForm { kTenantsFile, kApiKeysFile };

class TenantTable {
 public:
  TenantTable() = default;
  // `source` names the file in errors ("tenants.txt:3: ...").
  static absl::StatusOr<TenantTable> Parse(std::string_view text, std::string_view source,
                                           TenantLineForm form);
  static absl::StatusOr<TenantTable> FromFile(const std::string& path, TenantLineForm form);
  // Both tables' tenants; INVALID_ARGUMENT when a tenant is named in both.
  static absl::StatusOr<TenantTable> Merge(const TenantTable& a, const TenantTable& b);

  // Null for a tenant the configuration does not name.
  const TenantSpec* Find(std::string_view name) const;
  // In the order of the files' lines.
  const std::vector<TenantSpec>& tenants() const { return tenants_; }
  double Weight(std::string_view name) const;
  // "file:line" where `name` is configured (empty for a tenant named nowhere).
  std::string Where(std::string_view name) const;

 private:
  std::vector<TenantSpec> tenants_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::map<std::string, std::string, std::less<>> where_;  // name -> "file:line", for Merge
};

}  // namespace tost::service
