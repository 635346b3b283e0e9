// tost_sampler_bench: the host draw of a 64-row decode step (model::DrawTokens, what a CPU model
// runs per step) against the same draw over a comparison sort of the vocabulary (the order the
// sampler defines: logit descending, ties to the lower id), side by side at several vocabulary
// sizes. Both must draw the same ids; exits 1 where they do not.
//
//   tost_sampler_bench [--rows=64] [--vocab=257,2048,50304] [--seconds=1]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "model/sampling/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;
using tost::model::SamplingParams;

// SampleToken's draw for plain temperature sampling, over a comparison sort of every candidate.
int32_t ComparisonSortDraw(const std::vector<float>& logits, const SamplingParams& p,
                           uint64_t position) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> probs(order.size());
  const double max_logit = logits[order[0]];
  for (size_t i = 0; i < order.size(); ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / p.temperature);
  }
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  const double r = tost::model::CounterUniform(p.seed, position) * total;
  double acc = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    acc += probs[i];
    if (r < acc) return order[i];
  }
  return order.back();
}

// Mean milliseconds per call of `draw_all` over about `seconds`.
template <typename F>
double TimeMs(double seconds, F&& draw_all) {
  draw_all();  // warm-up
  int calls = 0;
  const Clock::time_point start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds || calls < 2) {
    draw_all();
    ++calls;
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 64;
  double seconds = 1;
  std::vector<int> vocabs = {257, 2048, 50304};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = true;
    if (a.rfind("--rows=", 0) == 0) {
      ok = absl::SimpleAtoi(a.substr(7), &rows) && rows > 0;
    } else if (a.rfind("--seconds=", 0) == 0) {
      ok = absl::SimpleAtod(a.substr(10), &seconds) && seconds > 0;
    } else if (a.rfind("--vocab=", 0) == 0) {
      vocabs.clear();
      for (absl::string_view v : absl::StrSplit(a.substr(8), ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(v, &n) && n > 0;
        vocabs.push_back(n);
      }
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "tost_sampler_bench: expected --rows=N, --vocab=N,N,... or --seconds=S, got "
                   "'%s'\n",
                   a.c_str());
      return 2;
    }
  }
  std::printf("host draw of a %d-row step, temperature 1 (no cut): ms per step\n", rows);
  std::printf("  %8s %14s %18s %8s\n", "vocab", "DrawTokens", "comparison sort", "ratio");
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  int status = 0;
  for (int vocab : vocabs) {
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& l : logits) l = std::round(normal(rng) * 64) / 64;  // ties, as real logits have
    std::vector<tost::model::TokenDraw> draws(rows);
    for (int b = 0; b < rows; ++b) draws[b] = {{.seed = static_cast<uint64_t>(b)}, 7, {}, 0};
    std::vector<int32_t> fast, reference;
    const double fast_ms = TimeMs(seconds, [&] {
      fast.clear();
      for (const auto& d : tost::model::DrawTokens(logits, vocab, draws)) fast.push_back(d.id);
    });
    const double reference_ms = TimeMs(seconds, [&] {
      reference.clear();
      for (int b = 0; b < rows; ++b) {
        const std::vector<float> row(logits.begin() + static_cast<ptrdiff_t>(b) * vocab,
                                     logits.begin() + static_cast<ptrdiff_t>(b + 1) * vocab);
        reference.push_back(ComparisonSortDraw(row, draws[b].params, draws[b].position));
      }
    });
    std::printf("  %8d %14.3f %18.3f %7.1fx%s\n", vocab, fast_ms, reference_ms,
                reference_ms / fast_ms, fast == reference ? "" : "   DIFFERENT DRAWS");
    if (fast != reference) status = 1;
  }
  return status;
}
