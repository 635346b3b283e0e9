// A SIMT emulator for the CUDA TSSA kernels: the kernel sources, compiled as host C++ (see
// cuda_emulation.h), run on the CPU with the checks a GPU sanitizer would make.
//
// Execution: blocks run one at a time in a seeded random order (a kernel never waits for another
// block, so any order is a legal schedule); every thread of a block is a cooperative fiber
// (Boost.Context fcontext) that runs until it reaches a synchronisation point, and the next fiber
// is picked at random among the runnable ones. __syncthreads is a barrier over the block;
// __syncwarp and the shuffles are rendezvous of exactly their mask's lanes and order only those.
//
// Checks, each report naming the kernel, block, thread and address:
//   * races: every load and store of the kernel code calls a hook (clang
//     -fsanitize-coverage=trace-loads,trace-stores). Per 2-byte unit of memory the emulator keeps
//     the last writer and the readers since the last barrier; an access is ordered after an earlier
//     one of another thread only by a barrier between them or, within a warp, by a warp
//     synchronisation (shuffle or __syncwarp) whose mask held both lanes (lane vector clocks).
//     Two blocks touching one global unit in a launch, one of them writing, is a race too.
//   * out-of-bounds: AddressSanitizer (fiber switches are annotated), with the guards between the
//     buffers carved from a workspace poisoned;
//   * uninitialised reads: a written bit per 2-byte unit of shared memory (fresh for every block)
//     and of every workspace buffer (fresh for every operator call);
//   * barriers not reached by every thread and shuffles whose mask lanes do not all arrive are
//     reported, not hangs; a shuffle by a lane outside its mask or reading a lane outside it too.
// Launches are refused as a device refuses them: block above the kernel's launch bound or 1024
// threads, grid above 2^31-1 x 65535 x 65535, dynamic shared memory above 48 KiB without opt-in.
//
// Not modelled: timing, coalescing, the real warp scheduler, memory-model subtleties below the
// barrier level. The emulator proves indexing, synchronisation and reductions; arithmetic matches
// the device up to FMA contraction and libm (device expf is within 2 ulp), so it is never a bitwise
// oracle for a GPU.
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>

namespace tost::emu {

// -- Configuration (tests) ------------------------------------------------------------------------

struct Options {
  uint64_t seed = 1;       // block and fiber order
  size_t max_reports = 8;  // kept per launch and kind of report; the rest are counted
};
void SetOptions(const Options& options);
Options GetOptions();

// Faults injected into the real kernels, to show each checker catches what it claims to. Kernel
// names match a substring of the launched kernel's name ("CausalStatsKernel").
struct Faults {
  // The n-th (1-based) distinct __syncthreads of `skip_barrier_kernel`, in the order first reached.
  std::string skip_barrier_kernel;
  int skip_barrier_ordinal = 0;
  // Lane removed from the mask of every shuffle and __syncwarp of `drop_lane_kernel`.
  std::string drop_lane_kernel;
  int drop_lane = -1;
  // Block of `widen_block_kernel` launched with `widen_block_factor` times its threads.
  std::string widen_block_kernel;
  int widen_block_factor = 1;
  // The workspace buffer of this name is carved one float shorter than the kernels use.
  std::string shrink_workspace_buffer;
};
void SetFaults(const Faults& faults);

// -- Results --------------------------------------------------------------------------------------

// Text of every report of the last launch that failed a check (empty after a clean launch); the
// launch returned cudaErrorLaunchFailure. Reset by the next launch.
std::string LastLaunchReport();
// Reports since the last call, all launches (tests of the checkers read these).
std::vector<std::string> TakeReports();
// Launches and threads run since the start of the process.
struct Counters {
  uint64_t launches = 0;
  uint64_t blocks = 0;
  uint64_t threads = 0;
  uint64_t fiber_switches = 0;
  uint64_t tracked_accesses = 0;
};
Counters GetCounters();
// Human-readable text of a launch error (the emulator's own; libcudart is not linked).
const char* ErrorName(cudaError_t error);

// -- Device memory --------------------------------------------------------------------------------

// A workspace allocation of `bytes`: poisoned for AddressSanitizer until WorkspaceBuffer carves
// buffers from it (the buffers of the previous workspace are forgotten). Call before the
// operator's launches; the memory stays owned by the caller.
void RegisterWorkspace(void* base, size_t bytes);
void* WorkspaceBuffer(void* p, size_t bytes, const char* name);

// -- Called by the emulated kernel code (cuda_emulation.h) ----------------------------------------

cudaError_t RunKernel(std::string_view kernel, int max_threads, dim3 grid, dim3 block,
                      size_t shared_bytes, const std::function<void()>& body);
uint3 ThreadIdx();
uint3 BlockIdx();
dim3 BlockDim();
dim3 GridDim();
void* DynamicSharedMemory();
void SyncThreads(int line);
void SyncWarp(unsigned mask, int line);
uint32_t ShuffleXor(unsigned mask, uint32_t value, int lane_mask, int width, int line);

}  // namespace tost::emu
