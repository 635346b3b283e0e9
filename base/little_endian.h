// Little-endian integers appended to and read from byte strings: the layouts of the session blobs
// and of the shared prefix-cache records. One copy, so the two formats cannot drift apart.
#pragma once

#include <cstdint>
#include <string>

namespace tost::base {

// Appends the low `bytes` bytes of `v`, least significant first.
inline void AppendLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The `bytes`-byte little-endian integer at `p` (the caller checked that it is there).
inline uint64_t ReadLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace tost::base
