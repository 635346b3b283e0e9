// CUDA kernel of tost::apply_token_bitmask_ (kernels/token_bitmask_ops.h; ground truth
// kernels/reference.cc): the logits of every token whose bit is clear become -infinity.
//
// One thread per token, one warp per 32-token word, 256 tokens per block; a flat grid of
// masked_rows · ceil(vocab/256) blocks (no 65 535 limit on the rows). A warp's 32 lanes load the
// same word (one broadcast transaction) and each lane tests its bit; the lanes with a clear bit
// store -infinity to their logit: one 128-byte segment per warp, coalesced, predicated per lane.
//
// Why write-only, one pass: the op is memory-bound with almost no arithmetic, and the only value it
// ever writes is -infinity, so the logits are never read. The bytes moved are the words that cover
// the vocabulary (V/8 bytes per constrained row) plus 4 bytes per forbidden token; an allowed
// token costs nothing, and a row without a constraint is not visited at all (the caller names the
// constrained rows). A read-modify-write pass (select(bit, logit, -inf)) would read and write
// every logit of every constrained row, 8·V bytes per row, whatever the mask. Per-lane stores keep
// the kernel free of shuffles and shared memory; a warp-wide word load plus shuffles would save
// only the broadcast loads, 1/32 of the traffic.
#include <cstdint>

#include "kernels/cuda/device_launch.h"
#include "kernels/cuda/token_bitmask_cuda.h"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN
namespace {

constexpr int kMaskThreads = 256;  // tokens per block
constexpr int64_t kMaxGridBlocks = 2147483647;

// Block b covers tokens [(b % blocks_per_row)·256, +256) of bitmask row b / blocks_per_row.
template <typename Index>
__global__ void __launch_bounds__(kMaskThreads)
    ApplyTokenBitmaskKernel(float* __restrict__ logits, int64_t rows, int64_t vocab,
                            const int32_t* __restrict__ bitmask, int64_t words,
                            const Index* __restrict__ row_ids, int64_t blocks_per_row) {
  const int64_t block = blockIdx.x;
  const int64_t m = block / blocks_per_row;
  const int64_t token = (block % blocks_per_row) * kMaskThreads + threadIdx.x;
  if (token >= vocab) return;
  // Unchecked device row ids (see token_bitmask_cuda.h): one outside the logits is skipped.
  const int64_t row = row_ids != nullptr ? static_cast<int64_t>(row_ids[m]) : m;
  if (row < 0 || row >= rows) return;
  const uint32_t word = static_cast<uint32_t>(bitmask[m * words + (token >> 5)]);
  if (((word >> (token & 31)) & 1u) == 0) {
    logits[row * vocab + token] = __int_as_float(static_cast<int>(0xff800000u));  // -infinity
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename Index>
cudaError_t Run(const TokenBitmaskShape& s, float* logits, const int32_t* bitmask,
                const Index* row_ids, cudaStream_t stream) {
  const int64_t blocks_per_row = CeilDiv(s.vocab, kMaskThreads);
  const dim3 grid(static_cast<unsigned>(s.masked_rows * blocks_per_row));
  return Launch<ApplyTokenBitmaskKernel<Index>, kMaskThreads>({grid, dim3(kMaskThreads), 0, stream},
                                                              logits, s.rows, s.vocab, bitmask,
                                                              s.words, row_ids, blocks_per_row);
}

}  // namespace

const char* TokenBitmaskUnsupportedReason(const TokenBitmaskShape& s) {
  if (s.rows < 0 || s.vocab < 0 || s.masked_rows < 0 || s.words < 0) return "negative dimension";
  if (s.words < CeilDiv(s.vocab, 32)) return "fewer words than the vocabulary needs";
  if (s.vocab > 0 && s.masked_rows > kMaxGridBlocks / CeilDiv(s.vocab, kMaskThreads)) {
    return "this many bitmask rows of this vocabulary exceed the 2^31-1 thread blocks of a launch";
  }
  return nullptr;
}

cudaError_t LaunchApplyTokenBitmask(const TokenBitmaskShape& s, float* logits,
                                    const int32_t* bitmask, const void* row_ids, RowIdType row_type,
                                    cudaStream_t stream) {
  if (TokenBitmaskUnsupportedReason(s) != nullptr || s.vocab < 1 || s.masked_rows < 1 ||
      logits == nullptr || bitmask == nullptr ||
      (row_ids == nullptr) != (row_type == RowIdType::kNone) ||
      (row_ids == nullptr && s.masked_rows != s.rows)) {
    return cudaErrorInvalidValue;
  }
  switch (row_type) {
    case RowIdType::kNone:
      return Run<int64_t>(s, logits, bitmask, nullptr, stream);
    case RowIdType::kInt32:
      return Run(s, logits, bitmask, static_cast<const int32_t*>(row_ids), stream);
    case RowIdType::kInt64:
      return Run(s, logits, bitmask, static_cast<const int64_t*>(row_ids), stream);
  }
  return cudaErrorInvalidValue;
}

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
