// What each tenant (tenants.h) uses now, against its quotas, for every model of one engine: the
// generations it has admitted, the tokens it fed and drew in the last token window, and the
// counters the per-tenant metrics read.
//
// Quotas are decided before any model work where they can be (a generation's place, then its
// prompt once tokenised) and hold during generation too: a tenant whose window is used up gets
// no decode step until tokens leave the window (GenerationScheduler parks its generations, which
// keeps their state), so that a long generation cannot overrun its tenant's rate.
//
// Refusals are RESOURCE_EXHAUSTED naming the quota and its value, with a retry hint ("retry after
// about N ms") that the HTTP front end turns into Retry-After.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/clock.h"
#include "service/engine/tenants.h"

namespace tost::service {

struct TenantOptions {
  TenantTable table;
  // Requests' priority must be in [-max_priority, max_priority]; lower runs sooner.
  int32_t max_priority = 100;
  // The window of tokens_per_minute quotas: a minute, or shorter for tests; the quota scales with
  // it (a window of 10 s allows a sixth of the per-minute figure).
  absl::Duration token_window = absl::Minutes(1);
};

absl::Status ValidateTenantOptions(const TenantOptions& options);

// The metrics' label for tenants the configuration does not name.
inline constexpr char kOtherTenant[] = "other";

// One tenant's figures (the configured ones by name, the rest summed as kOtherTenant).
struct TenantUsage {
  std::string tenant;
  double weight = 1.0;
  int64_t generations = 0;  // admitted and not finished
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t window_tokens = 0;  // in the current token window (configured tenants only)
  // Refusals by quota: max_concurrent, tokens_per_minute, max_sessions, max_session_bytes.
  std::map<std::string, int64_t> refusals;
};

class TenantLedger {
 public:
  // A generation admitted for a tenant; counted until it is destroyed. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept
        : ledger_(std::exchange(other.ledger_, nullptr)), index_(other.index_) {}
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

   private:
    friend class TenantLedger;
    Lease(TenantLedger* ledger, size_t index) : ledger_(ledger), index_(index) {}
    TenantLedger* ledger_ = nullptr;
    size_t index_ = 0;
  };

  TenantLedger(TenantOptions options, Clock* clock);

  const TenantOptions& options() const { return options_; }
  double Weight(std::string_view tenant) const { return options_.table.Weight(tenant); }

  // INVALID_ARGUMENT naming `field` unless priority is within the range; PERMISSION_DENIED,
  // naming the tenant, its highest_priority and the value, when `tenant` may not ask for it.
  absl::Status CheckPriority(std::string_view tenant, int32_t priority,
                             std::string_view field = "priority") const;

  // A place for one generation of `tenant`: RESOURCE_EXHAUSTED when its max_concurrent
  // generations are admitted, or its token window is used up.
  absl::StatusOr<Lease> StartGeneration(std::string_view tenant);
  // Charges a generation's prompt: RESOURCE_EXHAUSTED (nothing charged) when it would pass the
  // tenant's tokens_per_minute, or could never fit it.
  absl::Status ChargePrompt(std::string_view tenant, int64_t tokens);
  void ChargeGenerated(std::string_view tenant, int64_t tokens);
  // Whether `tenant` may draw a token now (false: its token window is used up).
  bool HasTokenRoom(std::string_view tenant);
  // RESOURCE_EXHAUSTED when one more session (of `bytes`) would pass the tenant's max_sessions
  // or max_session_bytes, given what it holds now (counted by the caller: the session store).
  absl::Status CheckSessions(std::string_view tenant, int64_t sessions_held, int64_t bytes_held,
                             int64_t new_bytes);

  std::vector<TenantUsage> Usage();

 private:
  struct Bucket {
    absl::Time start;
    int64_t tokens = 0;
  };
  struct Account {
    const TenantSpec* spec = nullptr;  // null: kOtherTenant
    TenantUsage usage;
    std::deque<Bucket> window;  // oldest first
    int64_t window_sum = 0;
  };
  // The tenant's account: its own when configured, else the shared kOtherTenant one.
  size_t IndexOf(std::string_view tenant) const;
  // Drops buckets that left the window; the tokens in it.
  int64_t WindowTokens(Account& a, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Charge(Account& a, absl::Time now, int64_t tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long until the window holds at most quota - need tokens.
  absl::Duration TimeUntilRoom(const Account& a, absl::Time now, int64_t need) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TokenRefusal(Account& a, absl::Time now, int64_t used, int64_t need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End(size_t index);

  const TenantOptions options_;
  Clock* const clock_;
  const absl::Duration bucket_;  // the window's granularity: a 60th of it
  std::map<std::string, size_t, std::less<>> index_;
  absl::Mutex mu_;
  std::vector<Account> accounts_ ABSL_GUARDED_BY(mu_);  // configured ones, then kOtherTenant
};

}  // namespace tost::service
