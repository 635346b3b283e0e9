#include "service/engine/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/split_mix.h"

namespace tost::service {

absl::Status ValidatePrefixCacheOptions(const PrefixCacheOptions& o) {
  if (o.max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix_cache_bytes must be >= 0 (0 disables the cache), got ", o.max_bytes));
  }
  return absl::OkStatus();
}

std::string PrefixStateCache::ScopeKey(const PrefixCacheScope& scope) {
  return absl::StrCat(scope.model, absl::string_view("\0", 1), scope.weights_sha256,
                      absl::string_view("\0", 1), scope.owner);
}

int64_t PrefixStateCache::PositionsWithin(int64_t max_bytes, const PrefixCacheScope& scope,
                                          int64_t key_tokens, int64_t state_floats) {
  if (max_bytes <= 0 || key_tokens <= 0 || state_floats < 0) return 0;
  const int64_t entry =
      EntryBytes(ScopeKey(scope).size() + scope.model.size(), static_cast<size_t>(key_tokens),
                 static_cast<size_t>(state_floats));
  return max_bytes / entry * key_tokens;
}

uint64_t PrefixStateCache::ScopeHash(const std::string& scope_key) {
  uint64_t h = base::SplitMix64(scope_key.size());
  for (unsigned char c : scope_key) h = base::SplitMix64(h ^ c);
  return h;
}

uint64_t PrefixStateCache::Extend(uint64_t hash, int32_t token) {
  return base::SplitMix64(hash ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 1 | 1));
}

int64_t PrefixStateCache::EntryBytes(size_t text_bytes, size_t tokens, size_t floats) {
  // The entry, its list node and its hash-table slot, and what its vectors and strings hold.
  constexpr size_t kBookkeeping = 2 * sizeof(void*) + sizeof(uint64_t) + sizeof(Lru::iterator);
  return static_cast<int64_t>(sizeof(Entry) + kBookkeeping + text_bytes + tokens * sizeof(int32_t) +
                              floats * sizeof(float));
}

void PrefixStateCache::Erase(Lru::iterator it) {
  PrefixCacheModelStats& m = per_model_[it->model];
  --m.entries;
  m.bytes -= it->bytes;
  bytes_ -= it->bytes;
  by_hash_.erase(it->hash);
  lru_.erase(it);
}

std::vector<uint64_t> PrefixStateCache::PrefixHashes(const std::string& scope_key,
                                                     absl::Span<const int32_t> tokens, int64_t n) {
  n = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()));
  std::vector<uint64_t> hashes(n > 0 ? n : 0);
  uint64_t h = ScopeHash(scope_key);
  for (int64_t i = 0; i < n; ++i) hashes[i] = h = Extend(h, tokens[i]);
  return hashes;
}

PrefixStateCache::Lru::iterator PrefixStateCache::FindLongest(const std::string& scope_key,
                                                              absl::Span<const int32_t> tokens,
                                                              const std::vector<uint64_t>& hashes,
                                                              bool on_grid_only) {
  for (auto len = static_cast<int64_t>(hashes.size()); len >= 1; --len) {
    auto found = by_hash_.find(hashes[len - 1]);
    if (found == by_hash_.end()) continue;
    const Entry& e = *found->second;
    if (static_cast<int64_t>(e.tokens.size()) != len || e.scope != scope_key ||
        !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) {
      continue;  // a collision of two keys' hashes: a miss, never another sequence's state
    }
    if (on_grid_only && !e.on_grid) continue;
    return found->second;
  }
  return lru_.end();
}

std::optional<PrefixCacheHit> PrefixStateCache::Lookup(const PrefixCacheScope& scope,
                                                       absl::Span<const int32_t> tokens,
                                                       int64_t max_tokens, bool on_grid_only) {
  if (!enabled()) return std::nullopt;
  const std::string scope_key = ScopeKey(scope);
  // Hashes of every allowed prefix length, computed once outside the lock: O(prompt length).
  const std::vector<uint64_t> hashes = PrefixHashes(scope_key, tokens, max_tokens);

  absl::MutexLock lock(&mu_);
  PrefixCacheModelStats& m = per_model_[scope.model];
  ++m.lookups;
  auto found = FindLongest(scope_key, tokens, hashes, on_grid_only);
  if (found == lru_.end()) return std::nullopt;
  lru_.splice(lru_.end(), lru_, found);
  const auto len = static_cast<int64_t>(found->tokens.size());
  ++m.hits;
  m.hit_tokens += len;
  return PrefixCacheHit{len, found->state, found->on_grid};
}

void PrefixStateCache::Prefetch(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
                                int64_t max_tokens, bool on_grid_only) {
  if (!enabled() || tier_ == nullptr) return;
  const std::string scope_key = ScopeKey(scope);
  const std::vector<uint64_t> hashes = PrefixHashes(scope_key, tokens, max_tokens);
  if (hashes.empty()) return;
  int64_t held = 0;
  {
    absl::MutexLock lock(&mu_);
    auto found = FindLongest(scope_key, tokens, hashes, on_grid_only);
    if (found != lru_.end()) held = static_cast<int64_t>(found->tokens.size());
  }
  const auto longest = static_cast<int64_t>(hashes.size());
  if (held == longest) return;
  std::optional<PrefixCacheHit> hit = tier_->Fetch(scope, tokens, held, longest, on_grid_only);
  if (!hit.has_value() || hit->tokens <= held || hit->tokens > longest) return;
  if (InsertLocal(scope, tokens.first(hit->tokens), hit->state, hit->on_grid)) {
    absl::MutexLock lock(&mu_);
    ++per_model_[scope.model].shared_hits;
  }
}

void PrefixStateCache::Insert(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
                              const model::SequenceState& state, bool on_grid) {
  if (InsertLocal(scope, tokens, state, on_grid) && tier_ != nullptr) {
    tier_->Publish(scope, tokens, state, on_grid);
  }
}

bool PrefixStateCache::InsertLocal(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
                                   const model::SequenceState& state, bool on_grid) {
  if (!enabled() || tokens.empty() || state.position != static_cast<int64_t>(tokens.size())) {
    return false;
  }
  Entry e;
  e.scope = ScopeKey(scope);
  e.hash = ScopeHash(e.scope);
  for (int32_t t : tokens) e.hash = Extend(e.hash, t);
  e.model = scope.model;
  e.on_grid = on_grid;
  e.bytes = EntryBytes(e.scope.size() + e.model.size(), tokens.size(), state.stats.size());
  if (e.bytes > options_.max_bytes) return false;

  absl::MutexLock lock(&mu_);
  if (auto found = by_hash_.find(e.hash); found != by_hash_.end()) {
    Entry& old = *found->second;
    const bool same_key = old.scope == e.scope && old.tokens.size() == tokens.size() &&
                          std::equal(old.tokens.begin(), old.tokens.end(), tokens.begin());
    if (same_key) {
      const bool upgraded = on_grid && !old.on_grid;
      if (upgraded) {
        old.state = state;
        old.on_grid = true;
      }
      lru_.splice(lru_.end(), lru_, found->second);
      return upgraded;
    }
    Erase(found->second);  // a collision: the newer key takes the slot
  }
  e.tokens.assign(tokens.begin(), tokens.end());
  e.state = state;
  PrefixCacheModelStats& m = per_model_[scope.model];
  ++m.inserts;
  ++m.entries;
  m.bytes += e.bytes;
  bytes_ += e.bytes;
  const uint64_t hash = e.hash;
  by_hash_[hash] = lru_.insert(lru_.end(), std::move(e));
  while (bytes_ > options_.max_bytes && !lru_.empty()) {
    ++per_model_[lru_.front().model].evictions;
    Erase(lru_.begin());
  }
  return true;
}

int64_t PrefixStateCache::JoinGroup(const PrefixCacheScope& scope, const std::string& key,
                                    absl::Span<const int32_t> tokens) {
  if (!enabled()) return 0;
  return groups_.Join(ScopeKey(scope), key, tokens);
}

PrefixCacheModelStats PrefixStateCache::stats(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = per_model_.find(model);
  return it == per_model_.end() ? PrefixCacheModelStats{} : it->second;
}

int64_t PrefixStateCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t PrefixStateCache::entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(lru_.size());
}

}  // namespace tost::service
