#include "model/sampling/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/split_mix.h"

namespace tost::model {
namespace {

// CTRL-style penalty: positive logits are divided, negative ones multiplied, once per distinct
// token.
std::vector<float> Penalised(absl::Span<const float> logits, const SamplingParams& p,
                             absl::Span<const int32_t> recent) {
  std::vector<float> out(logits.begin(), logits.end());
  if (p.repetition_penalty == 1.f || recent.empty()) return out;
  std::vector<bool> seen(out.size(), false);
  for (int32_t t : recent) {
    if (t < 0 || static_cast<size_t>(t) >= out.size() || seen[t]) continue;
    seen[t] = true;
    out[t] = out[t] > 0 ? out[t] / p.repetition_penalty : out[t] * p.repetition_penalty;
  }
  return out;
}

// The k best candidates, most likely first, ties to the lower id: the order a comparison sort by
// (logit descending, id ascending) gives. A few candidates are selected and then sorted; most of
// the vocabulary is radix-sorted on the logits' bits (4 stable passes of 8 bits, linear in the
// vocabulary: a comparison sort of GPT-2's 50k ids took 5 ms a token).
std::vector<int32_t> CandidatesByLogit(absl::Span<const float> logits, int32_t k) {
  const auto n = static_cast<int32_t>(logits.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (static_cast<int64_t>(k) * 16 < n) {
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), by_logit);
    std::sort(order.begin(), order.begin() + k, by_logit);
    order.resize(k);
    return order;
  }
  // Keys whose unsigned order is the logits' order, largest first. A float's sign-magnitude bits
  // sort as unsigned integers once a negative has every bit flipped and a positive its sign bit
  // set; inverting that puts the largest first. -0 and +0 compare equal, so they get one key and
  // keep their ids' order.
  std::vector<uint32_t> key(n), key_next(n);
  std::vector<int32_t> order_next(n);
  for (int32_t i = 0; i < n; ++i) {
    const float f = logits[i] == 0.f ? 0.f : logits[i];
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    key[i] = ~((bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u));
  }
  for (int shift = 0; shift < 32; shift += 8) {
    std::array<int32_t, 257> start{};
    for (int32_t i = 0; i < n; ++i) ++start[((key[i] >> shift) & 0xFFu) + 1];
    for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
    for (int32_t i = 0; i < n; ++i) {
      const int32_t to = start[(key[i] >> shift) & 0xFFu]++;
      key_next[to] = key[i];
      order_next[to] = order[i];
    }
    key.swap(key_next);
    order.swap(order_next);
  }
  order.resize(k);
  return order;
}

// log Σ exp(logit) in double, shifted by the largest logit so that nothing overflows. One
// function for the alternatives and the drawn token, so that a drawn token among the alternatives
// reports the very value listed there.
double LogPartition(absl::Span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - max_logit);
  return std::log(z) + max_logit;
}

float Logprob(float logit, double log_z) { return static_cast<float>(logit - log_z); }

// TopLogprobs with the partition already worked out.
std::vector<std::pair<int32_t, float>> TopLogprobsGiven(absl::Span<const float> logits, int32_t n,
                                                        double log_z) {
  const int32_t v = static_cast<int32_t>(logits.size());
  n = std::clamp(n, 0, v);
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int32_t i = 0; i < n; ++i) out.emplace_back(order[i], Logprob(logits[order[i]], log_z));
  return out;
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  // Logits are divided by the temperature and by the repetition penalty: a tiny divisor turns
  // them into infinities, and every probability into NaN. The ranges keep both well inside float.
  if (!(p.temperature == 0.f ||
        (p.temperature >= kMinTemperature && p.temperature <= kMaxTemperature))) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be 0 (greedy) or in [",
                                                   kMinTemperature, ", ", kMaxTemperature,
                                                   "], got ", p.temperature));
  }
  if (p.top_k < 0)
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.f && p.min_p < 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1), got ", p.min_p));
  }
  if (!(p.repetition_penalty >= kMinRepetitionPenalty &&
        p.repetition_penalty <= kMaxRepetitionPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be in [", kMinRepetitionPenalty, ", ",
                     kMaxRepetitionPenalty, "], got ", p.repetition_penalty));
  }
  if (p.repetition_window < 0 || p.repetition_window > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_window must be in [0, 4096], got ", p.repetition_window));
  }
  return absl::OkStatus();
}

double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits =
      base::SplitMix64(base::SplitMix64(seed) ^ (counter * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t SampleToken(absl::Span<const float> raw_logits, const SamplingParams& p, uint64_t position,
                    absl::Span<const int32_t> recent) {
  const bool greedy = p.temperature == 0.f || p.top_k == 1;
  if (greedy && (p.repetition_penalty == 1.f || recent.empty())) {
    // The common greedy draw reads the logits in place (no copy of the vocabulary per token).
    return static_cast<int32_t>(std::max_element(raw_logits.begin(), raw_logits.end()) -
                                raw_logits.begin());
  }
  const std::vector<float> logits = Penalised(raw_logits, p, recent);
  const int32_t n = static_cast<int32_t>(logits.size());
  if (greedy) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit (descending, ties by id) so top-k, min-p and top-p cut a prefix.
  const int32_t k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  std::vector<int32_t> order = CandidatesByLogit(logits, k);

  std::vector<double> probs(k);
  const double max_logit = logits[order[0]];
  double total = 0;
  for (int32_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / p.temperature);
    total += probs[i];
  }
  int32_t keep = k;
  if (p.min_p > 0.f) {
    // probs[0] is the most likely candidate's (unnormalised) probability.
    while (keep > 1 && probs[keep - 1] < p.min_p * probs[0]) --keep;
  }
  if (p.top_p < 1.f) {
    double mass = 0;
    for (int32_t i = 0; i < keep; ++i) {
      mass += probs[i] / total;
      if (mass >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double kept_total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  const double r = CounterUniform(p.seed, position) * kept_total;
  double acc = 0;
  for (int32_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<std::pair<int32_t, float>> TopLogprobs(absl::Span<const float> logits, int32_t n) {
  return TopLogprobsGiven(logits, n, LogPartition(logits));
}

void MaskDisallowed(absl::Span<const uint32_t> allowed, absl::Span<float> logits) {
  if (allowed.empty()) return;
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  const size_t covered_words = std::min(allowed.size(), (n + 31) / 32);
  for (size_t w = 0; w < covered_words; ++w) {
    // Whole words of allowed ids are common (skipped at once); within a word only the clear bits
    // are visited.
    uint32_t forbidden = ~allowed[w];
    const size_t base = w * 32;
    while (forbidden != 0) {
      const size_t id = base + static_cast<size_t>(__builtin_ctz(forbidden));
      forbidden &= forbidden - 1;
      if (id < n) logits[id] = kForbidden;
    }
  }
  for (size_t id = covered_words * 32; id < n; ++id) logits[id] = kForbidden;
}

void ApplyLogitBias(absl::Span<const std::pair<int32_t, float>> bias, absl::Span<float> logits) {
  for (const auto& [id, b] : bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] += b;
  }
}

std::vector<DrawnToken> DrawTokens(absl::Span<const float> logits, int64_t defined_vocab,
                                   absl::Span<const TokenDraw> draws) {
  std::vector<DrawnToken> out(draws.size());
  if (draws.empty()) return out;
  const size_t vocab = logits.size() / draws.size();
  const size_t defined = std::min(vocab, static_cast<size_t>(std::max<int64_t>(0, defined_vocab)));
  std::vector<float> row;
  for (size_t b = 0; b < draws.size(); ++b) {
    row.assign(logits.begin() + static_cast<std::ptrdiff_t>(b * vocab),
               logits.begin() + static_cast<std::ptrdiff_t>((b + 1) * vocab));
    std::fill(row.begin() + static_cast<std::ptrdiff_t>(defined), row.end(),
              -std::numeric_limits<float>::infinity());
    DrawnToken& d = out[b];
    for (size_t i = 0; i < defined; ++i) {
      if (!std::isfinite(row[i])) {
        d.nonfinite_id = static_cast<int64_t>(i);
        break;
      }
    }
    if (d.nonfinite_id >= 0) continue;
    const TokenDraw& draw = draws[b];
    // After the check above: a forbidden id's -infinity is the constraint's, not an overflow.
    MaskDisallowed(draw.allowed, absl::MakeSpan(row));
    // Only the defined ids: a padded id stays -infinity whatever its bias.
    ApplyLogitBias(draw.logit_bias, absl::MakeSpan(row.data(), defined));
    d.id = SampleToken(row, draw.params, draw.position, draw.recent);
    if (!draw.wants_logprob()) continue;
    const double log_z = LogPartition(row);
    d.logprob = Logprob(row[d.id], log_z);
    if (draw.top_logprobs > 0) d.top_logprobs = TopLogprobsGiven(row, draw.top_logprobs, log_z);
  }
  return out;
}

std::vector<DrawnToken> ScoreTokens(absl::Span<const float> logits, int64_t defined_vocab,
                                    absl::Span<const int32_t> tokens, int32_t top_n) {
  std::vector<DrawnToken> out;
  if (tokens.size() < 2) return out;
  const size_t vocab = logits.size() / tokens.size();
  const size_t defined = std::min(vocab, static_cast<size_t>(std::max<int64_t>(0, defined_vocab)));
  out.resize(tokens.size() - 1);
  for (size_t i = 1; i < tokens.size(); ++i) {
    DrawnToken& d = out[i - 1];
    d.id = tokens[i];
    const absl::Span<const float> row = logits.subspan((i - 1) * vocab, defined);
    for (size_t j = 0; j < defined; ++j) {
      if (!std::isfinite(row[j])) {
        d.nonfinite_id = static_cast<int64_t>(j);
        break;
      }
    }
    if (d.nonfinite_id >= 0 || defined == 0) continue;
    const double log_z = LogPartition(row);
    d.logprob = d.id >= 0 && static_cast<size_t>(d.id) < defined
                    ? Logprob(row[d.id], log_z)
                    : -std::numeric_limits<float>::infinity();
    if (top_n > 0) d.top_logprobs = TopLogprobsGiven(row, top_n, log_z);
  }
  return out;
}

}  // namespace tost::model
