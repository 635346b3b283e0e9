#include "model/config/device.h"

#include <charconv>

#include "absl/strings/str_cat.h"

namespace tost::model {
namespace {

std::string Quoted(absl::string_view text) {
  // Flags and config values are short; a long one is cut so the message stays readable.
  constexpr size_t kMax = 64;
  if (text.size() <= kMax) return absl::StrCat("\"", text, "\"");
  return absl::StrCat("\"", text.substr(0, kMax), "...\" (", text.size(), " bytes)");
}

}  // namespace

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kAuto:
      return "auto";
    case Kind::kCpu:
      return "cpu";
    case Kind::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return "?";
}

const char* ComputeDtypeName(ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFloat32:
      return "fp32";
    case ComputeDtype::kBFloat16:
      return "bf16";
    case ComputeDtype::kFloat16:
      return "fp16";
  }
  return "?";
}

std::string Placement::DeviceString() const {
  return cuda ? absl::StrCat("cuda:", index) : std::string("cpu");
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text, absl::string_view field) {
  DeviceSpec spec;
  if (text == "auto") return spec;
  if (text == "cpu") {
    spec.kind = DeviceSpec::Kind::kCpu;
    return spec;
  }
  if (text == "cuda") {
    spec.kind = DeviceSpec::Kind::kCuda;
    return spec;
  }
  constexpr absl::string_view kPrefix = "cuda:";
  if (text.substr(0, kPrefix.size()) == kPrefix) {
    const absl::string_view digits = text.substr(kPrefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0) {
      spec.kind = DeviceSpec::Kind::kCuda;
      spec.index = index;
      return spec;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected auto, cpu, cuda or cuda:N (N a device index), got ", Quoted(text)));
}

absl::StatusOr<ComputeDtype> ParseComputeDtype(absl::string_view text, absl::string_view field) {
  if (text == "fp32" || text == "float32") return ComputeDtype::kFloat32;
  if (text == "bf16" || text == "bfloat16") return ComputeDtype::kBFloat16;
  if (text == "fp16" || text == "float16") return ComputeDtype::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected fp32, bf16 or fp16, got ", Quoted(text)));
}

absl::StatusOr<Placement> ResolvePlacement(const DeviceSpec& server_device,
                                           ComputeDtype server_dtype,
                                           const std::optional<DeviceSpec>& model_device,
                                           const std::optional<ComputeDtype>& model_dtype,
                                           int cuda_device_count, absl::string_view model_name) {
  const DeviceSpec& spec = model_device.has_value() ? *model_device : server_device;
  const std::string who =
      model_device.has_value()
          ? absl::StrCat("model \"", model_name, "\" (config.json serving.device)")
          : (model_name.empty() ? std::string("--device")
                                : absl::StrCat("model \"", model_name, "\" (--device)"));
  Placement p;
  switch (spec.kind) {
    case DeviceSpec::Kind::kAuto:
      p.cuda = cuda_device_count > 0;
      break;
    case DeviceSpec::Kind::kCpu:
      break;
    case DeviceSpec::Kind::kCuda:
      if (spec.index >= cuda_device_count) {
        return absl::FailedPreconditionError(absl::StrCat(
            who, " asks for ", spec.ToString(), " but this process sees ", cuda_device_count,
            " CUDA device(s)",
            cuda_device_count == 0
                ? " (no driver or no GPU; use --device=cpu or auto to serve on the CPU)"
                : absl::StrCat(" (cuda:0 to cuda:", cuda_device_count - 1, ")")));
      }
      p.cuda = true;
      p.index = spec.index;
      break;
  }
  // The CPU kernels are float32 kernels: bf16/fp16 apply to CUDA devices only.
  p.dtype =
      p.cuda ? (model_dtype.has_value() ? *model_dtype : server_dtype) : ComputeDtype::kFloat32;
  return p;
}

}  // namespace tost::model
