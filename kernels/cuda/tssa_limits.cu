// Which shapes the TSSA kernels take (UnsupportedReason), whatever the path: the limits of their
// shared-memory tiles and register arrays, and of the thread blocks one launch can have.
#include <cstdint>

#include "kernels/cuda/tssa_common.cuh"

namespace tost::kernels::gpu {
TOST_GPU_BACKEND_NAMESPACE_BEGIN

const char* UnsupportedReason(const Dims& d) {
  if (d.batch < 0 || d.tokens < 0 || d.channels < 0) return "negative dimension";
  if (d.heads < 1) return "the number of heads K must be at least 1";
  if (d.channels % d.heads != 0) return "channels D must be divisible by the number of heads K";
  if (d.channels > kMaxChannels) return "the CUDA kernels support at most 8192 channels (D)";
  if (d.heads > kMaxHeads) return "the CUDA kernels support at most 1024 heads (K)";
  if (d.tokens > (int64_t{1} << 40)) return "too many tokens";
  if (d.batch > 0 && CeilDiv(2 * d.channels + d.heads, kWarpSize) > kMaxGridBlocks / d.batch) {
    return "B sequences of this width exceed the 2^31-1 thread blocks of a launch";
  }
  if (d.batch > 0 && d.tokens > 0 &&
      CeilDiv(d.tokens, ChunkTokens(d.tokens)) > kMaxGridBlocks / d.batch) {
    return "B sequences of this length exceed the 2^31-1 thread blocks of a launch";
  }
  return nullptr;
}

TOST_GPU_BACKEND_NAMESPACE_END
}  // namespace tost::kernels::gpu
