#include "base/thread_name.h"

#include <pthread.h>

#include <algorithm>
#include <string>

namespace tost {

void NameThisThread(std::string_view name) {
#if defined(__linux__)
  constexpr size_t kMaxBytes = 15;  // TASK_COMM_LEN less the terminating zero
  size_t n = std::min(name.size(), kMaxBytes);
  // Not inside a multi-byte character: back up to the start of the one the cut would split.
  while (n > 0 && n < name.size() && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80) --n;
  const std::string cut(name.substr(0, n));
  pthread_setname_np(pthread_self(), cut.c_str());
#else
  (void)name;
#endif
}

}  // namespace tost
