// Which instruction set the fused CPU TSSA kernels run with.
//
// The row kernels are compiled for DEFAULT (portable C++), AVX2 and AVX-512 (x86-64 builds only);
// the active one follows LibTorch's own choice (at::get_cpu_capability(), which honours the
// ATEN_CPU_CAPABILITY environment variable), limited to what this CPU and this build support.
// Tests and the benchmark may name an ISA explicitly to compare the variants.
#pragma once

#include <string_view>
#include <vector>

#include "kernels/cpu/decode_kernels.h"
#include "kernels/cpu/row_kernels.h"

namespace tost::kernels::cpu {

enum class CpuIsa { kDefault, kAvx2, kAvx512 };

std::string_view CpuIsaName(CpuIsa isa);

// The ISAs compiled into this build that this CPU can run, DEFAULT first.
const std::vector<CpuIsa>& AvailableCpuIsas();

// The ISA used when a caller names none.
CpuIsa ActiveCpuIsa();

// The kernel table of `isa`; throws c10::Error naming the ISA when it is not available here.
template <typename T>
const RowKernels<T>& KernelsFor(CpuIsa isa);

// Whether this build and CPU have AVX-512 with the BF16 and VNNI dot-product instructions.
bool CpuHasDotProducts();

// The lean decode step's kernel table of `isa`: at AVX-512 the dot-product table
// (DecodeKernelsAvx512Dot) where CpuHasDotProducts() and `dot_products` allows it. Throws like
// KernelsFor.
const DecodeKernels& DecodeKernelsFor(CpuIsa isa, bool dot_products = true);

// How the lean decode step multiplies int8 weights with `isa` (and `dot_products` as above):
// "vnni-quads" (AVX-512 VNNI), "fp32-tiles" (AVX2 and AVX-512 without VNNI: widened into float32
// tiles that many rows share) or "widening" (DEFAULT). For the start-up log.
std::string_view Int8ProductsName(CpuIsa isa, bool dot_products = true);

// DecodeKernelsFor's table with the widening product at every row count (DecodeKernels*Widening),
// to compare the int8 tiles against. Throws like KernelsFor.
const DecodeKernels& WideningDecodeKernelsFor(CpuIsa isa);

}  // namespace tost::kernels::cpu
