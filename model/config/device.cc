#include "model/config/device.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
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
    case ComputeDtype::kInt8:
      return "int8";
  }
  return "?";
}

namespace {
const char* Int8ProductsName();
}  // namespace

const char* CpuProductsName(CpuProducts p) {
  switch (p) {
    case CpuProducts::kFloat32:
      return "fp32";
    case CpuProducts::kOneDnnBf16:
      return "onednn-bf16";
    case CpuProducts::kHalfGemv:
      return "fp16-gemv";
    case CpuProducts::kWiden:
      return "widen-to-fp32";
    case CpuProducts::kInt8:
      return Int8ProductsName();
  }
  return "?";
}

namespace {

struct CpuFlags {
  bool avx2 = false;         // with FMA and F16C: the kernels' AVX2 build
  bool avx512_core = false;  // what oneDNN needs for bf16 products at all
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool amx_bf16 = false;
  bool f16c = false;
  std::string capped_by;  // the environment variable that capped the flags below the CPU's
};

CpuFlags DetectCpuFlags() {
  CpuFlags f;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  f.avx512_core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // CPUID directly for these four: clang's __builtin_cpu_supports does not know their names.
  // Each needs the OS to save the vector registers it uses, which avx512f and avx imply.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.avx512_core && ((a >> 5) & 1);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.amx_bf16 = ((d >> 22) & 1) && ((d >> 24) & 1);  // AMX-BF16 and AMX-TILE
    f.avx512_vnni = f.avx512_core && ((c >> 11) & 1);
  }
  if (__get_cpuid(1, &a, &b, &c, &d)) f.f16c = __builtin_cpu_supports("avx") && ((c >> 29) & 1);
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f.f16c;
#endif
  // LibTorch's ATEN_CPU_CAPABILITY caps its own kernels and the project's CPU kernels
  // (kernels/cpu/isa.h) to an instruction set below the CPU's; the products chosen here follow the
  // same cap, so that "avx2" on an AVX-512 CPU runs (and names) what an AVX2 CPU would.
  if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY"); cap != nullptr) {
    const std::string v = absl::AsciiStrToLower(cap);
    if (v == "avx2" || v == "default") {
      f.avx512_core = f.avx512_bf16 = f.avx512_vnni = f.amx_bf16 = false;
      f.capped_by = absl::StrCat("ATEN_CPU_CAPABILITY=", cap);
    }
    if (v == "default") f.avx2 = false;
  }
  return f;
}

const CpuFlags& Flags() {
  static const CpuFlags flags = DetectCpuFlags();
  return flags;
}

// int8's name in the start-up log, with how the lean decode step multiplies the weights on this
// CPU (kernels/cpu/isa.h Int8ProductsName): AVX-512 VNNI's quads, float32 tiles at AVX2 and
// AVX-512 without BF16/VNNI, or the portable widening product.
const char* Int8ProductsName() {
  const CpuFlags& f = Flags();
  if (f.avx512_bf16 && f.avx512_vnni) return "int8-weights/vnni-quads";
  return f.avx2 ? "int8-weights/fp32-tiles" : "int8-weights/widening";
}

}  // namespace

CpuProducts CpuProductsFor(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
      return CpuProducts::kFloat32;
    case ComputeDtype::kBFloat16:
      return Flags().avx512_core ? CpuProducts::kOneDnnBf16 : CpuProducts::kWiden;
    case ComputeDtype::kFloat16:
      return CpuProducts::kHalfGemv;
    case ComputeDtype::kInt8:
      return CpuProducts::kInt8;
  }
  return CpuProducts::kWiden;
}

bool CpuHasAmxBf16() { return Flags().amx_bf16; }

std::string CpuPrecisionFlags() {
  const CpuFlags& f = Flags();
  std::string out;
  const auto add = [&](bool on, const char* name) {
    absl::StrAppend(&out, out.empty() ? "" : " ", on ? "" : "no-", name);
  };
  add(f.avx512_core, "avx512");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.amx_bf16, "amx_bf16");
  add(f.f16c, "f16c");
  add(f.avx2, "avx2");
  if (!f.capped_by.empty()) absl::StrAppend(&out, " (capped by ", f.capped_by, ")");
  return out;
}

CpuProducts Placement::CpuProductsUsed() const {
  if (dtype == ComputeDtype::kFloat32) return CpuProducts::kFloat32;
  return cpu_products == CpuProducts::kFloat32 ? CpuProductsFor(dtype) : cpu_products;
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
  if (text == "int8") return ComputeDtype::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected fp32, bf16, fp16 or int8, got ", Quoted(text)));
}

absl::StatusOr<Placement> ResolvePlacement(const DeviceSpec& server_device,
                                           ComputeDtype server_dtype,
                                           const std::optional<DeviceSpec>& model_device,
                                           const std::optional<ComputeDtype>& model_dtype,
                                           int cuda_device_count, absl::string_view model_name,
                                           absl::Span<const ComputeDtype> allowed_dtypes) {
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
  // fp32, bf16 and fp16 are served on both kinds of device: on the CPU they are the weights'
  // storage (device.h), each precision with the product path this CPU makes fastest.
  p.dtype = model_dtype.has_value() ? *model_dtype : server_dtype;
  if (!allowed_dtypes.empty() &&
      std::find(allowed_dtypes.begin(), allowed_dtypes.end(), p.dtype) == allowed_dtypes.end()) {
    // config.json cannot name a serving.dtype outside its serving.dtypes: the server's --dtype did.
    std::string allowed;
    for (ComputeDtype d : allowed_dtypes) {
      absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", ComputeDtypeName(d));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "model \"", model_name, "\" (--dtype): ", ComputeDtypeName(p.dtype),
        " is not among the precisions this model allows (config.json serving.dtypes: ", allowed,
        "); serve it at one of those (serving.dtype sets it for this model alone)"));
  }
  if (p.cuda && p.dtype == ComputeDtype::kInt8) {
    // int8 is a CPU storage format here (weight-only products through the CPU's kernels); the
    // CUDA path computes in the weights' dtype and has no int8 kernels.
    const bool per_model = model_dtype.has_value();
    const std::string field = per_model ? "config.json serving.dtype" : "--dtype";
    const std::string who =
        model_name.empty() ? field : absl::StrCat("model \"", model_name, "\" (", field, ")");
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": int8 is served on the CPU only, but the ", model_name.empty() ? "server" : "model",
        "'s device is ", p.DeviceString(), "; expected fp32, bf16 or fp16 on CUDA (or ",
        model_device.has_value() || per_model ? "serving.device \"cpu\"" : "--device=cpu",
        " for int8)"));
  }
  if (!p.cuda) p.cpu_products = CpuProductsFor(p.dtype);
  return p;
}

}  // namespace tost::model
