// Where a model runs and in which precision: the server's --device/--dtype and a model's
// config.json "serving" object, resolved against the CUDA devices the process sees. Torch-free
// (the service and its tests use it without LibTorch); the model code turns a Placement into
// LibTorch device and dtype options.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tost::model {

// "auto" (the first CUDA device when there is one, else the CPU), "cpu", "cuda" (= cuda:0) or
// "cuda:N".
struct DeviceSpec {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = 0;  // kCuda only

  std::string ToString() const;
};

// On a CUDA device: the dtype of weights and activations. On the CPU: the dtype the dense layers'
// weights (and the tied embedding) are stored in, converted at load from the file's weights;
// activations, norms, softmaxes and the TSSA kernels stay float32 there (the CPU TSSA kernels are
// float32 kernels). TSSA statistics and reductions are float32 everywhere, so a state blob is the
// same whatever the dtype. kInt8 is the CPU only (weight-only quantisation, CpuProducts::kInt8);
// ResolvePlacement refuses it on CUDA.
enum class ComputeDtype { kFloat32, kBFloat16, kFloat16, kInt8 };
const char* ComputeDtypeName(ComputeDtype d);

// How the CPU multiplies activations by weights stored in reduced precision:
//   kFloat32       fp32 weights, fp32 products (MKL);
//   kOneDnnBf16    bf16 weights in oneDNN's packed layout, activations cast to bf16 for the
//                  product (AVX-512: native with avx512_bf16 or AMX, emulated by oneDNN otherwise);
//   kHalfGemv      fp16 weights; one or two rows through LibTorch's fp16 matrix-vector product
//                  (F16C conversions, fp32 accumulation), more rows widen the weight to fp32 for
//                  the product (oneDNN has no fp16 products without avx512_fp16/AMX-FP16);
//   kWiden         bf16 or fp16 weights widened to fp32 for every product: correct everywhere,
//                  the path of CPUs without AVX-512 for bf16 (it halves the memory only);
//   kInt8          int8 weights [out, in] with a float32 scale per output channel (symmetric,
//                  absmax/127, computed at load from the float32 weights), activations cast to
//                  bf16 for the product only: up to kInt8PackRows rows through LibTorch's
//                  int8-weight matrix product (it reads the int8 weights as stored), more rows
//                  widen the weight to bf16 for a oneDNN product (linear_layer.h has the
//                  measurements).
enum class CpuProducts { kFloat32, kOneDnnBf16, kHalfGemv, kWiden, kInt8 };
const char* CpuProductsName(CpuProducts p);
// The path this CPU takes for weights in `dtype` (its instructions, checked at run time).
CpuProducts CpuProductsFor(ComputeDtype dtype);
// This CPU's instructions that decide the path, for the start-up log ("avx512_bf16 f16c ...").
std::string CpuPrecisionFlags();
// AMX tiles with bf16, usable (CPUID leaf 7: AMX-BF16 and AMX-TILE), unless ATEN_CPU_CAPABILITY
// caps the CPU below AVX-512: where oneDNN's bf16 products run on tiles.
bool CpuHasAmxBf16();

// Parse errors are INVALID_ARGUMENT naming `field` (a flag or a config.json key) and quoting the
// text received. ParseComputeDtype takes fp32, bf16, fp16 and int8 (and their long names).
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
  // CPU only: how products with the weights run. ResolvePlacement sets CpuProductsFor(dtype);
  // tests may pick another path (kWiden, the fallback of CPUs without AVX-512). kFloat32 with a
  // reduced dtype (a Placement built by hand) means CpuProductsFor(dtype).
  CpuProducts cpu_products = CpuProducts::kFloat32;
  // CPU only: decode steps of at most this many sequences run through the lean decode step
  // (model/nets/lean_decoder.h) instead of LibTorch operators, and every batch-invariant step;
  // -1: the language model's own limit for the dtype, 0: never (tests and benchmarks compare the
  // two paths).
  int64_t cpu_lean_decode_max_rows = -1;

  std::string DeviceString() const;  // "cpu" or "cuda:N"
  // The CPU product path these weights take (kFloat32 at fp32).
  CpuProducts CpuProductsUsed() const;
};

// The server's choice, overridden per model by config.json's "serving" object. FAILED_PRECONDITION
// when CUDA is asked for (explicitly) and the process sees no such device, naming the model (empty
// for the server's own flags) and what was asked and what there is; INVALID_ARGUMENT when int8 is
// asked for on a CUDA device, naming the model, the field (--dtype or serving.dtype) and the
// dtypes CUDA allows; FAILED_PRECONDITION when the dtype is not among `allowed_dtypes` (the
// model's serving.dtypes; empty: any), naming the model, the dtype, its field and the list.
absl::StatusOr<Placement> ResolvePlacement(const DeviceSpec& server_device,
                                           ComputeDtype server_dtype,
                                           const std::optional<DeviceSpec>& model_device,
                                           const std::optional<ComputeDtype>& model_dtype,
                                           int cuda_device_count, absl::string_view model_name,
                                           absl::Span<const ComputeDtype> allowed_dtypes = {});

}  // namespace tost::model
