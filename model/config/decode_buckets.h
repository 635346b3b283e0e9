// The batch sizes a CUDA model's decode step runs at. A step of B sequences runs at the smallest
// bucket ≥ B, padded with scratch rows, so that every shape the device sees is one of a few: each
// bucket's step is captured once as a CUDA graph and replayed (one launch instead of one per
// kernel), and eager and graph decode compute with the same shapes, hence the same kernels and the
// same bits. Powers of two up to 8, then multiples of 8 (as vLLM does): padding wastes at most 7
// rows past 8, and the number of graphs grows linearly in the largest batch.
// Torch-free, unit-tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace tost::model {

// Ascending, ending exactly at max_batch (≥ 1).
std::vector<int64_t> DecodeBuckets(int64_t max_batch);

// The smallest bucket ≥ batch; -1 when batch is < 1 or above the largest bucket.
int64_t DecodeBucketFor(const std::vector<int64_t>& buckets, int64_t batch);

}  // namespace tost::model
