#include "kernels/reference.h"

#include <ATen/ATen.h>

#include <limits>

#include "kernels/arg_checks.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels::reference {

// Statistics and Π are computed in float32 (or float64 when w is float64) at every input
// precision; y is returned in w's dtype.
namespace {
at::ScalarType AccType(const at::Tensor& w) {
  return w.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}
}  // namespace

at::Tensor tssa(const at::Tensor& w_in, const at::Tensor& temp) {
  const TssaDims d = CheckTssaArgs(w_in, temp);
  const auto acc = AccType(w_in);
  // b n (h d) -> b n h d; reductions over tokens run along dim 1.
  const at::Tensor w = w_in.to(acc).reshape({d.batch, d.tokens, d.heads, d.head_dim});
  const at::Tensor w2 = w * w;
  // docs/model-semantics.md §1.1 step 2: ν = max(||w||_tokens, 1e-12) (F.normalize clamps the norm)
  const at::Tensor nu = w2.sum(1, /*keepdim=*/true).sqrt().clamp_min(kNormEps);
  // step 3: s = temp[k] · Σ_c (w/ν)²
  const at::Tensor s = (w / nu).pow(2).sum(-1) * temp.to(acc).view({1, 1, d.heads});
  // step 4: Π = softmax over the head axis
  const at::Tensor pi = at::softmax(s, /*dim=*/2);  // [B,N,K]
  // step 5: n = Σ_j Π, dots = Σ_j (Π / (n + 1e-8)) w²   (raw, un-normalised w²)
  const at::Tensor n = pi.sum(1, /*keepdim=*/true);  // [B,1,K]
  const at::Tensor dots = ((pi / (n + kCountEps)).unsqueeze(-1) * w2).sum(1, /*keepdim=*/true);
  // steps 6-7: y = −w · Π · 1/(1 + dots)
  const at::Tensor y = -w * pi.unsqueeze(-1) / (1 + dots);
  return y.reshape({d.batch, d.tokens, d.channels}).to(w_in.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> tssa_causal(const at::Tensor& w_in, const at::Tensor& temp,
                                               const at::Tensor& denom_bias,
                                               const std::optional<at::Tensor>& state,
                                               const std::optional<at::Tensor>& positions) {
  const TssaDims d = CheckCausalArgs(w_in, temp, denom_bias, state, positions);
  const auto acc = AccType(w_in);
  const auto opts = w_in.options().dtype(acc);
  const at::Tensor w = w_in.to(acc).reshape({d.batch, d.tokens, d.heads, d.head_dim});
  const at::Tensor w2 = w * w;

  at::Tensor s1_0, s2_0, s3_0;
  if (state.has_value()) {
    const at::Tensor st = state->to(acc);
    s1_0 = st.slice(1, 0, d.channels).reshape({d.batch, 1, d.heads, d.head_dim});
    s2_0 = st.slice(1, d.channels, 2 * d.channels).reshape({d.batch, 1, d.heads, d.head_dim});
    s3_0 = st.slice(1, 2 * d.channels).reshape({d.batch, 1, d.heads});
  } else {
    s1_0 = at::zeros({d.batch, 1, d.heads, d.head_dim}, opts);
    s2_0 = at::zeros_like(s1_0);
    s3_0 = at::zeros({d.batch, 1, d.heads}, opts);
  }
  const at::Tensor start = positions.has_value() ? positions->to(w_in.device())
                                                 : at::zeros({d.batch}, opts.dtype(at::kLong));

  // docs/model-semantics.md §2.1 step 2: S1[t] = max(Σ_{s≤t} w², 1e-12) (clamp on the squared sum)
  const at::Tensor s1 = (s1_0 + at::cumsum(w2, 1)).clamp_min(kNormEps);
  // step 3: u = w²/S1 + δ[k, pos]   (δ added after the division)
  const at::Tensor pos =
      start.view({d.batch, 1}) + at::arange(d.tokens, start.options()).view({1, d.tokens});
  const at::Tensor delta = denom_bias.to(acc)
                               .index_select(1, pos.reshape({-1}))
                               .view({d.heads, d.batch, d.tokens})
                               .permute({1, 2, 0});
  // step 4: s = temp[k] · Σ_c u = temp[k] · (Σ_c w²/S1 + p·δ)
  const at::Tensor s = ((w2 / s1).sum(-1) + delta * static_cast<double>(d.head_dim)) *
                       temp.to(acc).view({1, 1, d.heads});
  // step 5: Π = softmax over heads
  const at::Tensor pi = at::softmax(s, /*dim=*/2);  // [B,T,K]
  // step 6: dots = Σ_{s≤t} Π w² / (Σ_{s≤t} Π + 1e-8)
  const at::Tensor s2 = s2_0 + at::cumsum(pi.unsqueeze(-1) * w2, 1);
  const at::Tensor s3 = s3_0 + at::cumsum(pi, 1);
  const at::Tensor dots = s2 / (s3 + kCountEps).unsqueeze(-1);
  // step 7: y = −w · Π / (1 + dots)
  const at::Tensor y = -w * pi.unsqueeze(-1) / (1 + dots);

  // The running sums after the last token, unclamped S1 (the clamp is applied when read).
  const int64_t last = d.tokens - 1;
  at::Tensor state_out;
  if (d.tokens == 0) {
    state_out = at::cat(
        {s1_0.reshape({d.batch, -1}), s2_0.reshape({d.batch, -1}), s3_0.reshape({d.batch, -1})}, 1);
  } else {
    const at::Tensor s1_raw = s1_0.select(1, 0) + w2.sum(1);
    state_out = at::cat(
        {s1_raw.reshape({d.batch, d.channels}), s2.select(1, last).reshape({d.batch, d.channels}),
         s3.select(1, last).reshape({d.batch, d.heads})},
        1);
  }
  return {y.reshape({d.batch, d.tokens, d.channels}).to(w_in.scalar_type()),
          state_out.to(at::kFloat)};
}

at::Tensor tssa_step(const at::Tensor& w, const at::Tensor& temp, const at::Tensor& denom_bias,
                     const at::Tensor& positions, at::Tensor& state,
                     const std::optional<at::Tensor>& row_ids) {
  CheckStepArgs(w, temp, denom_bias, positions, state, row_ids);
  if (row_ids.has_value()) {
    const at::Tensor rows = row_ids->to(state.device());
    auto [y, state_out] =
        tssa_causal(w.unsqueeze(1), temp, denom_bias, state.index_select(0, rows), positions);
    state.index_copy_(0, rows, state_out);
    return y.squeeze(1);
  }
  auto [y, state_out] = tssa_causal(w.unsqueeze(1), temp, denom_bias, state, positions);
  state.copy_(state_out);
  return y.squeeze(1);
}

at::Tensor& apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask,
                                 const std::optional<at::Tensor>& rows) {
  const TokenBitmaskDims d = CheckTokenBitmaskArgs(logits, bitmask, rows);
  if (d.masked_rows == 0 || d.vocab == 0) return logits;
  const auto longs = at::TensorOptions(at::kLong).device(logits.device());
  // Bit i of a word (an int32 sign-extends to int64, which keeps bits 0-31 where they were).
  const at::Tensor words = bitmask.narrow(1, 0, TokenBitmaskWords(d.vocab)).to(at::kLong);
  const at::Tensor allowed = words.unsqueeze(2)
                                 .bitwise_right_shift(at::arange(32, longs))
                                 .bitwise_and(1)
                                 .reshape({d.masked_rows, -1})
                                 .narrow(1, 0, d.vocab);
  const at::Tensor target = rows.has_value() ? rows->to(longs) : at::arange(d.masked_rows, longs);
  at::Tensor selected = logits.index_select(0, target);
  selected.masked_fill_(allowed.eq(0), -std::numeric_limits<float>::infinity());
  logits.index_copy_(0, target, selected);
  return logits;
}

}  // namespace tost::kernels::reference
