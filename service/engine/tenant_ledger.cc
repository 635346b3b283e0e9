#include "service/engine/tenant_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/engine/client_text.h"

namespace tost::service {

absl::Status ValidateTenantOptions(const TenantOptions& o) {
  if (o.max_priority < 0 || o.max_priority > kMaxPriorityLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_priority must be in [0, ", kMaxPriorityLimit, "], got ", o.max_priority));
  }
  for (const TenantSpec& t : o.table.tenants()) {
    if (t.highest_priority.has_value() &&
        (*t.highest_priority < -o.max_priority || *t.highest_priority > o.max_priority)) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.table.Where(t.name), ": field highest_priority of tenant ", QuoteClientText(t.name),
          " must be within the priorities calls may ask for, [", -o.max_priority, ", ",
          o.max_priority, "] (--max_priority), got ", *t.highest_priority));
    }
  }
  if (o.token_window < absl::Seconds(1) || o.token_window > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat("token_window must be in [1s, 1h], got ",
                                                   absl::FormatDuration(o.token_window)));
  }
  return absl::OkStatus();
}

TenantLedger::Lease& TenantLedger::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Lease dropped(std::move(*this));
    ledger_ = std::exchange(other.ledger_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

TenantLedger::Lease::~Lease() {
  if (ledger_ != nullptr) ledger_->End(index_);
}

TenantLedger::TenantLedger(TenantOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock), bucket_(options_.token_window / 60) {
  for (const TenantSpec& spec : options_.table.tenants()) {
    index_.emplace(spec.name, accounts_.size());
    Account a;
    a.spec = &spec;
    a.usage.tenant = spec.name;
    a.usage.weight = spec.weight;
    accounts_.push_back(std::move(a));
  }
  Account other;
  other.usage.tenant = kOtherTenant;
  accounts_.push_back(std::move(other));
}

size_t TenantLedger::IndexOf(std::string_view tenant) const {
  auto it = index_.find(tenant);
  return it == index_.end() ? index_.size() : it->second;
}

absl::Status TenantLedger::CheckPriority(std::string_view tenant, int32_t priority,
                                         std::string_view field) const {
  if (priority < -options_.max_priority || priority > options_.max_priority) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(field), " must be in [", -options_.max_priority, ", ", options_.max_priority,
        "] (--max_priority; lower runs sooner), got ", priority));
  }
  // Refused rather than lowered to the cap: a caller that asks for more urgency than it may have
  // learns so at once, instead of running later than it asked with nothing to tell it why.
  const TenantSpec* spec = options_.table.Find(tenant);
  if (spec != nullptr && spec->highest_priority.has_value() && priority < *spec->highest_priority) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant ", QuoteClientText(spec->name), " may ask for ", std::string(field), " ",
        *spec->highest_priority, " or higher (its highest_priority=", *spec->highest_priority,
        "; lower runs sooner), got ", std::string(field), " ", priority));
  }
  return absl::OkStatus();
}

int64_t TenantLedger::WindowTokens(Account& a, absl::Time now) {
  // A bucket counts while any of it is inside the window: a conservative edge of a 60th of it.
  while (!a.window.empty() && a.window.front().start + bucket_ + options_.token_window <= now) {
    a.window_sum -= a.window.front().tokens;
    a.window.pop_front();
  }
  return a.window_sum;
}

void TenantLedger::Charge(Account& a, absl::Time now, int64_t tokens) {
  if (tokens <= 0 || a.spec == nullptr || !a.spec->quotas.tokens_per_minute.has_value()) return;
  WindowTokens(a, now);
  if (a.window.empty() || a.window.back().start + bucket_ <= now) a.window.push_back({now, 0});
  a.window.back().tokens += tokens;
  a.window_sum += tokens;
}

absl::Duration TenantLedger::TimeUntilRoom(const Account& a, absl::Time now, int64_t need) const {
  const int64_t quota = *a.spec->quotas.tokens_per_minute;
  int64_t left = a.window_sum;
  for (const Bucket& b : a.window) {
    left -= b.tokens;
    if (left + need <= quota)
      return std::max(absl::ZeroDuration(), b.start + bucket_ + options_.token_window - now);
  }
  return options_.token_window;
}

absl::Status TenantLedger::TokenRefusal(Account& a, absl::Time now, int64_t used, int64_t need) {
  ++a.usage.refusals["tokens_per_minute"];
  const int64_t quota = *a.spec->quotas.tokens_per_minute;
  const int64_t wait_ms = absl::ToInt64Milliseconds(TimeUntilRoom(a, now, need)) + 1;
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant ", QuoteClientText(a.spec->name), ": quota tokens_per_minute=", quota, " reached (",
      used, " tokens in the last ", absl::FormatDuration(options_.token_window),
      need > 0 ? absl::StrCat(", and this prompt holds ", need) : std::string(),
      "); retry after about ", wait_ms, " ms"));
}

absl::StatusOr<TenantLedger::Lease> TenantLedger::StartGeneration(std::string_view tenant) {
  const size_t index = IndexOf(tenant);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[index];
  if (a.spec != nullptr) {
    const TenantQuotas& q = a.spec->quotas;
    if (q.max_concurrent.has_value() && a.usage.generations >= *q.max_concurrent) {
      ++a.usage.refusals["max_concurrent"];
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", QuoteClientText(a.spec->name), ": quota max_concurrent=", *q.max_concurrent,
          " reached (", a.usage.generations,
          " generations admitted and not finished); retry after a short backoff"));
    }
    if (q.tokens_per_minute.has_value()) {
      if (const int64_t used = WindowTokens(a, now); used >= *q.tokens_per_minute) {
        return TokenRefusal(a, now, used, 1);
      }
    }
  }
  ++a.usage.generations;
  return Lease(this, index);
}

void TenantLedger::End(size_t index) {
  absl::MutexLock lock(&mu_);
  --accounts_[index].usage.generations;
}

absl::Status TenantLedger::ChargePrompt(std::string_view tenant, int64_t tokens) {
  const size_t index = IndexOf(tenant);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[index];
  if (a.spec != nullptr && a.spec->quotas.tokens_per_minute.has_value()) {
    const int64_t quota = *a.spec->quotas.tokens_per_minute;
    if (tokens > quota) {
      ++a.usage.refusals["tokens_per_minute"];
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant ", QuoteClientText(a.spec->name), ": a prompt of ", tokens,
                       " tokens can never fit quota tokens_per_minute=", quota, " (a window of ",
                       absl::FormatDuration(options_.token_window), "); send a shorter prompt"));
    }
    if (const int64_t used = WindowTokens(a, now); used + tokens > quota) {
      return TokenRefusal(a, now, used, tokens);
    }
  }
  a.usage.prompt_tokens += tokens;
  Charge(a, now, tokens);
  return absl::OkStatus();
}

void TenantLedger::ChargeGenerated(std::string_view tenant, int64_t tokens) {
  const size_t index = IndexOf(tenant);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[index];
  a.usage.generated_tokens += tokens;
  Charge(a, now, tokens);
}

bool TenantLedger::HasTokenRoom(std::string_view tenant) {
  const size_t index = IndexOf(tenant);
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[index];
  if (a.spec == nullptr || !a.spec->quotas.tokens_per_minute.has_value()) return true;
  return WindowTokens(a, clock_->Now()) < *a.spec->quotas.tokens_per_minute;
}

absl::Status TenantLedger::CheckSessions(std::string_view tenant, int64_t sessions_held,
                                         int64_t bytes_held, int64_t new_bytes) {
  const size_t index = IndexOf(tenant);
  absl::MutexLock lock(&mu_);
  Account& a = accounts_[index];
  if (a.spec == nullptr) return absl::OkStatus();
  const TenantQuotas& q = a.spec->quotas;
  if (q.max_sessions.has_value() && sessions_held >= *q.max_sessions) {
    ++a.usage.refusals["max_sessions"];
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", QuoteClientText(a.spec->name), ": quota max_sessions=", *q.max_sessions,
        " reached (", sessions_held, " sessions held); close one, or retry after a short backoff"));
  }
  if (q.max_session_bytes.has_value() && bytes_held + new_bytes > *q.max_session_bytes) {
    ++a.usage.refusals["max_session_bytes"];
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", QuoteClientText(a.spec->name), ": quota max_session_bytes=",
        *q.max_session_bytes, " reached (", bytes_held, " bytes held, and this session needs ",
        new_bytes, "); close one, or retry after a short backoff"));
  }
  return absl::OkStatus();
}

std::vector<TenantUsage> TenantLedger::Usage() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<TenantUsage> out;
  for (Account& a : accounts_) {
    a.usage.window_tokens = WindowTokens(a, now);
    out.push_back(a.usage);
  }
  return out;
}

}  // namespace tost::service
