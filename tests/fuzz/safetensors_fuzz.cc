// libFuzzer target: the safetensors reader (model/config/safetensors.h, SafetensorsFile::Parse; the
// file is torch-free: only the weight loaders that use it include ATen). Every tensor of a file
// that parses must view exactly shape × dtype-size bytes inside the file: they are read here, so
// AddressSanitizer reports a view that reaches outside. No two tensors may share a byte, and
// names, metadata and error messages must be valid UTF-8 (they reach messages and logs).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/utf8.h"
#include "model/config/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tost::model::SafetensorsFile;
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(std::string(tost::fuzz::Bytes(data, size)), "fuzz.safetensors");
  if (!file.ok()) {
    TOST_FUZZ_CHECK(
        !tost::model::FirstInvalidUtf8(std::string(file.status().message())).has_value());
    return 0;
  }
  uint64_t sum = 0;
  std::vector<std::pair<const char*, const char*>> extents;
  for (const auto& [name, t] : file->tensors()) {
    TOST_FUZZ_CHECK(tost::model::StDtypeSize(t.dtype) > 0);
    TOST_FUZZ_CHECK(static_cast<uint64_t>(t.numel()) * tost::model::StDtypeSize(t.dtype) ==
                    t.bytes.size());
    for (const char c : t.bytes) sum += static_cast<unsigned char>(c);
    TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(name).has_value());
    if (!t.bytes.empty()) extents.emplace_back(t.bytes.data(), t.bytes.data() + t.bytes.size());
    const absl::StatusOr<const tost::model::StTensor*> found = file->Find(name);
    TOST_FUZZ_CHECK(found.ok() && *found == &t);
  }
  TOST_FUZZ_CHECK(!file->Find("\xff not a tensor name").ok() ||
                  file->tensors().count("\xff not a tensor name") == 1);
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i)
    TOST_FUZZ_CHECK(extents[i].first >= extents[i - 1].second);  // no overlap
  for (const auto& [k, v] : file->metadata()) {
    TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(k).has_value());
    TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(v).has_value());
    sum += k.size() + v.size();
  }
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
