// Helpers shared by the libFuzzer targets of tests/fuzz (built and run by scripts/run-fuzzers.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

// A property the code under test promises. When it does not hold the input is a finding: print
// what failed and abort, so that libFuzzer saves the input as a reproducer.
#define TOST_FUZZ_CHECK(cond)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "tost fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace tost::fuzz {

inline std::string_view Bytes(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Splits `s` at NUL bytes into at most `parts` pieces (the last keeps any further NULs). The
// targets that take several files use NUL as separator: no text format they parse needs it.
inline std::vector<std::string_view> SplitAtNul(std::string_view s, size_t parts) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t nul = s.find('\0');
    if (nul == std::string_view::npos) break;
    out.push_back(s.substr(0, nul));
    s.remove_prefix(nul + 1);
  }
  out.push_back(s);
  return out;
}

// A file of the source tree (the fixtures some targets build on), relative to $TOST_SOURCE_DIR or,
// without it, to the current directory (scripts/run-fuzzers.sh runs the targets from the
// repository root). A missing file is a setup error, not a finding: it exits with status 2.
inline std::string ReadSourceFile(const std::string& relative) {
  const char* root = std::getenv("TOST_SOURCE_DIR");
  const std::string path =
      (root != nullptr && *root != '\0' ? std::string(root) + "/" : "") + relative;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr,
                 "tost fuzz: cannot read %s (run from the repository root or set "
                 "TOST_SOURCE_DIR)\n",
                 path.c_str());
    std::exit(2);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tost::fuzz
