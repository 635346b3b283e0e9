// Where a model runs and in which precision: the server's --device/--dtype and a model's
// config.json "serving" object, resolved against the CUDA devices the process sees. Torch-free
// (the service and its tests use it without LibTorch); the model code turns a Placement into
// LibTorch device and dtype options.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace tost::model {

// "auto" (the first CUDA device when there is one, else the CPU), "cpu", "cuda" (= cuda:0) or
// "cuda:N".
struct DeviceSpec {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = 0;  // kCuda only

  std::string ToString() const;
};

// Weights and activations on a CUDA device; TSSA statistics and reductions are float32 always.
// On the CPU models run in float32 whatever is asked (the CPU kernels are float32 kernels).
enum class ComputeDtype { kFloat32, kBFloat16, kFloat16 };
const char* ComputeDtypeName(ComputeDtype d);

// Parse errors are INVALID_ARGUMENT naming `field` (a flag or a config.json key) and quoting the
// text received.
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text, absl::string_view field);
absl::StatusOr<ComputeDtype> ParseComputeDtype(absl::string_view text, absl::string_view field);

// A model's resolved place: a CUDA device index or the CPU, and the dtype it computes in.
struct Placement {
  bool cuda = false;
  int index = 0;
  ComputeDtype dtype = ComputeDtype::kFloat32;
  // CUDA only: decode steps replayed from CUDA graphs captured per batch bucket (--cuda_graphs);
  // off, they run eagerly at the same padded shapes (decode_buckets.h).
  bool decode_graphs = true;
  // Decode steps at bucket batch sizes with scratch rows: always on CUDA; on the CPU only when set
  // (tests of the padded path, which the CPU otherwise has no use for).
  bool pad_decode_steps = false;
  // Decode steps draw their tokens where the logits are (device_sampler.h): always on CUDA; on
  // the CPU only when set (tests of that path; the host draw is the reference and cheaper there).
  bool draw_on_device = false;

  std::string DeviceString() const;  // "cpu" or "cuda:N"
};

// The server's choice, overridden per model by config.json's "serving" object. FAILED_PRECONDITION
// when CUDA is asked for (explicitly) and the process sees no such device, naming the model (empty
// for the server's own flags) and what was asked and what there is.
absl::StatusOr<Placement> ResolvePlacement(const DeviceSpec& server_device,
                                           ComputeDtype server_dtype,
                                           const std::optional<DeviceSpec>& model_device,
                                           const std::optional<ComputeDtype>& model_dtype,
                                           int cuda_device_count, absl::string_view model_name);

}  // namespace tost::model
