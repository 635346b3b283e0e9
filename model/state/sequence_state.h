// Everything the model needs to continue a causal sequence: the per-layer TSSA statistics and the
// absolute position. Its size is fixed by the model's dimensions, whatever the sequence length:
// n_layer × (2·n_embd + n_head) floats. Torch-free so sessions can be stored, copied (fork) and
// serialised by the service.
#pragma once

#include <cstdint>
#include <vector>

namespace tost::model {

struct SequenceState {
  int64_t position = 0;      // tokens consumed so far = absolute position of the next token
  std::vector<float> stats;  // [n_layer][S1 (C) | S2 (C) | S3 (K)]

  size_t ByteSize() const { return sizeof(position) + stats.size() * sizeof(float); }
};

}  // namespace tost::model
