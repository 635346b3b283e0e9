#include "service/observability/process_memory.h"

#include <unistd.h>

#include <cstdio>

namespace tost::service {

int64_t ResidentMemoryBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size_pages = 0, resident_pages = 0;
  const int n = std::fscanf(f, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(f);
  return n == 2 ? resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace tost::service
