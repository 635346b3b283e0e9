// In-process classification: the server's own VisionModel (same loader, same LibTorch forward, one
// intra-op thread as tost_server runs by default) called directly in a loop at fixed batch sizes,
// with no gRPC, no batcher and no tensor conversion. Throughput and latency through tost_server at
// the same batch size divided by these is the server's overhead.
//
// Prints one JSON object: per batch size, forwards timed, latency percentiles (ms), images/s, and
// the forward's least memory traffic (weights once, pixels in, logits out) per second as a
// fraction of the device's measured copy bandwidth: a lower bound of the traffic, so the fraction
// says how far from memory-bound the forward is (a vision forward is compute-bound).
// --device/--dtype place the model as tost_server's flags do (Forward returns host logits, so each
// timed forward includes waiting for the device).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "model/config/config.h"
#include "model/config/device.h"
#include "model/device/device_memory.h"
#include "model/nets/torch_device.h"
#include "model/nets/torch_threads.h"
#include "model/nets/vision_model.h"
#include "tests/bench/device_bandwidth.h"

ABSL_FLAG(std::string, model_dir, "models/tost-digits", "Vision model directory");
ABSL_FLAG(std::string, batch_sizes, "1,8", "Comma-separated images per forward");
ABSL_FLAG(double, seconds, 3, "Timed seconds per batch size (after a warm-up of 0.5 s)");
ABSL_FLAG(int, intra_op_threads, 1, "LibTorch intra-op threads (tost_server's default is 1)");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model runs: cpu, cuda, cuda:N or auto (as tost_server)");
ABSL_FLAG(std::string, dtype, "fp32", "Weights and activations on CUDA: fp32, bf16 or fp16");

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::max(1.0, std::ceil(p / 100.0 * v.size() - 1e-9)));
  return v[std::min(rank, v.size()) - 1];
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  tost::model::SetTorchThreads(absl::GetFlag(FLAGS_intra_op_threads));
  auto config = tost::model::LoadModelConfig(dir);
  if (!config.ok()) {
    std::fprintf(stderr, "classify_forward_bench: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  auto spec = tost::model::ParseDeviceSpec(absl::GetFlag(FLAGS_device), "--device");
  auto dtype = tost::model::ParseComputeDtype(absl::GetFlag(FLAGS_dtype), "--dtype");
  absl::StatusOr<tost::model::Placement> placement =
      !spec.ok()    ? spec.status()
      : !dtype.ok() ? dtype.status()
                    : tost::model::ResolvePlacement(*spec, *dtype, std::nullopt, std::nullopt,
                                                    tost::model::CudaDeviceCount(), "");
  if (!placement.ok()) {
    std::fprintf(stderr, "classify_forward_bench: %s\n",
                 std::string(placement.status().message()).c_str());
    return 2;
  }
  tost::model::DisableTf32();
  auto model = tost::model::VisionModel::Load(dir, *config, *placement);
  if (!model.ok()) {
    std::fprintf(stderr, "classify_forward_bench: %s\n",
                 std::string(model.status().message()).c_str());
    return 2;
  }
  const auto& v = config->vision;
  nlohmann::json out;
  out["model_dir"] = dir;
  out["intra_op_threads"] = absl::GetFlag(FLAGS_intra_op_threads);
  out["device"] = placement->DeviceString();
  out["dtype"] = tost::model::ComputeDtypeName(placement->dtype);
  out["input_shape"] = {v.in_chans, v.image_height, v.image_width};
  const double bandwidth_gbs =
      tost::bench::MeasureCopyBandwidthGBs(tost::model::TorchDevice(*placement));
  out["device_copy_bandwidth_gbs"] = bandwidth_gbs;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_batch_sizes), ',')) {
    int64_t batch = 0;
    if (!absl::SimpleAtoi(item, &batch) || batch < 1) {
      std::fprintf(stderr,
                   "classify_forward_bench: --batch_sizes expects positive integers, got '%s'\n",
                   std::string(item).c_str());
      return 2;
    }
    std::vector<float> pixels(batch * v.in_chans * v.image_height * v.image_width);
    for (float& x : pixels) x = normal(rng);
    const auto run = [&] {
      auto logits = (*model)->Forward(pixels, batch, v.image_height, v.image_width);
      if (!logits.ok()) {
        std::fprintf(stderr, "classify_forward_bench: %s\n",
                     std::string(logits.status().message()).c_str());
        std::exit(1);
      }
    };
    for (Clock::time_point end = Clock::now() + std::chrono::milliseconds(500); Clock::now() < end;)
      run();
    std::vector<double> ms;
    const Clock::time_point start = Clock::now();
    const auto budget = std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
    while (Clock::now() - start < budget) {
      const Clock::time_point t0 = Clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
    const double min_bytes = static_cast<double>((*model)->ForwardMinBytes(batch));
    const double min_gbs = min_bytes * static_cast<double>(ms.size()) / total_s / 1e9;
    out["batches"][std::string(item)] = {
        {"batch_size", batch},
        {"forwards", ms.size()},
        {"latency_ms", {{"p50", Percentile(ms, 50)}, {"p99", Percentile(ms, 99)}}},
        {"images_per_s", static_cast<double>(ms.size() * batch) / total_s},
        {"min_bytes_per_forward", min_bytes},
        {"min_traffic_gbs", min_gbs},
        {"fraction_of_bandwidth", min_gbs / bandwidth_gbs}};
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the server's VisionModel forward in-process at fixed batch sizes (no gRPC, no "
      "batcher); prints JSON.");
  absl::ParseCommandLine(argc, argv);
  return Main();
}
