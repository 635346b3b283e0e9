// The batched token draw on the device that holds a decode step's logits, so that only the drawn
// ids and the requested logprobs cross to the host: for a GPU model that is a few bytes per row
// instead of the whole [rows, vocab] logits every step.
//
// It computes what DrawTokens (sampler.h) computes, with tensor operations, and draws with the
// same counter-based random numbers (made on the host, uploaded with the step's parameters), so a
// sequence resumed on another replica draws the same numbers. On the CPU the two agree token for
// token (tested); on a GPU the probabilities are summed in another order, which can move a draw
// that falls within rounding of a bucket boundary.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/types/span.h"
#include "model/sampling/sampler.h"

namespace tost::model {

// logits [draws.size(), vocab] in any floating dtype, on any device. Parameters go up in one
// copy (pinned and non-blocking on CUDA) and the results come back in one. Throws what ATen
// throws; callers run it inside their LibTorch boundary.
std::vector<DrawnToken> DrawTokensOnDevice(const at::Tensor& logits, int64_t defined_vocab,
                                           absl::Span<const TokenDraw> draws);

}  // namespace tost::model
