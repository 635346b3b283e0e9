// The prefix-state cache's second tier, on the shared session store: a prompt prefilled on one
// replica is a prefix-cache hit on every other. Each entry is one key, "<prefix>p:<hash>" (the
// hash of its scope and tokens, as PrefixStateCache finds entries), holding the scope, the tokens
// and the statistics, sealed with the session key (SessionCodec::Seal): a store that is tampered
// with cannot make a replica start from statistics it did not compute, and a hash collision is a
// miss, never another sequence's state. Entries expire `ttl` after their last use.
//
// It is a cache: it never fails a request. Fetch waits at most the client's command timeout, and
// after a failure the store is left alone for `retry_after_failure` (so that a store that is down
// costs stateless requests nothing but the first timeout); Publish queues the entry for a thread of
// the tier's own and drops it when the queue is full.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/clock.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/session_codec.h"
#include "service/store/redis_client.h"

namespace tost::store {

struct RedisPrefixTierOptions {
  std::string key_prefix = "tost:";        // --session_store_key_prefix
  absl::Duration ttl = absl::Minutes(30);  // unused this long → expires (--session_idle_timeout_s)
  // A Fetch asks about at most this many prefix lengths, longest first.
  int64_t max_probed_lengths = 4096;
  absl::Duration retry_after_failure = absl::Seconds(5);
  size_t max_queued_publishes = 256;
};

class RedisPrefixTier final : public service::PrefixCacheTier {
 public:
  // `codec` and `clock` are not owned and outlive the tier.
  RedisPrefixTier(const service::SessionCodec* codec, std::unique_ptr<RedisClient> client,
                  RedisPrefixTierOptions options, service::Clock* clock);
  // Joins the publishing thread (what is still queued is dropped: it is a cache).
  ~RedisPrefixTier() override;
  RedisPrefixTier(const RedisPrefixTier&) = delete;
  RedisPrefixTier& operator=(const RedisPrefixTier&) = delete;

  std::optional<service::PrefixCacheHit> Fetch(const service::PrefixCacheScope& scope,
                                               absl::Span<const int32_t> tokens, int64_t min_tokens,
                                               int64_t max_tokens, bool on_grid_only) override;
  void Publish(const service::PrefixCacheScope& scope, absl::Span<const int32_t> tokens,
               const model::SequenceState& state, bool on_grid) override;

  // The sealed record of an entry, and back (nullopt: not authentic, or not well formed).
  std::string Encode(const std::string& scope_key, absl::Span<const int32_t> tokens,
                     const model::SequenceState& state, bool on_grid) const;
  struct Decoded {
    std::string scope_key;
    std::vector<int32_t> tokens;
    model::SequenceState state;
    bool on_grid = false;
  };
  std::optional<Decoded> Decode(const std::string& record) const;

 private:
  struct Pending {
    std::string key;
    std::string record;
  };
  std::string Key(uint64_t hash) const;
  bool Skipping() ABSL_LOCKS_EXCLUDED(mu_);
  void Failed() ABSL_LOCKS_EXCLUDED(mu_);
  void PublishLoop();

  const service::SessionCodec* const codec_;
  const std::unique_ptr<RedisClient> client_;
  const RedisPrefixTierOptions options_;
  service::Clock* const clock_;

  absl::Mutex mu_;
  absl::Time skip_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread publisher_;
};

}  // namespace tost::store
