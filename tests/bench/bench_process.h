// Process-level helpers of the TSSA benchmark: each measured variant runs in its own child
// process (this executable re-run with --variant=...), so peak memory and allocator state of one
// variant never leak into another.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tost::bench {

struct MemoryStatus {
  int64_t rss_bytes = 0;  // VmRSS
  int64_t hwm_bytes = 0;  // VmHWM: peak resident set since start or the last ResetPeakRss()
};

MemoryStatus ReadMemoryStatus();

// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs, Linux ≥ 4.0). False when the
// kernel refuses.
bool ResetPeakRss();

// How glibc malloc treats large blocks. kRetain keeps freed memory in the heap for reuse (no mmap,
// no trim), as a long-running server's allocator does: repeated calls do not page-fault their
// outputs. kRelease maps every block ≥ 64 KiB separately and unmaps it on free, so the resident set
// follows the live tensors (for peak-memory measurements).
enum class AllocatorMode { kRetain, kRelease };
void ConfigureAllocator(AllocatorMode mode);
// Returns freed heap memory to the system (the next large allocation faults in fresh pages).
void ReleaseFreeMemory();

// Runs this executable with `args`, returns the "key=value" pairs of its stdout line that starts
// with "RESULT". Throws std::runtime_error with the child's exit status and output on failure.
std::map<std::string, double> RunChild(const std::vector<std::string>& args);

// The line a child prints for RunChild.
std::string ResultLine(const std::map<std::string, double>& values);

}  // namespace tost::bench
