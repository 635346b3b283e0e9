// tost::apply_token_bitmask_ on the CPU: for each bitmask row, the words covering the vocabulary
// in order; a word with every bit set costs its load alone, a word with none set fills its 32
// logits, any other writes -infinity at its clear bits only (found with countr_zero), so the
// logits are written where a token is forbidden and never read. Exact: the only value written is
// -infinity. Bitmask rows run in parallel on LibTorch's intra-op threads (distinct logits rows:
// the argument checks refuse a row named twice).
#include "kernels/cpu/token_bitmask_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "kernels/arg_checks.h"

namespace tost::kernels::cpu {

at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask_in,
                                 const std::optional<at::Tensor>& rows_in) {
  const TokenBitmaskDims d = CheckTokenBitmaskArgs(logits, bitmask_in, rows_in);
  if (d.masked_rows == 0 || d.vocab == 0) return logits;
  const at::Tensor bitmask = bitmask_in.contiguous();
  const at::Tensor rows = rows_in.has_value() ? rows_in->to(at::kLong).contiguous() : at::Tensor();
  float* const out = logits.mutable_data_ptr<float>();
  const int32_t* const words = bitmask.const_data_ptr<int32_t>();
  const int64_t* const row_ids = rows.defined() ? rows.const_data_ptr<int64_t>() : nullptr;
  const int64_t vocab = d.vocab;
  const int64_t needed = TokenBitmaskWords(vocab);
  // Bits of the last word that stand for tokens (the rest are past the vocabulary).
  const int tail = static_cast<int>(vocab % 32);
  const uint32_t last_word_bits = tail == 0 ? ~uint32_t{0} : (uint32_t{1} << tail) - 1;
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  // About 64k logits per task: below that a thread's start costs more than the writes.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / vocab);
  at::parallel_for(0, d.masked_rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* const row = out + (row_ids != nullptr ? row_ids[m] : m) * vocab;
      const int32_t* const mask = words + m * d.words;
      for (int64_t j = 0; j < needed; ++j) {
        uint32_t clear = ~static_cast<uint32_t>(mask[j]);
        if (j == needed - 1) clear &= last_word_bits;
        if (clear == 0) continue;
        float* const base = row + 32 * j;
        if (clear == ~uint32_t{0}) {
          std::fill_n(base, 32, kMinusInf);
          continue;
        }
        for (; clear != 0; clear &= clear - 1) base[std::countr_zero(clear)] = kMinusInf;
      }
    }
  });
  return logits;
}

}  // namespace tost::kernels::cpu
