#include "kernels/cpu/isa.h"

#if defined(TOST_CPU_X86_ISAS)
#include <cpuid.h>
#endif

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace tost::kernels::cpu {
namespace {

bool CpuSupports(CpuIsa isa) {
#if defined(TOST_CPU_X86_ISAS)
  switch (isa) {
    case CpuIsa::kDefault:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512:
      // The set LibTorch's own AVX512 kernels need (vec512 uses BW/DQ/VL instructions).
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  return false;
#else
  return isa == CpuIsa::kDefault;
#endif
}

std::vector<CpuIsa> DetectAvailable() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kDefault, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

bool IsAvailable(CpuIsa isa) {
  const auto& isas = AvailableCpuIsas();
  return std::find(isas.begin(), isas.end(), isa) != isas.end();
}

CpuIsa DetectActive() {
  const std::string torch_choice = at::get_cpu_capability();
  CpuIsa wanted = CpuIsa::kDefault;
  if (torch_choice == "AVX512") {
    wanted = CpuIsa::kAvx512;
  } else if (torch_choice == "AVX2") {
    wanted = CpuIsa::kAvx2;
  }
  // LibTorch may pick an ISA this build did not compile (non-x86 builds): fall back downwards.
  while (!IsAvailable(wanted)) wanted = static_cast<CpuIsa>(static_cast<int>(wanted) - 1);
  return wanted;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kDefault:
      return "DEFAULT";
    case CpuIsa::kAvx2:
      return "AVX2";
    case CpuIsa::kAvx512:
      return "AVX512";
  }
  return "unknown";
}

const std::vector<CpuIsa>& AvailableCpuIsas() {
  static const std::vector<CpuIsa> isas = DetectAvailable();
  return isas;
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa isa = DetectActive();
  return isa;
}

template <typename T>
const RowKernels<T>& KernelsFor(CpuIsa isa) {
  TORCH_CHECK(IsAvailable(isa), "tost CPU kernels: instruction set ", CpuIsaName(isa),
              " is not available (not compiled into this build or not supported by this CPU)");
  switch (isa) {
#if defined(TOST_CPU_X86_ISAS)
    case CpuIsa::kAvx512:
      return RowKernelsAvx512<T>();
    case CpuIsa::kAvx2:
      return RowKernelsAvx2<T>();
#endif
    default:
      return RowKernelsDefault<T>();
  }
}

bool CpuHasDotProducts() {
#if defined(TOST_CPU_X86_ISAS)
  // CPUID directly: not every compiler's __builtin_cpu_supports knows these names. AVX-512 BF16
  // is leaf 7, subleaf 1, EAX bit 5; AVX-512 VNNI leaf 7, subleaf 0, ECX bit 11.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
    const bool vnni = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1);
    return IsAvailable(CpuIsa::kAvx512) && bf16 && vnni;
  }();
  return has;
#else
  return false;
#endif
}

const DecodeKernels& DecodeKernelsFor(CpuIsa isa, bool dot_products) {
  TORCH_CHECK(IsAvailable(isa), "tost CPU decode kernels: instruction set ", CpuIsaName(isa),
              " is not available (not compiled into this build or not supported by this CPU)");
  switch (isa) {
#if defined(TOST_CPU_X86_ISAS)
    case CpuIsa::kAvx512:
      return dot_products && CpuHasDotProducts() ? DecodeKernelsAvx512Dot() : DecodeKernelsAvx512();
    case CpuIsa::kAvx2:
      return DecodeKernelsAvx2();
#endif
    default:
      return DecodeKernelsDefault();
  }
}

std::string_view Int8ProductsName(CpuIsa isa, bool dot_products) {
  if (isa == CpuIsa::kAvx512 && dot_products && CpuHasDotProducts()) return "vnni-quads";
  return isa == CpuIsa::kDefault ? "widening" : "fp32-tiles";
}

const DecodeKernels& WideningDecodeKernelsFor(CpuIsa isa) {
  TORCH_CHECK(IsAvailable(isa), "tost CPU decode kernels: instruction set ", CpuIsaName(isa),
              " is not available (not compiled into this build or not supported by this CPU)");
  switch (isa) {
#if defined(TOST_CPU_X86_ISAS)
    case CpuIsa::kAvx512:
      return DecodeKernelsAvx512Widening();
    case CpuIsa::kAvx2:
      return DecodeKernelsAvx2Widening();
#endif
    default:
      return DecodeKernelsDefaultWidening();
  }
}

template const RowKernels<float>& KernelsFor<float>(CpuIsa);
template const RowKernels<double>& KernelsFor<double>(CpuIsa);
template const RowKernels<c10::Half>& KernelsFor<c10::Half>(CpuIsa);
template const RowKernels<c10::BFloat16>& KernelsFor<c10::BFloat16>(CpuIsa);

}  // namespace tost::kernels::cpu
