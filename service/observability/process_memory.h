// This process's resident memory, as the kernel counts it: the metrics' gauge and the heap
// trimmer's before/after both read it.
#pragma once

#include <cstdint>

namespace tost::service {

// Resident bytes of this process (/proc/self/statm); 0 when it cannot be read.
int64_t ResidentMemoryBytes();

}  // namespace tost::service
