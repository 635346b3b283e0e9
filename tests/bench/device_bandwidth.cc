#include "tests/bench/device_bandwidth.h"

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>

namespace tost::bench {

double MeasureCopyBandwidthGBs(const c10::Device& device, int64_t bytes, int repeats) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  const auto on_device = at::TensorOptions(at::kFloat).device(device);
  const at::Tensor src = at::ones({n}, on_device);
  at::Tensor dst = at::zeros({n}, on_device);  // pages mapped before timing
  // A one-element read back waits for every copy queued before it (on the CPU it costs nothing).
  const auto wait = [&] { (void)dst.select(0, n - 1).item<float>(); };
  constexpr int kCopiesPerRound = 4;
  dst.copy_(src);
  wait();
  double best_s = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kCopiesPerRound; ++k) dst.copy_(src);
    wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_s = std::min(best_s, s / kCopiesPerRound);
  }
  return 2.0 * static_cast<double>(n * static_cast<int64_t>(sizeof(float))) / best_s / 1e9;
}

}  // namespace tost::bench
