// Runs a libFuzzer target (tests/fuzz/<name>_fuzz.cc) without libFuzzer: every file named on the
// command line, and every file in a directory named there, is one input, passed once to
// LLVMFuzzerTestOneInput in name order. The sanitizer builds (scripts/run-sanitizers.sh) replay
// the committed seeds (tests/fuzz/corpus/<name>, the crashing inputs of past findings included)
// through the GCC-compiled parsers this way; a finding aborts, and the last "replay:" line names
// the input.
//
//   <name>_replay PATH...   (from the repository root, or with TOST_SOURCE_DIR set)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else {
      inputs.push_back(arg);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY... (no input found)\n", argv[0]);
    return 2;
  }
  size_t bytes = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 2;
    }
    // A copy of exactly the input's size, as libFuzzer passes it: reading one byte past the end
    // is an overflow ASan sees.
    const std::vector<char> contents((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    std::vector<uint8_t> data(contents.begin(), contents.end());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), data.size());
    LLVMFuzzerTestOneInput(data.data(), data.size());
    bytes += data.size();
  }
  std::printf("replayed %zu inputs, %zu bytes\n", inputs.size(), bytes);
  return 0;
}
