// The ATen reference against literal scalar transcriptions of docs/model-semantics.md §1.1/§2.1,
// and the algebraic identities every TSSA implementation must satisfy (chunked = whole prefill,
// step = prefill, continuation from a state). The dispatcher path (tost::tssa*) is checked too.
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels/reference.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels {
namespace {

at::Tensor Rand(std::vector<int64_t> shape, at::ScalarType dtype = at::kDouble, uint64_t seed = 1) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(dtype));
}

// §1.1 steps 2-7 with loops, float64.
at::Tensor VisionLiteral(const at::Tensor& w_in, const at::Tensor& temp) {
  const int64_t B = w_in.size(0), N = w_in.size(1), D = w_in.size(2), K = temp.size(0), p = D / K;
  auto w = w_in.accessor<double, 3>();
  auto t = temp.accessor<double, 1>();
  at::Tensor y = at::zeros_like(w_in);
  auto out = y.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> nu(D), pi(N * K), n(K), dots(D);
    for (int64_t ch = 0; ch < D; ++ch) {
      double s = 0;
      for (int64_t j = 0; j < N; ++j) s += w[b][j][ch] * w[b][j][ch];
      nu[ch] = std::max(std::sqrt(s), 1e-12);
    }
    for (int64_t j = 0; j < N; ++j) {
      std::vector<double> logit(K);
      double mx = -1e300, z = 0;
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t c = 0; c < p; ++c) s += std::pow(w[b][j][k * p + c] / nu[k * p + c], 2);
        logit[k] = t[k] * s;
        mx = std::max(mx, logit[k]);
      }
      for (int64_t k = 0; k < K; ++k) z += std::exp(logit[k] - mx);
      for (int64_t k = 0; k < K; ++k) pi[j * K + k] = std::exp(logit[k] - mx) / z;
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < N; ++j) n[k] += pi[j * K + k];
      for (int64_t c = 0; c < p; ++c) {
        double s = 0;
        for (int64_t j = 0; j < N; ++j)
          s += pi[j * K + k] / (n[k] + 1e-8) * w[b][j][k * p + c] * w[b][j][k * p + c];
        dots[k * p + c] = s;
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t c = 0; c < p; ++c) {
          out[b][j][k * p + c] = -w[b][j][k * p + c] * pi[j * K + k] / (1 + dots[k * p + c]);
        }
      }
    }
  }
  return y;
}

// §2.2 recurrence, one token at a time, float64.
at::Tensor CausalLiteral(const at::Tensor& w_in, const at::Tensor& temp, const at::Tensor& delta) {
  const int64_t B = w_in.size(0), T = w_in.size(1), D = w_in.size(2), K = temp.size(0), p = D / K;
  auto w = w_in.accessor<double, 3>();
  auto t = temp.accessor<double, 1>();
  auto db = delta.accessor<double, 2>();
  at::Tensor y = at::zeros_like(w_in);
  auto out = y.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> s1(D), s2(D), s3(K);
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> logit(K), pi(K);
      double mx = -1e300, z = 0;
      for (int64_t k = 0; k < K; ++k) {
        double u = 0;
        for (int64_t c = 0; c < p; ++c) {
          const double x = w[b][i][k * p + c];
          s1[k * p + c] += x * x;
          u += x * x / std::max(s1[k * p + c], 1e-12) + db[k][i];
        }
        logit[k] = t[k] * u;
        mx = std::max(mx, logit[k]);
      }
      for (int64_t k = 0; k < K; ++k) z += std::exp(logit[k] - mx);
      for (int64_t k = 0; k < K; ++k) {
        pi[k] = std::exp(logit[k] - mx) / z;
        s3[k] += pi[k];
        for (int64_t c = 0; c < p; ++c) {
          const double x = w[b][i][k * p + c];
          s2[k * p + c] += pi[k] * x * x;
          out[b][i][k * p + c] = -x * pi[k] / (1 + s2[k * p + c] / (s3[k] + 1e-8));
        }
      }
    }
  }
  return y;
}

TEST(TssaReference, VisionMatchesLiteralTranscription) {
  for (auto [n, d, k] : {std::tuple{1, 8, 2}, {7, 20, 4}, {33, 24, 3}}) {
    const at::Tensor w = Rand({2, n, d}) * 2;
    const at::Tensor temp = Rand({k}, at::kDouble, 7).abs() + 0.5;
    const at::Tensor y = reference::tssa(w, temp);
    EXPECT_TRUE(at::allclose(y, VisionLiteral(w, temp), 1e-10, 1e-12))
        << "N=" << n << " D=" << d << " K=" << k;
  }
}

TEST(TssaReference, CausalMatchesRecurrence) {
  const int64_t T = 40, D = 12, K = 3;
  const at::Tensor w = Rand({2, T, D}) * 1.5;
  const at::Tensor temp = Rand({K}, at::kDouble, 3).abs() + 0.5;
  const at::Tensor delta = Rand({K, 64}, at::kDouble, 4) * 0.3;
  auto [y, state] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
  EXPECT_TRUE(at::allclose(y, CausalLiteral(w, temp, delta), 1e-10, 1e-12));
  EXPECT_EQ(state.sizes(), (std::vector<int64_t>{2, StateWidth(D, K)}));
  // S1 is the plain sum of squares over all tokens.
  EXPECT_TRUE(at::allclose(state.slice(1, 0, D).to(at::kDouble), (w * w).sum(1), 1e-5, 1e-6));
}

TEST(TssaReference, FirstTokenMembershipDependsOnlyOnTempAndDelta) {
  const int64_t D = 8, K = 2, p = D / K;
  const at::Tensor temp = at::tensor({1.0, 2.0}, at::kDouble);
  const at::Tensor delta = at::tensor({0.1, -0.2}, at::kDouble).view({K, 1});
  auto [y1, s1] = reference::tssa_causal(Rand({1, 1, D}, at::kDouble, 1), temp, delta, std::nullopt,
                                         std::nullopt);
  auto [y2, s2] = reference::tssa_causal(Rand({1, 1, D}, at::kDouble, 2), temp, delta, std::nullopt,
                                         std::nullopt);
  // Π = softmax(temp · (p + p·δ)) for every non-zero first token.
  const at::Tensor pi = at::softmax(temp * (p + p * delta.view({K})), 0).to(at::kFloat);
  EXPECT_TRUE(at::allclose(s1.slice(1, 2 * D), pi.view({1, K}), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(s2.slice(1, 2 * D), pi.view({1, K}), 1e-5, 1e-6));
}

TEST(TssaReference, ChunkedPrefillEqualsWhole) {
  const int64_t T = 37, D = 20, K = 4;
  const at::Tensor w = Rand({3, T, D}, at::kFloat) * 2;
  const at::Tensor temp = Rand({K}, at::kFloat, 5).abs() + 0.5;
  const at::Tensor delta = Rand({K, 50}, at::kFloat, 6) * 0.2;
  auto [whole, whole_state] = tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
  std::optional<at::Tensor> state;
  at::Tensor positions = at::zeros({3}, at::kLong);
  std::vector<at::Tensor> parts;
  for (auto [start, len] : {std::pair{0, 1}, {1, 16}, {17, 13}, {30, 7}}) {
    auto [y, st] = tssa_causal(w.slice(1, start, start + len), temp, delta, state, positions);
    parts.push_back(y);
    state = st;
    positions = positions + len;
  }
  EXPECT_TRUE(at::allclose(at::cat(parts, 1), whole, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(*state, whole_state, 1e-5, 1e-5));
}

TEST(TssaReference, StepsEqualPrefillAtMixedPositions) {
  const int64_t T = 25, D = 16, K = 4;
  const at::Tensor w = Rand({2, T, D}, at::kFloat) * 2;
  const at::Tensor temp = Rand({K}, at::kFloat, 8).abs() + 0.5;
  const at::Tensor delta = Rand({K, 40}, at::kFloat, 9) * 0.2;
  auto [whole, whole_state] = tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
  // Sequence 0 starts stepping at 0; sequence 1 is prefilled for 10 tokens first, so the batched
  // step serves two sequences at different positions.
  at::Tensor state = at::zeros({2, StateWidth(D, K)}, at::kFloat);
  auto [pre, pre_state] =
      tssa_causal(w.slice(0, 1, 2).slice(1, 0, 10), temp, delta, std::nullopt, std::nullopt);
  state[1].copy_(pre_state[0]);
  std::vector<int64_t> pos = {0, 10};
  for (int i = 0; i < 15; ++i) {
    const at::Tensor step_w = at::stack({w[0][pos[0]], w[1][pos[1]]});
    const at::Tensor y = tssa_step(step_w, temp, delta, at::tensor(pos), state);
    EXPECT_TRUE(at::allclose(y[0], whole[0][pos[0]], 1e-5, 1e-6)) << "step " << i;
    EXPECT_TRUE(at::allclose(y[1], whole[1][pos[1]], 1e-5, 1e-6)) << "step " << i;
    ++pos[0], ++pos[1];
  }
}

TEST(TssaReference, NonContiguousInputsGiveTheSameResult) {
  const at::Tensor base = Rand({2, 24, 9}, at::kFloat);  // [B, D, N] then transposed: strided w
  const at::Tensor w = base.transpose(1, 2).slice(2, 0, 24);
  ASSERT_FALSE(w.is_contiguous());
  const at::Tensor temp = at::ones({4}, at::kFloat);
  EXPECT_TRUE(at::allclose(tssa(w, temp), tssa(w.contiguous(), temp)));
  const at::Tensor delta = at::zeros({4, 16}, at::kFloat);
  EXPECT_TRUE(at::allclose(
      std::get<0>(tssa_causal(w, temp, delta, std::nullopt, std::nullopt)),
      std::get<0>(tssa_causal(w.contiguous(), temp, delta, std::nullopt, std::nullopt))));
}

TEST(TssaReference, HalfPrecisionInputsKeepFloat32Statistics) {
  const at::Tensor w = Rand({1, 64, 16}, at::kFloat);
  const at::Tensor temp = at::ones({4}, at::kFloat);
  const at::Tensor y16 = tssa(w.to(at::kBFloat16), temp);
  EXPECT_EQ(y16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(y16.to(at::kFloat), tssa(w, temp), 2e-2, 2e-2));
}

TEST(TssaReference, ArgumentErrorsNameTheArgument) {
  const at::Tensor w = at::zeros({1, 4, 10});
  try {
    tssa(w, at::ones({3}));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by the number of heads K=3"), std::string::npos)
        << e.what();
  }
  const at::Tensor delta = at::zeros({2, 4});
  try {
    tssa_causal(at::zeros({1, 5, 10}), at::ones({2}), delta, std::nullopt, std::nullopt);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the context length Tmax=4"), std::string::npos)
        << e.what();
  }
  at::Tensor state = at::zeros({1, 7});
  EXPECT_THROW(
      tssa_step(at::zeros({1, 10}), at::ones({2}), delta, at::zeros({1}, at::kLong), state),
      c10::Error);
}

}  // namespace
}  // namespace tost::kernels
