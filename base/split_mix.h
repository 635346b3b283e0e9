// SplitMix64's finaliser: a bijective 64-bit mix whose output bits each depend on every input bit.
// The sampler keys its draws with it, the prefix-state cache hashes token prefixes with it, and the
// engine tests' fake models derive their logits from it; one copy, so they cannot drift apart.
#pragma once

#include <cstdint>

namespace tost::base {

constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace tost::base
