// tssa_gpu_bench: the CUDA TSSA operators against the ATen reference run on the same GPU, with the
// device's own copy bandwidth measured in the same run (docs/kernels.md, "CUDA kernels"). Builds
// with the standalone kernels project, so a lent GPU machine can run it (scripts/gpu-bundle.sh).
//
//   tssa_gpu_bench            full run (a few minutes)
//   tssa_gpu_bench --quick    one size per op (ctest tssa_gpu_bench_quick, label gpu)
//   --device=cuda:N           the device to measure (default cuda:0)
//   tssa_gpu_bench --profile  each fused operator once per dtype at a size beyond L2, nothing
//                             else timed or compared: the run a profiler wraps (ncu, in
//                             scripts/gpu-session.sh)
//
// Figures: medians of interleaved repeats, each timed with CUDA events on the current stream;
// "eff GB/s" counts three reads and one write of w (plus Π, as docs/kernels.md counts it) over
// the fused kernel's time; "of copy" compares it with a device-to-device copy of a 1 GiB tensor
// (read + write) timed the same way. Every fused result is compared with the reference first.
// Without a CUDA device it prints a line saying so and exits 77 (ctest reports it as skipped);
// with a device this process cannot use it fails (tests/kernels/gpu_gate.h).
// Exit status 1 when a fused result differs from the reference.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/reference.h"
#include "kernels/tssa_ops.h"
#include "tests/kernels/gpu/gpu_probe.h"

namespace {

using tost::kernels::StateWidth;
namespace ref = tost::kernels::reference;
namespace fused = tost::kernels;

constexpr int64_t kChannels = 384;
constexpr int64_t kHeads = 8;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "tssa_gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// Milliseconds of one call, by CUDA events around it on the current (default) stream.
double TimeMs(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  Check(cudaEventRecord(start), "cudaEventRecord");
  fn();
  Check(cudaEventRecord(stop), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median times of `a` and `b`, interleaved (a, b, a, b, ...) after two warm-up calls each.
std::pair<double, double> Interleaved(int reps, const std::function<void()>& a,
                                      const std::function<void()>& b) {
  for (int i = 0; i < 2; ++i) a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(TimeMs(a));
    tb.push_back(TimeMs(b));
  }
  return {Median(ta), Median(tb)};
}

bool g_mismatch = false;

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double tol = got.scalar_type() == at::kFloat ? 1e-4 : 2e-2;
  const double scale = want.abs().max().item<double>() + 1e-30;
  const double diff = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>() / scale;
  if (!(diff <= tol)) {
    std::fprintf(stderr, "MISMATCH %s: max |fused - reference| / max |reference| = %.3g > %.1g\n",
                 what.c_str(), diff, tol);
    g_mismatch = true;
  }
}

double CopyBandwidthGBs(int reps) {
  const int64_t n = (int64_t{1} << 30) / 4;
  at::Tensor a = at::empty({n}, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat)).fill_(1.0);
  at::Tensor b = at::empty_like(a);
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) t.push_back(TimeMs([&] { b.copy_(a); }));
  t.erase(t.begin(), t.begin() + 2);
  return 2.0 * a.nbytes() / (Median(t) * 1e-3) / 1e9;
}

const char* Name(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kBFloat16 ? "bfloat16" : "float16";
}

// One call of each fused operator per dtype, with inputs larger than any L2 (an H100's is 50 MB),
// so a profiler sees them read from device memory: tssa on 8 x 16384 x 384, tssa_causal on
// 8 x 4096 x 384, tssa_step on 256 rows.
int Profile() {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(0);
  const at::Tensor temp = at::rand({kHeads}, cuda) + 0.5;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    fused::tssa(at::randn({8, 16384, kChannels}, cuda.dtype(dtype)), temp);
    const int64_t T = 4096;
    const at::Tensor denom_bias = at::randn({kHeads, T}, cuda) * 0.1;
    fused::tssa_causal(at::randn({8, T, kChannels}, cuda.dtype(dtype)), temp, denom_bias,
                       std::nullopt, std::nullopt);
    const int64_t B = 256;
    at::Tensor state = at::rand({B, StateWidth(kChannels, kHeads)}, cuda) * 10;
    fused::tssa_step(at::randn({B, kChannels}, cuda.dtype(dtype)), temp, denom_bias,
                     at::randint(1, T - 1, {B}, cuda.dtype(at::kLong)), state);
  }
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::printf(
      "tssa_gpu_bench --profile: tssa, tssa_causal and tssa_step once each, float32 and "
      "bfloat16\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  bool profile = false;
  int device = 0;
  const auto usage = [](const std::string& got) {
    std::fprintf(stderr,
                 "usage: tssa_gpu_bench [--quick | --profile] [--device=cuda|cuda:N]; got '%s'\n",
                 got.c_str());
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--device=cuda") {
      device = 0;
    } else if (a.rfind("--device=cuda:", 0) == 0) {
      const std::string index = a.substr(14);
      char* end = nullptr;
      const long v = std::strtol(index.c_str(), &end, 10);
      if (index.empty() || *end != '\0' || v < 0 || v > 1024) return usage(a);
      device = static_cast<int>(v);
    } else {
      return usage(a);
    }
  }
  // Exits 77 (ctest: skipped) only without a device; fails with one this process cannot use.
  if (const auto status = tost::kernels::testing::GpuGateExitStatus("tssa_gpu_bench")) {
    return *status;
  }
  int devices = 0;
  Check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (device >= devices) {
    std::fprintf(stderr, "tssa_gpu_bench: --device=cuda:%d, but this process sees %d device(s)\n",
                 device, devices);
    return 2;
  }
  // ATen's current device follows the runtime's: every tensor below is made on this one.
  Check(cudaSetDevice(device), "cudaSetDevice");
  if (profile) return Profile();
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const int reps = quick ? 5 : 21;
  const double copy_gbs = CopyBandwidthGBs(reps);
  std::printf(
      "device: %s (sm_%d%d, %d SMs, %.1f GiB); device-to-device copy (read + write): %.0f GB/s\n",
      prop.name, prop.major, prop.minor, prop.multiProcessorCount,
      prop.totalGlobalMem / double(1 << 30), copy_gbs);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(0);

  std::printf("\ntost::tssa vs reference::tssa on the GPU (D=%ld, K=%ld)\n", long(kChannels),
              long(kHeads));
  std::printf("  %-8s %3s %7s | %10s %10s %8s %9s %8s\n", "dtype", "B", "N", "ref ms", "fused ms",
              "speedup", "eff GB/s", "of copy");
  const std::vector<std::pair<int64_t, int64_t>> sizes =
      quick
          ? std::vector<std::pair<int64_t, int64_t>>{{1, 4096}}
          : std::vector<std::pair<int64_t, int64_t>>{{1, 1024}, {1, 4096}, {1, 16384}, {1, 65536},
                                                     {8, 1024}, {8, 4096}, {8, 16384}, {8, 65536}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [B, N] : sizes) {
      const at::Tensor w = at::randn({B, N, kChannels}, cuda.dtype(dtype));
      const at::Tensor temp = at::rand({kHeads}, cuda.dtype(at::kFloat)) + 0.5;
      ExpectClose(fused::tssa(w, temp), ref::tssa(w, temp), std::string("tssa ") + Name(dtype));
      const auto [t_ref, t_fused] = Interleaved(
          reps, [&] { ref::tssa(w, temp); }, [&] { fused::tssa(w, temp); });
      const double bytes =
          4.0 * w.nbytes() + 2.0 * B * N * kHeads * 4;  // 3 reads + 1 write of w, Π twice
      const double gbs = bytes / (t_fused * 1e-3) / 1e9;
      std::printf("  %-8s %3ld %7ld | %10.3f %10.3f %7.1fx %9.0f %7.0f%%\n", Name(dtype), long(B),
                  long(N), t_ref, t_fused, t_ref / t_fused, gbs, 100.0 * gbs / copy_gbs);
    }
  }

  std::printf("\ntost::tssa_causal (prefill) vs reference, float32\n");
  std::printf("  %3s %6s | %10s %10s %8s\n", "B", "T", "ref ms", "fused ms", "speedup");
  for (const auto& [B, T] :
       quick ? std::vector<std::pair<int64_t, int64_t>>{{1, 1024}}
             : std::vector<std::pair<int64_t, int64_t>>{{1, 4096}, {8, 1024}, {64, 1024}}) {
    const at::Tensor w = at::randn({B, T, kChannels}, cuda.dtype(at::kFloat));
    const at::Tensor temp = at::rand({kHeads}, cuda) + 0.5;
    const at::Tensor denom_bias = at::randn({kHeads, T}, cuda) * 0.1;
    ExpectClose(std::get<0>(fused::tssa_causal(w, temp, denom_bias, std::nullopt, std::nullopt)),
                std::get<0>(ref::tssa_causal(w, temp, denom_bias, std::nullopt, std::nullopt)),
                "tssa_causal");
    const auto [t_ref, t_fused] = Interleaved(
        reps, [&] { ref::tssa_causal(w, temp, denom_bias, std::nullopt, std::nullopt); },
        [&] { fused::tssa_causal(w, temp, denom_bias, std::nullopt, std::nullopt); });
    std::printf("  %3ld %6ld | %10.3f %10.3f %7.1fx\n", long(B), long(T), t_ref, t_fused,
                t_ref / t_fused);
  }

  std::printf("\ntost::tssa_step (decode, state in place) vs reference, float32\n");
  std::printf("  %4s | %10s %10s %8s\n", "B", "ref us", "fused us", "speedup");
  for (const int64_t B : quick ? std::vector<int64_t>{8} : std::vector<int64_t>{1, 8, 64, 256}) {
    const int64_t context = 1024;
    const at::Tensor w = at::randn({B, kChannels}, cuda);
    const at::Tensor temp = at::rand({kHeads}, cuda) + 0.5;
    const at::Tensor denom_bias = at::randn({kHeads, context}, cuda) * 0.1;
    const at::Tensor positions = at::randint(1, context - 1, {B}, cuda.dtype(at::kLong));
    const at::Tensor state0 = at::rand({B, StateWidth(kChannels, kHeads)}, cuda) * 10;
    at::Tensor s_ref = state0.clone(), s_fused = state0.clone();
    ExpectClose(fused::tssa_step(w, temp, denom_bias, positions, s_fused),
                ref::tssa_step(w, temp, denom_bias, positions, s_ref), "tssa_step");
    ExpectClose(s_fused, s_ref, "tssa_step state");
    // Each timed call continues from the previous state (as decoding does); values stay finite.
    const auto [t_ref, t_fused] = Interleaved(
        reps, [&] { ref::tssa_step(w, temp, denom_bias, positions, s_ref); },
        [&] { fused::tssa_step(w, temp, denom_bias, positions, s_fused); });
    std::printf("  %4ld | %10.1f %10.1f %7.1fx\n", long(B), t_ref * 1e3, t_fused * 1e3,
                t_ref / t_fused);
  }
  if (g_mismatch) std::fprintf(stderr, "tssa_gpu_bench: fused results differ from the reference\n");
  return g_mismatch ? 1 : 0;
}
