#include "service/api/inflate.h"

#include <zlib.h>

#include <algorithm>
#include <climits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace tost::service {

const char* CompressionName(Compression compression) {
  return compression == Compression::kGzip ? "gzip" : "deflate";
}

absl::StatusOr<std::string> InflateMessage(absl::Span<const std::string_view> chunks,
                                           Compression compression, int64_t max_bytes,
                                           absl::string_view type_name) {
  const char* name = CompressionName(compression);
  size_t compressed = 0;
  for (std::string_view chunk : chunks) compressed += chunk.size();
  // At most INT_MAX (gRPC's own message limit is an int), so every size below fits zlib's uInt.
  const size_t limit = static_cast<size_t>(std::clamp<int64_t>(max_bytes, 0, INT_MAX));

  z_stream zs{};
  // gzip: deflate data in a gzip header and trailer; gRPC's "deflate" is zlib's format (a zlib
  // header and checksum around it), as gRPC's own compressor writes it.
  if (inflateInit2(&zs, compression == Compression::kGzip ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat(type_name, ": zlib could not start inflating"));
  }
  absl::Cleanup end_inflate = [&zs] { inflateEnd(&zs); };
  // The output grows by doubling and never past limit + 1 bytes: one byte past the limit is how
  // a bomb is told, and it is all a bomb costs.
  std::string out(std::min(limit + 1, std::max<size_t>(4 * compressed, 64 << 10)), '\0');
  size_t produced = 0;
  size_t next_chunk = 0;
  bool output_full = false;  // zlib may hold output it could not write: call it again
  auto too_large = [&] {
    return absl::ResourceExhaustedError(absl::StrCat(
        type_name, ": the ", name, "-compressed request inflates past --max_message_bytes (",
        max_bytes, " bytes); got ", compressed, " compressed bytes, of which the first ",
        zs.total_in, " already inflate to more"));
  };
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (zs.avail_in == 0 && !output_full) {
      if (next_chunk == chunks.size()) break;
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(chunks[next_chunk].data()));
      zs.avail_in = static_cast<uInt>(chunks[next_chunk].size());
      ++next_chunk;
      continue;
    }
    if (produced == out.size()) {
      if (produced > limit) return too_large();
      out.resize(std::min(limit + 1, 2 * out.size()));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(out.size() - produced);
    rc = inflate(&zs, Z_NO_FLUSH);
    produced = out.size() - zs.avail_out;
    output_full = zs.avail_out == 0;
    // Past the limit is decided before any error zlib reports in the same call, so the answer
    // does not depend on how the message was cut into slices (the fuzzer holds it to that).
    if (produced > limit) return too_large();
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_name, ": the request message is flagged ", name, "-compressed, but is not valid ",
          name, " data: zlib stopped at byte ", zs.total_in, " of ", compressed, " (",
          zs.msg != nullptr ? zs.msg : "error", ")"));
    }
  }
  if (produced > limit) return too_large();
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name, ": the request message is flagged ", name, "-compressed, but its ", compressed,
        " bytes end before the end of their ", name, " stream (truncated)"));
  }
  if (zs.total_in != compressed) {
    return absl::InvalidArgumentError(
        absl::StrCat(type_name, ": the request message is flagged ", name, "-compressed, but ",
                     compressed - zs.total_in, " of its ", compressed,
                     " bytes follow the end of its ", name, " stream"));
  }
  out.resize(produced);
  return out;
}

}  // namespace tost::service
