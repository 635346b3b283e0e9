#include "kernels/arg_checks.h"

#include <ATen/ATen.h>

#include "kernels/tssa_ops.h"

namespace tost::kernels {
namespace {

void CheckTemp(const at::Tensor& temp, const char* op, const at::Tensor& w, int64_t channels) {
  TORCH_CHECK(temp.dim() == 1 && temp.size(0) >= 1, op, ": temp must be 1-D [K], got shape ",
              temp.sizes());
  TORCH_CHECK(channels % temp.size(0) == 0, op, ": channels D=", channels,
              " of w must be divisible by the number of heads K=", temp.size(0),
              " (temp's length)");
  TORCH_CHECK(temp.device() == w.device(), op, ": temp is on ", temp.device(), " but w is on ",
              w.device());
  TORCH_CHECK(temp.is_floating_point(), op, ": temp must be floating point, got ",
              temp.scalar_type());
}

void CheckFloating(const at::Tensor& w, const char* op) {
  TORCH_CHECK(w.is_floating_point(), op, ": w must be floating point, got ", w.scalar_type());
}

void CheckDenomBias(const at::Tensor& denom_bias, const char* op, const at::Tensor& w,
                    int64_t heads) {
  TORCH_CHECK(denom_bias.dim() == 2 && denom_bias.size(0) == heads, op,
              ": denom_bias must be [K=", heads, ", Tmax], got shape ", denom_bias.sizes());
  TORCH_CHECK(denom_bias.device() == w.device(), op, ": denom_bias is on ", denom_bias.device(),
              " but w is on ", w.device());
  TORCH_CHECK(denom_bias.is_floating_point(), op, ": denom_bias must be floating point, got ",
              denom_bias.scalar_type());
}

void CheckState(const at::Tensor& state, const char* op, const at::Tensor& w, const TssaDims& d) {
  const int64_t width = StateWidth(d.channels, d.heads);
  TORCH_CHECK(state.dim() == 2 && state.size(0) == d.batch && state.size(1) == width, op,
              ": state must be [B=", d.batch, ", 2D+K=", width, "], got shape ", state.sizes());
  TORCH_CHECK(state.scalar_type() == at::kFloat, op, ": state must be float32, got ",
              state.scalar_type());
  TORCH_CHECK(state.device() == w.device(), op, ": state is on ", state.device(), " but w is on ",
              w.device());
}

void CheckPositions(const at::Tensor& positions, const char* op, const at::Tensor& w,
                    const TssaDims& d, int64_t tmax) {
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == d.batch, op,
              ": positions must be [B=", d.batch, "], got shape ", positions.sizes());
  TORCH_CHECK(positions.scalar_type() == at::kLong, op, ": positions must be int64, got ",
              positions.scalar_type());
  // The positions index the denom_bias gather, so their range is checked, on the host. Positions
  // already on w's (non-CPU) device are not: reading them back would synchronise the host with the
  // device on every call, and the device kernels guard the range themselves (NaN for a sequence
  // outside it, never an out-of-range read).
  if (d.batch == 0) return;
  if (!positions.device().is_cpu() && positions.device() == w.device()) return;
  const auto range = at::aminmax(positions.to(at::kCPU));
  const int64_t lo = std::get<0>(range).item<int64_t>();
  const int64_t hi = std::get<1>(range).item<int64_t>();
  TORCH_CHECK(lo >= 0, op, ": positions must be >= 0, got ", lo);
  // hi ≤ Tmax − T rather than hi + T ≤ Tmax: no overflow for huge positions.
  TORCH_CHECK(d.tokens <= tmax && hi <= tmax - d.tokens, op, ": position ", hi, " + ", d.tokens,
              " token(s) exceeds the context length Tmax=", tmax, " of denom_bias");
}

// A state pool [P, 2D+K] float32 on w's device and row_ids [B] int64 naming distinct rows of it.
void CheckRowIds(const at::Tensor& row_ids, const at::Tensor& pool, const at::Tensor& w,
                 const TssaDims& d) {
  constexpr const char* op = "tssa_step";
  const int64_t width = StateWidth(d.channels, d.heads);
  TORCH_CHECK(pool.dim() == 2 && pool.size(0) >= 1 && pool.size(1) == width, op,
              ": with row_ids, state must be a pool [P>=1, 2D+K=", width, "], got shape ",
              pool.sizes());
  TORCH_CHECK(pool.scalar_type() == at::kFloat, op, ": state must be float32, got ",
              pool.scalar_type());
  TORCH_CHECK(pool.device() == w.device(), op, ": state is on ", pool.device(), " but w is on ",
              w.device());
  TORCH_CHECK(row_ids.dim() == 1 && row_ids.size(0) == d.batch, op,
              ": row_ids must be [B=", d.batch, "], got shape ", row_ids.sizes());
  TORCH_CHECK(row_ids.scalar_type() == at::kLong, op, ": row_ids must be int64, got ",
              row_ids.scalar_type());
  TORCH_CHECK(row_ids.device().is_cpu() || row_ids.device() == w.device(), op, ": row_ids are on ",
              row_ids.device(), " but w is on ", w.device());
  if (!row_ids.device().is_cpu())
    return;  // device row_ids: guarded by the kernels (see the header)
  const at::Tensor sorted = std::get<0>(at::sort(row_ids.contiguous()));
  const int64_t* s = sorted.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < d.batch; ++i) {
    TORCH_CHECK(s[i] >= 0 && s[i] < pool.size(0), op, ": row ", s[i],
                " is outside the state pool's rows [0, ", pool.size(0), ")");
    TORCH_CHECK(i == 0 || s[i] != s[i - 1], op, ": row ", s[i],
                " is named twice; every sequence of a step needs its own row");
  }
}

// Host row indices [M] of an R-row tensor: each in [0, R), none twice.
void CheckHostRows(const at::Tensor& rows, int64_t bound, const char* op) {
  const at::Tensor sorted = std::get<0>(at::sort(rows.to(at::kLong).contiguous()));
  const int64_t* s = sorted.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < sorted.numel(); ++i) {
    TORCH_CHECK(s[i] >= 0 && s[i] < bound, op, ": rows names row ", s[i],
                ", outside the logits' rows [0, ", bound, ")");
    TORCH_CHECK(i == 0 || s[i] != s[i - 1], op, ": rows names row ", s[i],
                " twice; each logits row takes at most one bitmask row");
  }
}

}  // namespace

TssaDims CheckTssaArgs(const at::Tensor& w, const at::Tensor& temp) {
  TORCH_CHECK(w.dim() == 3, "tssa: w must be [B,N,D], got shape ", w.sizes());
  CheckFloating(w, "tssa");
  TssaDims d{w.size(0), w.size(1), w.size(2), temp.dim() == 1 ? temp.size(0) : 0, 0};
  CheckTemp(temp, "tssa", w, d.channels);
  d.head_dim = d.channels / d.heads;
  return d;
}

TssaDims CheckCausalArgs(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                         const std::optional<at::Tensor>& state,
                         const std::optional<at::Tensor>& positions) {
  TORCH_CHECK(w.dim() == 3, "tssa_causal: w must be [B,T,D], got shape ", w.sizes());
  CheckFloating(w, "tssa_causal");
  TssaDims d{w.size(0), w.size(1), w.size(2), temp.dim() == 1 ? temp.size(0) : 0, 0};
  CheckTemp(temp, "tssa_causal", w, d.channels);
  d.head_dim = d.channels / d.heads;
  CheckDenomBias(denom_bias, "tssa_causal", w, d.heads);
  if (state.has_value()) CheckState(*state, "tssa_causal", w, d);
  if (positions.has_value()) {
    CheckPositions(*positions, "tssa_causal", w, d, denom_bias.size(1));
  } else {
    TORCH_CHECK(d.tokens <= denom_bias.size(1), "tssa_causal: ", d.tokens,
                " tokens exceed the context length Tmax=", denom_bias.size(1), " of denom_bias");
  }
  return d;
}

TssaDims CheckStepArgs(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                       const at::Tensor& positions, const at::Tensor& state,
                       const std::optional<at::Tensor>& row_ids) {
  TORCH_CHECK(w.dim() == 2, "tssa_step: w must be [B,D], got shape ", w.sizes());
  CheckFloating(w, "tssa_step");
  TssaDims d{w.size(0), 1, w.size(1), temp.dim() == 1 ? temp.size(0) : 0, 0};
  CheckTemp(temp, "tssa_step", w, d.channels);
  d.head_dim = d.channels / d.heads;
  CheckDenomBias(denom_bias, "tssa_step", w, d.heads);
  if (row_ids.has_value()) {
    CheckRowIds(*row_ids, state, w, d);
  } else {
    CheckState(state, "tssa_step", w, d);
  }
  CheckPositions(positions, "tssa_step", w, d, denom_bias.size(1));
  return d;
}

TokenBitmaskDims CheckTokenBitmaskArgs(const at::Tensor& logits, const at::Tensor& bitmask,
                                       const std::optional<at::Tensor>& rows) {
  constexpr const char* op = "apply_token_bitmask_";
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D [rows, vocab], got shape ",
              logits.sizes());
  TORCH_CHECK(logits.scalar_type() == at::kFloat, op, ": logits must be float32, got ",
              logits.scalar_type());
  TORCH_CHECK(logits.is_contiguous(), op,
              ": logits must be contiguous (they are updated in place), got strides ",
              logits.strides());
  TokenBitmaskDims d{logits.size(0), logits.size(1), 0, 0};
  const int64_t needed = TokenBitmaskWords(d.vocab);
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.size(1) >= needed, op,
              ": bitmask must be [masked_rows, words>=", needed,
              "] (32 ids per word, vocab=", d.vocab, "), got shape ", bitmask.sizes());
  TORCH_CHECK(bitmask.scalar_type() == at::kInt, op, ": bitmask must be int32, got ",
              bitmask.scalar_type());
  TORCH_CHECK(bitmask.device() == logits.device(), op, ": bitmask is on ", bitmask.device(),
              " but logits are on ", logits.device());
  d.masked_rows = bitmask.size(0);
  d.words = bitmask.size(1);
  if (!rows.has_value()) {
    TORCH_CHECK(d.masked_rows == d.rows, op,
                ": without rows, bitmask must have one row per logits row: expected [", d.rows,
                ", words], got shape ", bitmask.sizes());
    return d;
  }
  TORCH_CHECK(rows->dim() == 1 && rows->size(0) == d.masked_rows, op,
              ": rows must be [masked_rows=", d.masked_rows, "] (one per bitmask row), got shape ",
              rows->sizes());
  TORCH_CHECK(rows->scalar_type() == at::kInt || rows->scalar_type() == at::kLong, op,
              ": rows must be int32 or int64, got ", rows->scalar_type());
  TORCH_CHECK(rows->device().is_cpu() || rows->device() == logits.device(), op, ": rows are on ",
              rows->device(), " but logits are on ", logits.device());
  if (rows->device().is_cpu()) CheckHostRows(*rows, d.rows, op);
  return d;
}

}  // namespace tost::kernels
