#include "service/engine/prefix_groups.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tost::service {

int64_t PrefixGroups::Join(const std::string& scope_key, const std::string& key,
                           absl::Span<const int32_t> tokens) {
  std::string id = absl::StrCat(scope_key, absl::string_view("\0", 1), key);
  // The group, its list node and its table slot (which holds the id again), and its prompt.
  const auto bytes = static_cast<int64_t>(sizeof(Group) + 2 * sizeof(void*) + 2 * id.size() +
                                          sizeof(Lru::iterator) + tokens.size() * sizeof(int32_t));
  absl::MutexLock lock(&mu_);
  int64_t shared = 0;
  if (auto found = by_id_.find(id); found != by_id_.end()) {
    const std::vector<int32_t>& last = found->second->tokens;
    shared = std::mismatch(tokens.begin(), tokens.end(), last.begin(), last.end()).first -
             tokens.begin();
    bytes_ -= found->second->bytes;
    lru_.erase(found->second);
    by_id_.erase(found);
  }
  if (bytes > max_bytes_) return shared;
  Group g;
  g.id = id;
  g.tokens.assign(tokens.begin(), tokens.end());
  g.bytes = bytes;
  bytes_ += bytes;
  by_id_[std::move(id)] = lru_.insert(lru_.end(), std::move(g));
  while (bytes_ > max_bytes_) {
    bytes_ -= lru_.front().bytes;
    by_id_.erase(lru_.front().id);
    lru_.pop_front();
  }
  return shared;
}

int64_t PrefixGroups::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t PrefixGroups::groups() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(lru_.size());
}

}  // namespace tost::service
