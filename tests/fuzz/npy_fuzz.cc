// libFuzzer target: the client's .npy reader (client/npy.h, ParseNpy) on arbitrary file bytes.
// Accepted arrays must hold exactly as many values as their shape declares.
#include <cstdint>
#include <string>

#include "client/npy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string contents(tost::fuzz::Bytes(data, size));
  const absl::StatusOr<tost::service::NpyArray> array =
      tost::service::ParseNpy(contents, "fuzz.npy");
  if (!array.ok()) return 0;
  uint64_t n = 1;
  for (const int64_t d : array->shape) {
    TOST_FUZZ_CHECK(d >= 0);
    TOST_FUZZ_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n));
  }
  TOST_FUZZ_CHECK(array->data.size() == n);
  return 0;
}
