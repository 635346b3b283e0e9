#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tost::model {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be a finite number >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  return absl::OkStatus();
}

double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (counter * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& p, uint64_t position) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (p.temperature == 0.f || p.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit (descending, ties by id) so top-k and top-p cut a prefix.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int32_t k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(k);

  std::vector<double> probs(k);
  const double max_logit = logits[order[0]];
  double total = 0;
  for (int32_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / p.temperature);
    total += probs[i];
  }
  int32_t keep = k;
  if (p.top_p < 1.f) {
    double mass = 0;
    for (int32_t i = 0; i < k; ++i) {
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

}  // namespace tost::model
