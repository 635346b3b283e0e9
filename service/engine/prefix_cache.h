// The prefix-state cache: sequence statistics at exact token positions, so that a stateless client
// resending a conversation (prompt = earlier prompt + earlier reply + new text) pays only for the
// new tokens. A ToST sequence's whole memory is its fixed-size statistics, so a checkpoint at any
// position costs the same few KB; nothing is kept per token.
//
// An entry maps (scope, token ids) to the model::SequenceState whose statistics are exactly those
// of feeding these tokens from position 0: key length == state.position. A GenerationState's
// pending token is not part of it (it was sampled, never fed: the next call feeds it), and neither
// are sampling parameters, stop conditions or withheld text, which come from each request.
//
// Scope: the model's name and the SHA-256 of its weights (a model reloaded with other weights
// never meets its old statistics), and the owner (the caller identity of Authenticator::Identify:
// an API key's name or a client certificate's identity). An owner sees only its own entries;
// without authentication every caller is kAnonymousCaller and they share one scope.
//
// Lookup finds the longest cached prefix. Keys are found by hashes of prefixes, not by a trie: the
// lookup hashes the prompt once (a running 64-bit hash over the scope and each token, O(prompt
// length)) and probes one hash table from the longest allowed length down, so it costs O(prompt
// length) whatever the number of entries; the entry found is then compared token by token (a hash
// collision is a miss, never another sequence's state). A trie would share the tokens of common
// prefixes, but its per-token nodes would outweigh the few-KB states it indexes; here each entry
// holds its own key, counted in its bytes.
//
// Bounds: `max_bytes` over all entries of all models, each counted by what it really holds (its
// statistics, its key tokens, its scope and bookkeeping); least recently used entries (by lookup
// hit or insertion) are evicted first.
//
// Exactness: the statistics of a prefill depend in their last bits on where the prompt was cut
// into chunks (a cut reorders float additions), and a decode step feeds a token as a prefill cut
// after it. An entry is "on the grid" when its statistics come from prefill chunks cut only at
// multiples of the scheduler's prefill_chunk_tokens from position 0 and its length is such a
// multiple: a cold prefill of any longer prompt computes exactly these bits on its way, so
// continuing from it is bit-identical. Lookups that need that guarantee (batch-invariant serving)
// accept only such entries; others take any entry.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "model/state/sequence_state.h"
#include "service/engine/prefix_groups.h"

namespace tost::service {

struct PrefixCacheOptions {
  // Bytes of all entries together (statistics, keys, bookkeeping); 0 disables the cache.
  int64_t max_bytes = 64LL << 20;  // --prefix_cache_bytes's default
};

absl::Status ValidatePrefixCacheOptions(const PrefixCacheOptions& o);

// Whose entries a lookup may see and an insertion creates.
struct PrefixCacheScope {
  std::string model;
  std::string weights_sha256;  // raw bytes, as ModelEntry holds it
  std::string owner;           // Authenticator::Identify's caller identity
};

struct PrefixCacheHit {
  int64_t tokens = 0;  // the cached prefix's length: state.position
  model::SequenceState state;
  bool on_grid = false;  // see the file comment
};

// A second tier shared by replicas (service/store/redis_prefix_tier.h, on the shared session
// store): what one replica prefilled is a hit on every other. Its entries are the same (scope,
// tokens) → state mappings.
class PrefixCacheTier {
 public:
  virtual ~PrefixCacheTier() = default;
  // The longest entry of `scope` whose tokens are a prefix of `tokens`, longer than `min_tokens`
  // and at most `max_tokens` long (on the grid only, with `on_grid_only`). Waits for the tier (a
  // bounded time); nullopt on a miss and on any failure: the tier is a cache.
  virtual std::optional<PrefixCacheHit> Fetch(const PrefixCacheScope& scope,
                                              absl::Span<const int32_t> tokens, int64_t min_tokens,
                                              int64_t max_tokens, bool on_grid_only) = 0;
  // Offers an entry to the tier. Never waits (it may be dropped).
  virtual void Publish(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
                       const model::SequenceState& state, bool on_grid) = 0;
};

// Per model (metrics, ServerStatus).
struct PrefixCacheModelStats {
  int64_t lookups = 0;
  int64_t hits = 0;
  int64_t shared_hits = 0;  // prefixes fetched from the shared tier into this replica's cache
  int64_t hit_tokens = 0;   // prompt tokens served from the cache (sum of hits' lengths)
  int64_t inserts = 0;
  int64_t evictions = 0;  // entries removed to make room
  int64_t entries = 0;
  int64_t bytes = 0;
};

class PrefixStateCache {
 public:
  explicit PrefixStateCache(PrefixCacheOptions options)
      : options_(options), groups_(options.max_bytes / kGroupsShare) {}
  PrefixStateCache(const PrefixStateCache&) = delete;
  PrefixStateCache& operator=(const PrefixStateCache&) = delete;

  bool enabled() const { return options_.max_bytes > 0; }

  // Adds the shared tier (before any other call; not owned, outlives the cache): every Insert is
  // offered to it, and Prefetch looks there.
  void SetSharedTier(PrefixCacheTier* tier) { tier_ = tier; }
  bool has_shared_tier() const { return tier_ != nullptr; }

  // Brings the longest prefix the shared tier holds of `tokens` (within the bounds of Lookup's)
  // into this cache when it is longer than the longest held here, so that the Lookup that follows
  // finds it. Waits for the tier: call it where a request may wait (a front end's thread, never
  // the scheduler's). Counts nothing but the shared hits.
  void Prefetch(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens, int64_t max_tokens,
                bool on_grid_only);
  const PrefixCacheOptions& options() const { return options_; }

  // The state of the longest cached prefix of `tokens` no longer than `max_tokens` tokens (and at
  // least one token), in `scope`; with `on_grid_only`, only entries on the grid. Counted as a
  // lookup (and a hit) of scope.model. nullopt when nothing matches or the cache is disabled.
  std::optional<PrefixCacheHit> Lookup(const PrefixCacheScope& scope,
                                       absl::Span<const int32_t> tokens, int64_t max_tokens,
                                       bool on_grid_only);

  // Stores `state`, the statistics of feeding exactly `tokens` from position 0
  // (state.position == tokens.size(), at least one token), evicting least recently used entries
  // for room. An entry already held for the same key is refreshed; a state on the grid replaces
  // one that is not (it serves every lookup), never the reverse. Ignored when disabled, when the
  // entry alone exceeds max_bytes, or when the state does not match its key's length.
  void Insert(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
              const model::SequenceState& state, bool on_grid);

  // A scope as one string (model, weights, owner), and the hashes of every prefix of `tokens` up
  // to `n` tokens in it ([i]: the first i + 1 tokens'): what entries are found by, here and in the
  // shared tier.
  static std::string ScopeKey(const PrefixCacheScope& scope);
  static std::vector<uint64_t> PrefixHashes(const std::string& scope_key,
                                            absl::Span<const int32_t> tokens, int64_t n);

  // OpenAI's prompt_cache_key (prefix_groups.h): how many leading tokens `tokens` shares with the
  // last prompt of group `key` in `scope`, the position whose state the group's requests store;
  // 0 when disabled. The groups' memory is a 1/kGroupsShare part of max_bytes, beside the entries'.
  int64_t JoinGroup(const PrefixCacheScope& scope, const std::string& key,
                    absl::Span<const int32_t> tokens);
  static constexpr int64_t kGroupsShare = 4;
  const PrefixGroups& groups() const { return groups_; }

  PrefixCacheModelStats stats(const std::string& model) const;
  int64_t bytes() const;
  int64_t entries() const;

  // The most token positions that entries of `scope`, each `key_tokens` long and holding
  // `state_floats` statistics, cover within `max_bytes`: whole entries (as Insert counts their
  // bytes) times their length; 0 when not one fits. What the metrics report as the cache's
  // capacity in blocks of one token.
  static int64_t PositionsWithin(int64_t max_bytes, const PrefixCacheScope& scope,
                                 int64_t key_tokens, int64_t state_floats);

 private:
  struct Entry {
    uint64_t hash = 0;
    std::string scope;  // model \0 weights \0 owner
    std::string model;
    std::vector<int32_t> tokens;
    model::SequenceState state;
    bool on_grid = false;
    int64_t bytes = 0;
  };
  using Lru = std::list<Entry>;  // front: least recently used

  static uint64_t ScopeHash(const std::string& scope_key);
  static uint64_t Extend(uint64_t hash, int32_t token);
  static int64_t EntryBytes(size_t text_bytes, size_t tokens, size_t floats);
  void Erase(Lru::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The longest entry matching a prefix of `tokens` (hashed), end() for none.
  Lru::iterator FindLongest(const std::string& scope_key, absl::Span<const int32_t> tokens,
                            const std::vector<uint64_t>& hashes, bool on_grid_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Insert without offering the entry to the shared tier (it came from there).
  bool InsertLocal(const PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
                   const model::SequenceState& state, bool on_grid);

  PrefixCacheTier* tier_ = nullptr;

  const PrefixCacheOptions options_;
  PrefixGroups groups_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lru::iterator> by_hash_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, PrefixCacheModelStats, std::less<>> per_model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::service
