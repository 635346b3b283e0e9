// The groups of OpenAI's prompt_cache_key: requests that name the same key (in one scope: model,
// weights and caller) are expected to share a long prefix, such as a system prompt and tool
// definitions. The prefix-state cache on its own keeps states at fixed positions (multiples of the
// prefill chunk, and each prompt's end), so two prompts that share a prefix of any other length
// and then differ find only the last such position before it. A group remembers its last prompt;
// the next prompt of the group learns how many leading tokens it shares with it, and its prefill
// stores the state at exactly that position, where the group's later prompts start.
//
// Bounds: `max_bytes` over all groups (each counted by its key, its prompt's tokens and its
// bookkeeping); the least recently joined go first. A prompt too long for the bound on its own
// leaves its group unremembered.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tost::service {

class PrefixGroups {
 public:
  explicit PrefixGroups(int64_t max_bytes) : max_bytes_(max_bytes) {}
  PrefixGroups(const PrefixGroups&) = delete;
  PrefixGroups& operator=(const PrefixGroups&) = delete;

  // How many leading tokens `tokens` shares with the last prompt of group `key` in `scope_key`
  // (0 for a group not held); `tokens` becomes the group's last prompt.
  int64_t Join(const std::string& scope_key, const std::string& key,
               absl::Span<const int32_t> tokens);

  int64_t bytes() const;
  int64_t groups() const;

 private:
  struct Group {
    std::string id;  // scope key \0 group key
    std::vector<int32_t> tokens;
    int64_t bytes = 0;
  };
  using Lru = std::list<Group>;  // front: least recently joined

  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Lru::iterator> by_id_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tost::service
