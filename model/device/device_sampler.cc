#include "model/device/device_sampler.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "kernels/token_bitmask_ops.h"

namespace tost::model {
namespace {

// One double per row and parameter in the upload (ids and counts are exact in a double).
enum Column : int64_t {
  kTemperature,
  kTopP,
  kMinP,
  kPenalty,
  kUniform,  // the draw's counter-based random number in [0, 1)
  kTopK,     // candidates kept before min-p and top-p: top_k, or the whole vocabulary
  kColumns,
};

// What the host works out per step before anything runs on the device.
struct HostPlan {
  std::vector<double> params;        // [rows, kColumns]
  std::vector<double> penalised;     // (row, token) pairs: distinct tokens of each row's window
  std::vector<double> sampled_rows;  // rows drawn from a distribution (the rest take the argmax)
  std::vector<double> logprob_rows;  // rows that asked for logprobs (their own, alternatives)
  std::vector<double> biased;        // (row, token, bias) triples of the rows' logit biases
  int64_t top_n = 0;                 // the most alternatives any row asked for
};

HostPlan PlanDraws(absl::Span<const TokenDraw> draws, int64_t vocab, int64_t defined) {
  HostPlan plan;
  plan.params.reserve(draws.size() * kColumns);
  std::vector<char> seen(static_cast<size_t>(vocab), 0);
  for (size_t b = 0; b < draws.size(); ++b) {
    const SamplingParams& p = draws[b].params;
    const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, vocab) : vocab;
    plan.params.insert(plan.params.end(),
                       {p.temperature, p.top_p, p.min_p, p.repetition_penalty,
                        CounterUniform(p.seed, draws[b].position), static_cast<double>(k)});
    if (p.repetition_penalty != 1.f) {
      // Once per distinct token of the window, as SampleToken does.
      std::vector<int32_t> marked;
      for (int32_t t : draws[b].recent) {
        if (t < 0 || t >= vocab || seen[t]) continue;
        seen[t] = 1;
        marked.push_back(t);
        plan.penalised.insert(plan.penalised.end(),
                              {static_cast<double>(b), static_cast<double>(t)});
      }
      for (int32_t t : marked) seen[t] = 0;
    }
    for (const auto& [id, bias] : draws[b].logit_bias) {
      // The defined ids only, as DrawTokens: a padded id stays -infinity.
      if (id < 0 || id >= defined) continue;
      plan.biased.insert(plan.biased.end(),
                         {static_cast<double>(b), static_cast<double>(id), bias});
    }
    if (!(p.temperature == 0.f || p.top_k == 1))
      plan.sampled_rows.push_back(static_cast<double>(b));
    if (draws[b].wants_logprob()) plan.logprob_rows.push_back(static_cast<double>(b));
    if (draws[b].top_logprobs > 0) {
      plan.top_n = std::max<int64_t>(plan.top_n, std::min<int64_t>(draws[b].top_logprobs, vocab));
    }
  }
  return plan;
}

// Per row: the first index where `hit` holds, or `otherwise` where it never does. [rows, 1].
at::Tensor FirstHit(const at::Tensor& hit, const at::Tensor& otherwise) {
  return at::where(hit.any(1, /*keepdim=*/true), hit.to(at::kInt).argmax(1, /*keepdim=*/true),
                   otherwise);
}

}  // namespace

std::vector<DrawnToken> DrawTokensOnDevice(const at::Tensor& logits, int64_t defined_vocab,
                                           absl::Span<const TokenDraw> draws) {
  const int64_t rows = static_cast<int64_t>(draws.size());
  std::vector<DrawnToken> out(draws.size());
  if (rows == 0) return out;
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) == rows, "expected logits [", rows,
              ", vocab] for ", rows, " draws, got ", logits.sizes());
  const int64_t vocab = logits.size(1);
  const int64_t defined = std::clamp<int64_t>(defined_vocab, 0, vocab);
  const at::Device device = logits.device();
  const auto longs = at::TensorOptions(at::kLong).device(device);

  // Everything the device needs of the host, in one copy.
  const HostPlan plan = PlanDraws(draws, vocab, defined);
  const int64_t pairs = static_cast<int64_t>(plan.penalised.size()) / 2;
  const int64_t sampled = static_cast<int64_t>(plan.sampled_rows.size());
  const int64_t with_logprobs = static_cast<int64_t>(plan.logprob_rows.size());
  const int64_t biases = static_cast<int64_t>(plan.biased.size()) / 3;
  at::Tensor staged =
      at::empty({rows * kColumns + 2 * pairs + sampled + with_logprobs + 3 * biases},
                at::TensorOptions(at::kDouble).pinned_memory(device.is_cuda()));
  double* dst = staged.data_ptr<double>();
  for (const std::vector<double>* part :
       {&plan.params, &plan.penalised, &plan.sampled_rows, &plan.logprob_rows, &plan.biased}) {
    dst = std::copy(part->begin(), part->end(), dst);
  }
  const at::Tensor up = staged.to(device, /*non_blocking=*/true);
  int64_t offset = 0;
  const auto take = [&](int64_t n) {
    const at::Tensor part = up.narrow(0, offset, n);
    offset += n;
    return part;
  };
  const at::Tensor params = take(rows * kColumns).view({rows, kColumns});
  const at::Tensor pair_ids = take(2 * pairs).to(at::kLong).view({pairs, 2});
  const at::Tensor sampled_ids = take(sampled).to(at::kLong);
  const at::Tensor logprob_ids = take(with_logprobs).to(at::kLong);
  const at::Tensor bias_triples = take(3 * biases).view({biases, 3});

  // Ids the tokenizer does not define are never drawn; a copy, since the logits may be a CUDA
  // graph's output buffer.
  at::Tensor masked = logits.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  if (defined < vocab) {
    masked.narrow(1, defined, vocab - defined).fill_(-std::numeric_limits<float>::infinity());
  }
  at::Tensor nonfinite = at::full({rows, 1}, -1, longs);
  if (defined > 0) {
    nonfinite = FirstHit(at::isfinite(masked.narrow(1, 0, defined)).logical_not(), nonfinite);
  }

  // Constrained rows (TokenDraw::allowed): the ids a row's bitmask leaves clear are -infinity from
  // here on, after the check above (that -infinity is the constraint's, not an overflow). Only the
  // constrained rows' words go up, as int32 (the same bits), followed by the rows they belong to:
  // one copy from pinned memory, then one kernel (tost::apply_token_bitmask_) that writes the
  // forbidden ids and reads nothing else. The staged words live until the results come back, past
  // their non-blocking copy.
  at::Tensor staged_words;
  std::vector<int32_t> constrained;
  for (int64_t b = 0; b < rows; ++b) {
    if (!draws[b].allowed.empty()) constrained.push_back(static_cast<int32_t>(b));
  }
  if (!constrained.empty()) {
    const int64_t words = (vocab + 31) / 32;
    const int64_t masked_rows = static_cast<int64_t>(constrained.size());
    staged_words = at::empty({masked_rows * (words + 1)},
                             at::TensorOptions(at::kInt).pinned_memory(device.is_cuda()));
    int32_t* w = staged_words.data_ptr<int32_t>();
    for (const int32_t b : constrained) {
      // Words past a row's span allow no id (as DrawTokens); unconstrained rows are not named, so
      // they allow every id.
      const absl::Span<const uint32_t> allowed = draws[b].allowed;
      const int64_t given = std::min<int64_t>(words, static_cast<int64_t>(allowed.size()));
      for (int64_t j = 0; j < words; ++j, ++w) {
        *w = j < given ? static_cast<int32_t>(allowed[j]) : 0;
      }
    }
    std::copy(constrained.begin(), constrained.end(), w);
    const at::Tensor up = staged_words.to(device, /*non_blocking=*/true);
    kernels::apply_token_bitmask_(masked,
                                  up.narrow(0, 0, masked_rows * words).view({masked_rows, words}),
                                  up.narrow(0, masked_rows * words, masked_rows));
  }

  // Logit biases (TokenDraw::logit_bias), after the mask: a forbidden id's -infinity stays.
  if (biases > 0) {
    const at::Tensor flat =
        bias_triples.select(1, 0).to(at::kLong) * vocab + bias_triples.select(1, 1).to(at::kLong);
    masked.view({-1}).index_add_(0, flat, bias_triples.select(1, 2).to(at::kFloat));
  }

  // The repetition penalty, on a second copy: the alternatives report the raw logits.
  at::Tensor penalised = masked;
  if (pairs > 0) {
    penalised = masked.clone();
    const at::Tensor row = pair_ids.select(1, 0);
    const at::Tensor flat = row * vocab + pair_ids.select(1, 1);
    const at::Tensor v = penalised.view({-1}).index_select(0, flat);
    const at::Tensor by = params.select(1, kPenalty).index_select(0, row).to(at::kFloat);
    penalised.view({-1}).index_copy_(0, flat, at::where(v > 0, v / by, v * by));
  }

  at::Tensor ids = penalised.argmax(1);  // greedy; ties to the lowest id
  if (sampled > 0) {
    const at::Tensor p = params.index_select(0, sampled_ids);
    const auto col = [&](Column c) { return p.select(1, c).unsqueeze(1); };  // [sampled, 1]
    // Candidates by logit, descending, ties by id (a stable sort), so every cut is a prefix.
    auto [values, order] = at::sort(penalised.index_select(0, sampled_ids), /*stable=*/true,
                                    /*dim=*/1, /*descending=*/true);
    const at::Tensor v = values.to(at::kDouble);
    const at::Tensor probs = ((v - v.narrow(1, 0, 1)) / col(kTemperature)).exp();
    const at::Tensor cumulative = probs.cumsum(1);
    const at::Tensor index = at::arange(vocab, longs).unsqueeze(0);
    const at::Tensor top_k = col(kTopK).to(at::kLong);
    at::Tensor keep = top_k;
    // min-p: back to the last candidate not below min_p × the most likely (at least one).
    const at::Tensor min_p = col(kMinP);
    const at::Tensor not_below = at::logical_not(probs < min_p * probs.narrow(1, 0, 1));
    const at::Tensor last_kept =
        at::where(not_below.logical_and(index < keep), index + 1, at::zeros_like(index))
            .amax(1, /*keepdim=*/true)
            .clamp_min(1);
    keep = at::where(min_p > 0, last_kept, keep);
    // top-p: the shortest prefix whose share of the top-k mass reaches top_p.
    const at::Tensor top_p = col(kTopP);
    const at::Tensor share = (probs / cumulative.gather(1, top_k - 1)).cumsum(1);
    const at::Tensor reached = (share >= top_p).logical_and(index < keep);
    keep = at::where((top_p < 1).logical_and(reached.any(1, /*keepdim=*/true)),
                     reached.to(at::kInt).argmax(1, /*keepdim=*/true) + 1, keep);
    // The draw: the first kept candidate whose running mass passes u × the kept mass.
    const at::Tensor threshold = col(kUniform) * cumulative.gather(1, keep - 1);
    const at::Tensor choice =
        FirstHit((cumulative > threshold).logical_and(index < keep), keep - 1);
    ids.index_copy_(0, sampled_ids, order.gather(1, choice).squeeze(1));
  }

  // One result row per draw: [id, first non-finite id, the drawn id's logprob, alternatives'
  // ids, their logprobs].
  const int64_t top_n = plan.top_n;
  const int64_t width = 3 + 2 * top_n;
  at::Tensor packed = at::zeros({rows, width}, at::TensorOptions(at::kDouble).device(device));
  packed.select(1, 0).copy_(ids);
  packed.select(1, 1).copy_(nonfinite.squeeze(1));
  if (with_logprobs > 0) {
    // Logprobs are of the raw logits (the penalty only steers the draw), rounded to float as the
    // host rounds them.
    const at::Tensor raw = masked.index_select(0, logprob_ids);
    const at::Tensor peak = std::get<0>(raw.max(1, /*keepdim=*/true)).to(at::kDouble);
    const at::Tensor log_z =
        (raw.to(at::kDouble) - peak).exp().sum(1, /*keepdim=*/true).log() + peak;
    const auto as_logprob = [&](const at::Tensor& logits) {
      return (logits.to(at::kDouble) - log_z).to(at::kFloat).to(at::kDouble);
    };
    const at::Tensor drawn = raw.gather(1, ids.index_select(0, logprob_ids).unsqueeze(1));
    std::vector<at::Tensor> columns = {as_logprob(drawn)};
    if (top_n > 0) {
      auto [values, order] = at::sort(raw, /*stable=*/true, /*dim=*/1, /*descending=*/true);
      columns.push_back(order.narrow(1, 0, top_n).to(at::kDouble));
      columns.push_back(as_logprob(values.narrow(1, 0, top_n)));
    }
    packed.narrow(1, 2, width - 2).index_copy_(0, logprob_ids, at::cat(columns, 1));
  }
  const at::Tensor host = packed.to(at::kCPU).contiguous();
  const double* r = host.data_ptr<double>();
  for (int64_t b = 0; b < rows; ++b, r += width) {
    DrawnToken& d = out[b];
    d.nonfinite_id = static_cast<int64_t>(r[1]);
    if (d.nonfinite_id >= 0) continue;
    d.id = static_cast<int32_t>(r[0]);
    if (draws[b].wants_logprob()) d.logprob = static_cast<float>(r[2]);
    const int64_t n = std::min<int64_t>(draws[b].top_logprobs, top_n);
    for (int64_t j = 0; j < n; ++j) {
      d.top_logprobs.emplace_back(static_cast<int32_t>(r[3 + j]),
                                  static_cast<float>(r[3 + top_n + j]));
    }
  }
  return out;
}

}  // namespace tost::model
