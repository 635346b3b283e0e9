// The batched draw on the logits' device against DrawTokens, the host reference. On the CPU the
// two sum in the same order, so every drawn id must agree; the logprobs (the drawn token's and the
// alternatives') are normalised by a sum in another order (a tree reduction) and agree to float
// rounding. The device form runs on CPU tensors here.
#include "model/device/device_sampler.h"

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace tost::model {
namespace {

at::Tensor AsTensor(const std::vector<float>& logits, int64_t rows) {
  return at::tensor(logits).view({rows, -1});
}

void ExpectSameDraws(const std::vector<DrawnToken>& want, const std::vector<DrawnToken>& got,
                     const std::string& where) {
  ASSERT_EQ(want.size(), got.size()) << where;
  for (size_t b = 0; b < want.size(); ++b) {
    const std::string row = absl::StrCat(where, " row ", b);
    EXPECT_EQ(want[b].nonfinite_id, got[b].nonfinite_id) << row;
    if (want[b].nonfinite_id >= 0) continue;
    EXPECT_EQ(want[b].id, got[b].id) << row;
    EXPECT_NEAR(want[b].logprob, got[b].logprob, 1e-6f * (1.f + std::abs(want[b].logprob))) << row;
    ASSERT_EQ(want[b].top_logprobs.size(), got[b].top_logprobs.size()) << row;
    for (size_t j = 0; j < want[b].top_logprobs.size(); ++j) {
      EXPECT_EQ(want[b].top_logprobs[j].first, got[b].top_logprobs[j].first) << row << " alt " << j;
      const float w = want[b].top_logprobs[j].second, g = got[b].top_logprobs[j].second;
      if (w == g) continue;  // padded ids asked for past the defined ones are -inf on both sides
      EXPECT_NEAR(w, g, 1e-6f * (1.f + std::abs(w))) << row << " alt " << j;
    }
  }
}

// Every sampling parameter, alone and combined, over logits with ties, padded vocabularies and
// penalty windows with repeats and out-of-range ids.
TEST(DeviceSampler, DrawsWhatTheHostDrawsForEveryParameterMix) {
  std::mt19937 rng(20261123);
  const std::vector<float> temperatures = {0.f, 0.05f, 0.7f, 1.f, 3.f, 50.f};
  const std::vector<int32_t> top_ks = {0, 1, 3, 40, 1000};
  const std::vector<float> top_ps = {1.f, 0.95f, 0.5f, 0.1f};
  const std::vector<float> min_ps = {0.f, 0.05f, 0.5f};
  const std::vector<float> penalties = {1.f, 1.3f, 0.7f, 20.f};
  const std::vector<int32_t> alternatives = {0, 1, 5, 300};
  int64_t sampled_rows = 0;
  int64_t own_logprobs = 0;  // rows asking for the drawn token's logprob without alternatives
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 6);
    const int64_t vocab = std::vector<int64_t>{2, 7, 64, 257}[rng() % 4];
    const int64_t defined = rng() % 3 == 0 ? std::max<int64_t>(1, vocab - 3) : vocab;
    std::normal_distribution<float> normal(0.f, 2.f);
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    const bool coarse = trial % 4 == 0;  // few distinct values: ties everywhere
    for (float& l : logits) l = coarse ? std::round(normal(rng)) : normal(rng);
    std::vector<std::vector<int32_t>> recent(static_cast<size_t>(rows));
    std::vector<TokenDraw> draws(static_cast<size_t>(rows));
    for (int64_t b = 0; b < rows; ++b) {
      SamplingParams p;
      p.temperature = temperatures[rng() % temperatures.size()];
      p.top_k = top_ks[rng() % top_ks.size()];
      p.top_p = top_ps[rng() % top_ps.size()];
      p.min_p = min_ps[rng() % min_ps.size()];
      p.repetition_penalty = penalties[rng() % penalties.size()];
      p.seed = rng();
      for (int i = 0; i < 12; ++i) {
        recent[b].push_back(static_cast<int32_t>(rng() % (vocab + 4)) - 2);  // some out of range
      }
      const int32_t top_logprobs = alternatives[rng() % alternatives.size()];
      draws[b] = {p, rng() % 100000, recent[b], top_logprobs, /*logprobs=*/rng() % 2 == 0};
      own_logprobs += draws[b].wants_logprob() && top_logprobs == 0;
      sampled_rows += p.temperature != 0.f && p.top_k != 1;
    }
    const auto where =
        absl::StrCat("trial ", trial, " (", rows, "x", vocab, ", ", defined, " defined)");
    ExpectSameDraws(DrawTokens(logits, defined, draws),
                    DrawTokensOnDevice(AsTensor(logits, rows), defined, draws), where);
  }
  EXPECT_GT(sampled_rows, 500);  // the mix really exercises the distribution path
  EXPECT_GT(own_logprobs, 50);
}

// Many draws from one distribution: the device form's frequencies are the softmax's too (the
// equality above could otherwise hold for a draw that ignores its random number).
TEST(DeviceSampler, FrequenciesFollowTheSoftmax) {
  const int64_t rows = 4000;
  std::vector<float> logits;
  std::vector<TokenDraw> draws;
  SamplingParams p;
  p.seed = 9;
  for (int64_t b = 0; b < rows; ++b) {
    logits.insert(logits.end(), {0.f, std::log(3.f)});  // p = 1/4, 3/4
    draws.push_back({p, static_cast<uint64_t>(b), {}, 0});
  }
  const std::vector<DrawnToken> drawn = DrawTokensOnDevice(AsTensor(logits, rows), 2, draws);
  int ones = 0;
  for (const DrawnToken& d : drawn) ones += d.id;
  EXPECT_NEAR(static_cast<double>(ones) / rows, 0.75, 0.03);
}

TEST(DeviceSampler, ReportsTheFirstNonFiniteDefinedId) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.f, 1.f, inf, std::nanf(""),  // row 0: id 2
                                     0.f, 1.f, 2.f, inf};           // row 1: only a padded id
  const std::vector<TokenDraw> draws(2);
  const std::vector<DrawnToken> drawn = DrawTokensOnDevice(AsTensor(logits, 2), 3, draws);
  EXPECT_EQ(drawn[0].nonfinite_id, 2);
  EXPECT_EQ(drawn[1].nonfinite_id, -1);
  EXPECT_LT(drawn[1].id, 3);  // the padded id is never drawn, whatever its logit
}

// A reduced-precision model's logits are drawn from as the float values they round to.
TEST(DeviceSampler, ReducedPrecisionLogitsDrawAsTheirFloatValues) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(3 * 100);
  for (float& l : logits) l = normal(rng);
  const at::Tensor bf16 = AsTensor(logits, 3).to(at::kBFloat16);
  const at::Tensor widened = bf16.to(at::kFloat).contiguous();
  const std::vector<float> as_float(widened.data_ptr<float>(),
                                    widened.data_ptr<float>() + widened.numel());
  SamplingParams p;
  p.seed = 1;
  p.top_p = 0.9f;
  const std::vector<TokenDraw> draws = {
      {p, 1, {}, 3}, {p, 2, {}, 0}, {{.temperature = 0.f}, 3, {}, 1}};
  ExpectSameDraws(DrawTokens(as_float, 100, draws), DrawTokensOnDevice(bf16, 100, draws), "bf16");
}

TEST(DeviceSampler, TheLogitsAreLeftAsTheyWere) {
  const std::vector<float> logits = {1.f, 5.f, 2.f, 7.f};
  const at::Tensor t = AsTensor(logits, 1);
  const at::Tensor before = t.clone();
  SamplingParams p;
  p.repetition_penalty = 2.f;
  const std::vector<int32_t> recent = {1};
  const std::vector<TokenDraw> draws = {{p, 0, recent, 2}};
  (void)DrawTokensOnDevice(t, 3, draws);  // masks id 3 and penalises id 1 on its own copies
  EXPECT_TRUE(at::equal(t, before));
}

// Constrained rows (TokenDraw::allowed) beside unconstrained ones: the device draws what the host
// draws, never a forbidden id, and reports the logprobs of the constrained distribution. (On the
// CPU the mask is the CPU kernel of tost::apply_token_bitmask_; the CUDA kernel is checked against
// the same reference in tests/kernels/gpu.)
TEST(DeviceSampler, ConstrainedRowsDrawOnlyAllowedIdsAsTheHostDoes) {
  std::mt19937 rng(20261126);
  std::normal_distribution<float> normal(0.f, 2.f);
  int64_t constrained_rows = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t vocab = std::vector<int64_t>{3, 33, 64, 257}[rng() % 4];
    const int64_t defined = rng() % 3 == 0 ? std::max<int64_t>(1, vocab - 2) : vocab;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& l : logits) l = normal(rng);
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(rows));
    std::vector<TokenDraw> draws(static_cast<size_t>(rows));
    for (int64_t b = 0; b < rows; ++b) {
      SamplingParams p;
      p.temperature = std::vector<float>{0.f, 0.7f, 1.f}[rng() % 3];
      p.top_k = std::vector<int32_t>{0, 2, 50}[rng() % 3];
      p.top_p = rng() % 2 == 0 ? 1.f : 0.8f;
      p.seed = rng();
      const int32_t top_logprobs = std::vector<int32_t>{0, 1, 5}[rng() % 3];
      draws[b] = {p, rng() % 100000, {}, top_logprobs, rng() % 2 == 0};
      if (rng() % 4 == 0) continue;  // unconstrained
      // Some words left off the end (ids past them are forbidden), some past the vocabulary
      // (ignored, bits and all), some ids allowed.
      const int64_t needed = (vocab + 31) / 32;
      const uint32_t span = rng() % 3;
      const int64_t words =
          span == 0 && vocab > 32 ? needed - 1 : (span == 1 ? needed + 1 : needed);
      masks[b].assign(static_cast<size_t>(words), 0);
      for (int64_t i = 0; i < 32 * words; ++i) {
        if (rng() % 3 == 0) masks[b][i / 32] |= 1u << (i % 32);
      }
      masks[b][0] |= 1u;  // id 0 is always defined: at least one id may be drawn
      draws[b].allowed = masks[b];
      ++constrained_rows;
    }
    const auto where = absl::StrCat("trial ", trial, " (", rows, "x", vocab, ")");
    const std::vector<DrawnToken> host = DrawTokens(logits, defined, draws);
    const std::vector<DrawnToken> device =
        DrawTokensOnDevice(AsTensor(logits, rows), defined, draws);
    ExpectSameDraws(host, device, where);
    for (int64_t b = 0; b < rows; ++b) {
      if (masks[b].empty()) continue;
      const int32_t id = device[b].id;
      ASSERT_LT(id / 32, static_cast<int32_t>(masks[b].size())) << where << " row " << b;
      EXPECT_TRUE((masks[b][id / 32] >> (id % 32)) & 1u) << where << " row " << b << " drew " << id;
    }
  }
  EXPECT_GT(constrained_rows, 200);
}

// Logit biases (some on padded or forbidden ids) move the device's draws and logprobs as they move
// the host's.
TEST(DeviceSampler, LogitBiasesDrawAsTheHostDraws) {
  std::mt19937 rng(20261129);
  std::normal_distribution<float> normal(0.f, 2.f);
  int64_t moved = 0;  // rows whose greedy id the bias changed
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t vocab = std::vector<int64_t>{3, 33, 257}[rng() % 3];
    const int64_t defined = rng() % 3 == 0 ? std::max<int64_t>(1, vocab - 2) : vocab;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& l : logits) l = normal(rng);
    std::vector<std::vector<std::pair<int32_t, float>>> biases(static_cast<size_t>(rows));
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(rows));
    std::vector<TokenDraw> draws(static_cast<size_t>(rows));
    for (int64_t b = 0; b < rows; ++b) {
      SamplingParams p;
      p.temperature = std::vector<float>{0.f, 0.7f, 1.f}[rng() % 3];
      p.top_k = std::vector<int32_t>{0, 2}[rng() % 2];
      p.seed = rng();
      draws[b] = {p, rng() % 100000, {}, std::vector<int32_t>{0, 1, 5}[rng() % 3], true};
      std::vector<char> used(static_cast<size_t>(vocab), 0);
      for (int i = 0; i < 4; ++i) {
        const auto id = static_cast<int32_t>(rng() % vocab);
        if (used[id]) continue;
        used[id] = 1;
        biases[b].emplace_back(id, std::vector<float>{-100.f, -3.5f, 0.25f, 100.f}[rng() % 4]);
      }
      draws[b].logit_bias = biases[b];
      if (rng() % 3 == 0) {
        masks[b].assign(static_cast<size_t>((vocab + 31) / 32), 0);
        for (int64_t i = 0; i < vocab; ++i) {
          if (rng() % 2 == 0) masks[b][i / 32] |= 1u << (i % 32);
        }
        masks[b][0] |= 1u;
        draws[b].allowed = masks[b];
      }
      TokenDraw unbiased = draws[b];
      unbiased.logit_bias = {};
      const std::vector<float> row(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
      if (p.temperature == 0.f &&
          DrawTokens(row, defined, std::vector<TokenDraw>{unbiased})[0].id !=
              DrawTokens(row, defined, std::vector<TokenDraw>{draws[b]})[0].id) {
        ++moved;
      }
    }
    const auto where = absl::StrCat("trial ", trial, " (", rows, "x", vocab, ")");
    ExpectSameDraws(DrawTokens(logits, defined, draws),
                    DrawTokensOnDevice(AsTensor(logits, rows), defined, draws), where);
  }
  EXPECT_GT(moved, 20);  // the biases really steer draws
}

TEST(DeviceSampler, ALogitsShapeThatDoesNotMatchTheDrawsIsRefused) {
  const std::vector<TokenDraw> draws(3);
  EXPECT_THROW((void)DrawTokensOnDevice(at::zeros({2, 5}), 5, draws), c10::Error);
  EXPECT_TRUE(DrawTokensOnDevice(at::zeros({0, 5}), 5, {}).empty());
}

}  // namespace
}  // namespace tost::model
