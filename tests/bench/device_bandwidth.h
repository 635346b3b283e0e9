// The memory bandwidth a benchmark's figures are measured against: the device's copy bandwidth as
// LibTorch reaches it, so "fraction of bandwidth" compares like with like on the CPU and on a GPU.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace tost::bench {

// The best of `repeats` timed rounds of copy_ between two float32 tensors of `bytes` each on
// `device` (on the CPU with LibTorch's intra-op threads), counting the bytes read and written:
// GB/s (1e9 bytes). Each round waits for the device, so a CUDA figure is the copy's own time.
double MeasureCopyBandwidthGBs(const c10::Device& device, int64_t bytes = int64_t{256} << 20,
                               int repeats = 5);

}  // namespace tost::bench
