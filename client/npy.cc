#include "client/npy.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tost::service {
namespace {

// The value of `key` in the header dict, e.g. 'descr': '<f4' → "'<f4'".
std::string HeaderValue(const std::string& header, const std::string& key) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t v = header.find(':', k);
  if (v == std::string::npos) return "";
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  if (v < header.size() && header[v] == '(') return header.substr(v, header.find(')', v) - v + 1);
  const size_t end = header.find_first_of(",}", v);
  return header.substr(v, end - v);
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& c, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (c.size() < 10 || c.compare(0, 6, "\x93NUMPY") != 0)
    return bad("not a .npy file (missing \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(c[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(c[8]) | (static_cast<unsigned char>(c[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (c.size() < 12) return bad("truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i)
      header_len = (header_len << 8) | static_cast<unsigned char>(c[8 + i]);
    header_start = 12;
  } else {
    return bad(absl::StrCat("unsupported .npy version ", major));
  }
  if (header_start + header_len > c.size()) return bad("truncated .npy header");
  const std::string header = c.substr(header_start, header_len);
  const std::string descr = HeaderValue(header, "descr");
  if (HeaderValue(header, "fortran_order").find("False") == std::string::npos) {
    return bad("Fortran-ordered arrays are not supported; save with np.ascontiguousarray");
  }
  size_t item = 0;
  if (descr == "'<f4'") {
    item = 4;
  } else if (descr == "'<f8'") {
    item = 8;
  } else {
    return bad(absl::StrCat("dtype ", descr,
                            " is not supported; expected float32 ('<f4') or float64 ('<f8')"));
  }
  NpyArray out;
  std::string shape = HeaderValue(header, "shape");
  shape = std::string(absl::StripSuffix(absl::StripPrefix(shape, "("), ")"));
  int64_t n = 1;
  for (absl::string_view dim : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &d) || d < 0)
      return bad(absl::StrCat("bad shape ", shape));
    out.shape.push_back(d);
    // The data must be in the file, so no element count beyond its size is real; checked before
    // multiplying so that a hostile shape cannot overflow the count.
    if (d != 0 && n > static_cast<int64_t>(c.size() / item) / d) {
      return bad(absl::StrCat("shape ", shape, " holds more elements than the file's ", c.size(),
                              " bytes"));
    }
    n *= d;
  }
  const size_t data_start = header_start + header_len;
  if (c.size() - data_start != static_cast<size_t>(n) * item) {
    return bad(
        absl::StrCat("holds ", c.size() - data_start, " data bytes, shape needs ", n * item));
  }
  out.data.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (item == 4) {
      std::memcpy(&out.data[i], c.data() + data_start + 4 * i, 4);
    } else {
      double v;
      std::memcpy(&v, c.data() + data_start + 8 * i, 8);
      out.data[i] = static_cast<float>(v);
    }
  }
  return out;
}

}  // namespace tost::service
