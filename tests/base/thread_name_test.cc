// NameThisThread: the name /proc shows for the thread, cut to Linux's 15 bytes at a character's
// start.
#include "base/thread_name.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace tost {
namespace {

// The name of `name`d new thread, as the kernel reports it.
std::string NameOfThreadNamed(const std::string& name) {
  std::string seen;
  std::thread([&] {
    NameThisThread(name);
    std::ifstream comm(absl::StrCat("/proc/self/task/", ::gettid(), "/comm"));
    std::getline(comm, seen);
  }).join();
  return seen;
}

TEST(NameThisThreadTest, TheKernelShowsTheName) {
  EXPECT_EQ(NameOfThreadNamed("step:bench-lm"), "step:bench-lm");
}

TEST(NameThisThreadTest, ALongNameIsCutAtFifteenBytes) {
  EXPECT_EQ(NameOfThreadNamed("step:tost-austen-int8"), "step:tost-auste");
}

TEST(NameThisThreadTest, TheCutDoesNotSplitACharacter) {
  // 13 ASCII bytes, then "é" (2 bytes) would end at byte 15; "€" (3 bytes) would not fit.
  EXPECT_EQ(NameOfThreadNamed("abcdefghijklm\xC3\xA9x"), "abcdefghijklm\xC3\xA9");
  EXPECT_EQ(NameOfThreadNamed("abcdefghijklm\xE2\x82\xACx"), "abcdefghijklm");
}

}  // namespace
}  // namespace tost
