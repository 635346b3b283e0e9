// libFuzzer target: the bounded inflation of compressed requests (service/api/inflate.h), which
// reads client bytes into a buffer it grows itself. The first input byte picks the format and the
// output limit, the second how the rest is cut into chunks (gRPC hands a message over in slices).
// Properties: the output never exceeds the limit; the answer does not depend on the cut; only the
// documented codes come back; and what inflates, compressed again with zlib, inflates to itself.
#include <zlib.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "service/api/inflate.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int64_t kLimits[] = {0, 1, 64, 4096, 1 << 16, 1 << 20};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tost::service::Compression;
  using tost::service::InflateMessage;
  if (size < 2) return 0;
  const Compression compression = (data[0] & 1) != 0 ? Compression::kGzip : Compression::kDeflate;
  const int64_t limit = kLimits[(data[0] >> 1) % (sizeof(kLimits) / sizeof(kLimits[0]))];
  const size_t cuts = data[1] % 8;
  const std::string_view payload = tost::fuzz::Bytes(data + 2, size - 2);

  std::vector<std::string_view> chunks;
  const size_t step = cuts == 0 ? payload.size() : payload.size() / (cuts + 1) + 1;
  for (size_t at = 0; at < payload.size(); at += step) chunks.push_back(payload.substr(at, step));
  const std::vector<std::string_view> whole = {payload};

  const absl::StatusOr<std::string> cut = InflateMessage(chunks, compression, limit, "Fuzz");
  const absl::StatusOr<std::string> one = InflateMessage(whole, compression, limit, "Fuzz");
  TOST_FUZZ_CHECK(cut.status().code() == one.status().code());
  TOST_FUZZ_CHECK(!cut.ok() || *cut == *one);
  const absl::StatusCode code = cut.status().code();
  TOST_FUZZ_CHECK(code == absl::StatusCode::kOk || code == absl::StatusCode::kInvalidArgument ||
                  code == absl::StatusCode::kResourceExhausted);
  if (!cut.ok()) return 0;
  TOST_FUZZ_CHECK(static_cast<int64_t>(cut->size()) <= limit);

  // Round trip through zlib's own compressor in the same format.
  z_stream zs{};
  const int window = compression == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS;
  TOST_FUZZ_CHECK(
      deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string again(deflateBound(&zs, cut->size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(cut->data()));
  zs.avail_in = static_cast<uInt>(cut->size());
  zs.next_out = reinterpret_cast<Bytef*>(again.data());
  zs.avail_out = static_cast<uInt>(again.size());
  TOST_FUZZ_CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  again.resize(zs.total_out);
  deflateEnd(&zs);
  const std::vector<std::string_view> recompressed = {again};
  const absl::StatusOr<std::string> back = InflateMessage(recompressed, compression, limit, "Fuzz");
  TOST_FUZZ_CHECK(back.ok() && *back == *cut);
  return 0;
}
