#include "model/config/decode_buckets.h"

#include <algorithm>

namespace tost::model {

std::vector<int64_t> DecodeBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  if (max_batch < 1) return buckets;
  for (int64_t b = 1; b < 8 && b < max_batch; b *= 2) buckets.push_back(b);
  for (int64_t b = 8; b < max_batch; b += 8) buckets.push_back(b);
  buckets.push_back(max_batch);
  return buckets;
}

int64_t DecodeBucketFor(const std::vector<int64_t>& buckets, int64_t batch) {
  if (batch < 1) return -1;
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), batch);
  return it == buckets.end() ? -1 : *it;
}

}  // namespace tost::model
