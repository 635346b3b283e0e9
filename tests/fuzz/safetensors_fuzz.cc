// libFuzzer target: the safetensors reader (model/safetensors.h, SafetensorsFile::Parse; the file
// is torch-free: only the weight loaders that use it include ATen). Every tensor of a file that
// parses must view exactly shape × dtype-size bytes inside the file: they are read here, so
// AddressSanitizer reports a view that reaches outside.
#include <cstdint>
#include <string>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tost::model::SafetensorsFile;
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(std::string(tost::fuzz::Bytes(data, size)), "fuzz.safetensors");
  if (!file.ok()) return 0;
  uint64_t sum = 0;
  for (const auto& [name, t] : file->tensors()) {
    TOST_FUZZ_CHECK(tost::model::StDtypeSize(t.dtype) > 0);
    TOST_FUZZ_CHECK(static_cast<uint64_t>(t.numel()) * tost::model::StDtypeSize(t.dtype) ==
                    t.bytes.size());
    for (const char c : t.bytes) sum += static_cast<unsigned char>(c);
    const absl::StatusOr<const tost::model::StTensor*> found = file->Find(name);
    TOST_FUZZ_CHECK(found.ok() && *found == &t);
  }
  TOST_FUZZ_CHECK(!file->Find("\xff not a tensor name").ok() ||
                  file->tensors().count("\xff not a tensor name") == 1);
  for (const auto& [k, v] : file->metadata()) sum += k.size() + v.size();
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
