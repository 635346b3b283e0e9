// The fused CPU kernels (kernels/cpu/) against the ATen reference, for every instruction set this
// build and CPU can run (DEFAULT, AVX2, AVX-512) and every input dtype: odd sizes, N or T = 1,
// strided inputs, chunked prefill = whole prefill, decode steps = prefill, continuation from a
// state, and the determinism the kernels promise (bit-identical across scan strategies, thread
// counts and batch composition).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/reference.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels {
namespace {

using cpu::CausalScan;
using cpu::CpuIsa;
using cpu::CpuKernelOptions;

at::Tensor Randn(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

struct Shape {
  int64_t channels, heads;
};

// Channel/head shapes: p = 5 (no full vector: every load is a tail) and p = 48 (full vectors).
const Shape kShapes[] = {{20, 4}, {384, 8}};
const int64_t kTokenCounts[] = {1, 7, 1000};
const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

// Both sides are computed from the same input in the same accumulation precision; what remains is
// summation order and y's rounding to its dtype (one or two ulps for bf16 and fp16).
std::pair<double, double> Tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return {1e-9, 1e-11};
    case at::kFloat:
      return {1e-4, 1e-5};
    case at::kHalf:
      return {4e-3, 1e-3};
    default:  // bfloat16
      return {2e-2, 1e-2};
  }
}

// `precision`: the dtype whose tolerance applies (default: the tensors' own).
void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what,
                 std::optional<at::ScalarType> precision = std::nullopt) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  const auto [rtol, atol] = Tolerance(precision.value_or(expected.scalar_type()));
  const at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  const bool ok = at::allclose(a, e, rtol, atol);
  EXPECT_TRUE(ok) << what << ": max |diff| = " << (a - e).abs().max().item<double>() << " (rtol "
                  << rtol << ", atol " << atol << ")";
}

std::string Name(at::ScalarType dtype, const Shape& s, int64_t tokens) {
  return std::string(c10::toString(dtype)) + " D=" + std::to_string(s.channels) +
         " K=" + std::to_string(s.heads) + " tokens=" + std::to_string(tokens);
}

class TssaCpu : public testing::TestWithParam<CpuIsa> {
 protected:
  CpuKernelOptions Options(CausalScan scan = CausalScan::kAuto) const {
    CpuKernelOptions o;
    o.isa = GetParam();
    o.causal_scan = scan;
    return o;
  }
};

TEST_P(TssaCpu, VisionMatchesReference) {
  for (const at::ScalarType dtype : kDtypes) {
    for (const Shape& s : kShapes) {
      for (const int64_t n : kTokenCounts) {
        const at::Tensor w = (Randn({2, n, s.channels}, 11 + n) * 1.5 + 0.2).to(dtype);
        const at::Tensor temp = Randn({s.heads}, 5).abs() + 0.5;
        ExpectClose(cpu::tssa_with(Options(), w, temp), reference::tssa(w, temp),
                    Name(dtype, s, n));
      }
    }
  }
}

TEST_P(TssaCpu, CausalMatchesReferenceWithBothScans) {
  for (const at::ScalarType dtype : kDtypes) {
    for (const Shape& s : kShapes) {
      for (const int64_t t : kTokenCounts) {
        const at::Tensor w = (Randn({2, t, s.channels}, 21 + t) * 1.5).to(dtype);
        const at::Tensor temp = Randn({s.heads}, 6).abs() + 0.5;
        const at::Tensor delta = Randn({s.heads, t + 3}, 7) * 0.3;
        auto [y_ref, st_ref] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
        for (const CausalScan scan : {CausalScan::kSequential, CausalScan::kChunked}) {
          const std::string what =
              Name(dtype, s, t) + (scan == CausalScan::kChunked ? " chunked" : " sequential");
          auto [y, st] =
              cpu::tssa_causal_with(Options(scan), w, temp, delta, std::nullopt, std::nullopt);
          ExpectClose(y, y_ref, what + " y");
          // The state is float32 whatever w is; bf16/fp16 inputs are exact in it.
          ExpectClose(st, st_ref, what + " state");
        }
      }
    }
  }
}

TEST_P(TssaCpu, ManyHeadsMatchReference) {
  // Head sums are reduced eight heads at a time: K = 12 (a full and a partial group, p = 64 as in
  // the language models), K = 16 (two full groups, p = 4) and K = D (p = 1).
  const Shape shapes[] = {{768, 12}, {64, 16}, {40, 40}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Shape& s : shapes) {
      for (const int64_t n : {7, 300}) {
        const std::string what = Name(dtype, s, n);
        const at::Tensor w = (Randn({2, n, s.channels}, 27 + n) * 1.5).to(dtype);
        const at::Tensor temp = Randn({s.heads}, 28).abs() + 0.5;
        const at::Tensor delta = Randn({s.heads, n + 1}, 29) * 0.3;
        ExpectClose(cpu::tssa_with(Options(), w, temp), reference::tssa(w, temp), what + " vision");
        auto [y_ref, st_ref] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
        auto [y, st] = cpu::tssa_causal_with(Options(), w, temp, delta, std::nullopt, std::nullopt);
        ExpectClose(y, y_ref, what + " causal y");
        ExpectClose(st, st_ref, what + " causal state");
        at::Tensor step_state = st.clone(), step_state_ref = st.clone();
        const at::Tensor positions = at::full({2}, n, at::kLong);
        const at::Tensor w_step = w.select(1, 0);
        ExpectClose(cpu::tssa_step_with(Options(), w_step, temp, delta, positions, step_state),
                    reference::tssa_step(w_step, temp, delta, positions, step_state_ref),
                    what + " step");
        ExpectClose(step_state, step_state_ref, what + " step state");
      }
    }
  }
}

TEST_P(TssaCpu, CausalScansAreBitIdenticalAcrossStrategiesAndBatches) {
  for (const at::ScalarType dtype : kDtypes) {
    const at::Tensor w = (Randn({3, 1000, 384}, 31) * 1.5).to(dtype);
    const at::Tensor temp = Randn({8}, 32).abs() + 0.5;
    const at::Tensor delta = Randn({8, 1100}, 33) * 0.3;
    const at::Tensor state = Randn({3, StateWidth(384, 8)}, 34).abs() * 50;
    const at::Tensor positions = at::tensor({0L, 17L, 100L});
    auto [y_seq, st_seq] =
        cpu::tssa_causal_with(Options(CausalScan::kSequential), w, temp, delta, state, positions);
    auto [y_chk, st_chk] =
        cpu::tssa_causal_with(Options(CausalScan::kChunked), w, temp, delta, state, positions);
    EXPECT_TRUE(at::equal(y_seq, y_chk)) << c10::toString(dtype);
    EXPECT_TRUE(at::equal(st_seq, st_chk)) << c10::toString(dtype);
    // A sequence's result does not depend on what else is in the batch.
    auto [y_one, st_one] = cpu::tssa_causal_with(Options(), w.slice(0, 1, 2), temp, delta,
                                                 state.slice(0, 1, 2), positions.slice(0, 1, 2));
    EXPECT_TRUE(at::equal(y_one, y_seq.slice(0, 1, 2))) << c10::toString(dtype);
    EXPECT_TRUE(at::equal(st_one, st_seq.slice(0, 1, 2))) << c10::toString(dtype);
  }
}

TEST_P(TssaCpu, VisionIsBitIdenticalAcrossThreadCountsAndBatches) {
  const at::Tensor w = Randn({3, 5000, 384}, 41);
  const at::Tensor temp = Randn({8}, 42).abs() + 0.5;
  const int threads = at::get_num_threads();
  const at::Tensor y = cpu::tssa_with(Options(), w, temp);
  at::set_num_threads(1);
  const at::Tensor y_one_thread = cpu::tssa_with(Options(), w, temp);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(y, y_one_thread));
  EXPECT_TRUE(at::equal(cpu::tssa_with(Options(), w.slice(0, 2, 3), temp), y.slice(0, 2, 3)));
}

TEST_P(TssaCpu, StreamingStoresWriteTheSameOutput) {
  // Non-temporal stores are chosen for outputs beyond the last-level cache; force both ways here.
  for (const Shape& s : kShapes) {
    const at::Tensor w = Randn({2, 1000, s.channels}, 45);
    const at::Tensor temp = Randn({s.heads}, 46).abs() + 0.5;
    CpuKernelOptions on = Options(), off = Options();
    on.streaming_stores = true;
    off.streaming_stores = false;
    EXPECT_TRUE(at::equal(cpu::tssa_with(on, w, temp), cpu::tssa_with(off, w, temp)))
        << "D=" << s.channels;
  }
}

TEST_P(TssaCpu, StridedInputsAreReadInPlaceOrCopiedWithTheSameResult) {
  const at::Tensor temp = Randn({8}, 51).abs() + 0.5;
  const at::Tensor delta = Randn({8, 400}, 52) * 0.3;
  const at::Tensor wide = Randn({2, 300, 400}, 53);
  const std::vector<std::pair<std::string, at::Tensor>> cases = {
      {"token stride 400 (slice of a wider row)", wide.slice(2, 8, 392)},
      {"batch and token axes transposed", Randn({300, 2, 384}, 54).transpose(0, 1)},
      {"channel stride != 1 (copied)", Randn({2, 384, 300}, 55).transpose(1, 2)},
      {"every other token", Randn({2, 600, 384}, 56).slice(1, 0, 600, 2)},
  };
  for (const auto& [what, w] : cases) {
    ASSERT_FALSE(w.is_contiguous()) << what;
    const at::Tensor wc = w.contiguous();
    EXPECT_TRUE(at::equal(cpu::tssa_with(Options(), w, temp), cpu::tssa_with(Options(), wc, temp)))
        << what;
    ExpectClose(cpu::tssa_with(Options(), w, temp), reference::tssa(wc, temp), what);
    auto [y, st] = cpu::tssa_causal_with(Options(), w, temp, delta, std::nullopt, std::nullopt);
    auto [yc, stc] = cpu::tssa_causal_with(Options(), wc, temp, delta, std::nullopt, std::nullopt);
    EXPECT_TRUE(at::equal(y, yc)) << what;
    EXPECT_TRUE(at::equal(st, stc)) << what;
  }
  // Decode rows taken out of a wider projection, and a strided state updated in place.
  const at::Tensor w_step = wide.select(1, 0).slice(1, 0, 384);  // [2, 384], row stride 400*300
  const at::Tensor positions = at::tensor({3L, 9L});
  at::Tensor state_big = Randn({2, 2 * StateWidth(384, 8)}, 57).abs();
  at::Tensor state = state_big.slice(1, 0, StateWidth(384, 8));
  at::Tensor state_ref = state.clone();
  const at::Tensor y = cpu::tssa_step_with(Options(), w_step, temp, delta, positions, state);
  const at::Tensor y_ref =
      reference::tssa_step(w_step.contiguous(), temp, delta, positions, state_ref);
  ExpectClose(y, y_ref, "strided step y");
  ExpectClose(state, state_ref, "strided step state");
}

TEST_P(TssaCpu, ChunkedPrefillWithStateAndPositionsEqualsWhole) {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const int64_t T = 1000, D = 20, K = 4;
    const at::Tensor w = (Randn({2, T, D}, 61) * 2).to(dtype);
    const at::Tensor temp = Randn({K}, 62).abs() + 0.5;
    const at::Tensor delta = Randn({K, T}, 63) * 0.2;
    auto [whole, whole_state] =
        cpu::tssa_causal_with(Options(), w, temp, delta, std::nullopt, std::nullopt);
    std::optional<at::Tensor> state;
    at::Tensor positions = at::zeros({2}, at::kLong);
    std::vector<at::Tensor> parts;
    for (auto [start, len] : {std::pair{0, 1}, {1, 299}, {300, 7}, {307, 693}}) {
      auto [y, st] = cpu::tssa_causal_with(Options(), w.slice(1, start, start + len), temp, delta,
                                           state, positions);
      parts.push_back(y);
      state = st;
      positions = positions + len;
    }
    // The state between the parts is float32 (the contract), so float64 inputs continue at float32
    // precision.
    const at::ScalarType precision = dtype == at::kDouble ? at::kFloat : dtype;
    ExpectClose(at::cat(parts, 1), whole, std::string(c10::toString(dtype)) + " chunked y",
                precision);
    EXPECT_TRUE(at::allclose(*state, whole_state, 1e-5, 1e-4)) << c10::toString(dtype);
    auto [y_ref, st_ref] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
    ExpectClose(at::cat(parts, 1), y_ref,
                std::string(c10::toString(dtype)) + " chunked vs reference", precision);
  }
}

TEST_P(TssaCpu, StepsEqualPrefillAtMixedPositions) {
  const int64_t T = 330, D = 384, K = 8;
  const at::Tensor w = Randn({3, T, D}, 71) * 1.5;
  const at::Tensor temp = Randn({K}, 72).abs() + 0.5;
  const at::Tensor delta = Randn({K, T}, 73) * 0.2;
  auto [whole, whole_state] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
  // Sequence b is prefilled for prefill[b] tokens, then all three step together, each at its
  // own position.
  const std::vector<int64_t> prefill = {0, 5, 300};
  at::Tensor state = at::zeros({3, StateWidth(D, K)}, at::kFloat);
  for (int64_t b = 0; b < 3; ++b) {
    if (prefill[b] == 0) continue;
    auto [y, st] = cpu::tssa_causal_with(Options(), w.slice(0, b, b + 1).slice(1, 0, prefill[b]),
                                         temp, delta, std::nullopt, std::nullopt);
    state[b].copy_(st[0]);
  }
  std::vector<int64_t> pos = prefill;
  for (int step = 0; step < 30; ++step) {
    const at::Tensor step_w = at::stack({w[0][pos[0]], w[1][pos[1]], w[2][pos[2]]});
    const at::Tensor positions = at::tensor(pos);
    // One step is exactly a one-token prefill from the same state.
    auto [y_prefill, st_prefill] =
        cpu::tssa_causal_with(Options(), step_w.unsqueeze(1), temp, delta, state, positions);
    const at::Tensor y = cpu::tssa_step_with(Options(), step_w, temp, delta, positions, state);
    EXPECT_TRUE(at::equal(y, y_prefill.squeeze(1))) << "step " << step;
    EXPECT_TRUE(at::equal(state, st_prefill)) << "step " << step;
    for (int64_t b = 0; b < 3; ++b) {
      ExpectClose(y[b], whole[b][pos[b]],
                  "sequence " + std::to_string(b) + " step " + std::to_string(step));
      ++pos[b];
    }
  }
}

TEST_P(TssaCpu, ContinuesFromAnImportedState) {
  for (const at::ScalarType dtype : kDtypes) {
    const int64_t T = 7, D = 384, K = 8;
    // A state as a previous prefill of a few hundred tokens leaves it: S1 > 0, 0 < S3.
    const at::Tensor history = Randn({2, 400, D}, 81) * 1.5;
    const at::Tensor temp = Randn({K}, 82).abs() + 0.5;
    const at::Tensor delta = Randn({K, 500}, 83) * 0.2;
    const at::Tensor positions = at::tensor({400L, 350L});
    auto [unused, state] = reference::tssa_causal(history, temp, delta, std::nullopt, std::nullopt);
    const at::Tensor w = (Randn({2, T, D}, 84) * 1.5).to(dtype);
    auto [y_ref, st_ref] = reference::tssa_causal(w, temp, delta, state, positions);
    auto [y, st] = cpu::tssa_causal_with(Options(), w, temp, delta, state, positions);
    ExpectClose(y, y_ref, std::string(c10::toString(dtype)) + " y");
    EXPECT_TRUE(at::allclose(st, st_ref, 1e-5, 1e-4)) << c10::toString(dtype);
    at::Tensor step_state = state.clone(), step_state_ref = state.clone();
    const at::Tensor y_step =
        cpu::tssa_step_with(Options(), w.select(1, 0), temp, delta, positions, step_state);
    ExpectClose(y_step,
                reference::tssa_step(w.select(1, 0), temp, delta, positions, step_state_ref),
                std::string(c10::toString(dtype)) + " step");
    EXPECT_TRUE(at::allclose(step_state, step_state_ref, 1e-5, 1e-4)) << c10::toString(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, TssaCpu, testing::ValuesIn(cpu::AvailableCpuIsas()),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(cpu::CpuIsaName(info.param));
                         });

// Tests below go through the dispatcher (the registered CPU kernels, active ISA).

TEST(TssaCpuOps, TheDispatcherRunsTheFusedKernels) {
  // The reference computes dots as Σ(Π/(n+ε))·w², the fused kernel as ΣΠw²/(n+ε): bitwise
  // equality with the fused kernel and inequality with the reference tell them apart.
  const at::Tensor w = Randn({2, 1000, 384}, 91);
  const at::Tensor temp = Randn({8}, 92).abs() + 0.5;
  EXPECT_TRUE(at::equal(tssa(w, temp), cpu::tssa_with({}, w, temp)));
  EXPECT_FALSE(at::equal(tssa(w, temp), reference::tssa(w, temp)));
}

TEST(TssaCpuOps, LongStreamsKeepFloat32StatisticsAccurate) {
  // 20k tokens in one prefill: the two-level (chunk-local + chunk-start) sums keep the float32
  // state within ~1e-6 of the float64 reference.
  const int64_t T = 20000, D = 20, K = 4;
  const at::Tensor w = Randn({1, T, D}, 101, at::kDouble) * 1.5 + 0.3;
  const at::Tensor temp = Randn({K}, 102, at::kDouble).abs() + 0.5;
  const at::Tensor delta = Randn({K, T}, 103, at::kDouble) * 0.2;
  auto [y64, st64] = reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
  auto [y32, st32] = tssa_causal(w.to(at::kFloat), temp.to(at::kFloat), delta.to(at::kFloat),
                                 std::nullopt, std::nullopt);
  const double state_err =
      ((st32.to(at::kDouble) - st64.to(at::kDouble)).abs() / st64.to(at::kDouble).abs())
          .max()
          .item<double>();
  EXPECT_LT(state_err, 5e-6);
  EXPECT_TRUE(at::allclose(y32.to(at::kDouble), y64, 1e-4, 1e-5));
}

TEST(TssaCpuOps, EmptyInputs) {
  const at::Tensor temp = at::ones({2});
  const at::Tensor delta = at::zeros({2, 8});
  EXPECT_EQ(tssa(at::zeros({0, 5, 4}), temp).sizes(), (std::vector<int64_t>{0, 5, 4}));
  EXPECT_EQ(tssa(at::zeros({2, 0, 4}), temp).sizes(), (std::vector<int64_t>{2, 0, 4}));
  const at::Tensor state = at::rand({2, StateWidth(4, 2)});
  auto [y, st] = tssa_causal(at::zeros({2, 0, 4}), temp, delta, state, at::tensor({1L, 2L}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 0, 4}));
  EXPECT_TRUE(at::equal(st, state));
  EXPECT_FALSE(st.is_same(state));  // a new tensor, as the reference returns
  at::Tensor no_state = at::zeros({0, StateWidth(4, 2)});
  EXPECT_EQ(tssa_step(at::zeros({0, 4}), temp, delta, at::zeros({0}, at::kLong), no_state).sizes(),
            (std::vector<int64_t>{0, 4}));
  // D = 0: no channel, yet Π (uniform) still counts into S3, as in the reference.
  auto [y0, st0] = tssa_causal(at::zeros({1, 3, 0}), temp, delta, std::nullopt, std::nullopt);
  auto [y0_ref, st0_ref] =
      reference::tssa_causal(at::zeros({1, 3, 0}), temp, delta, std::nullopt, std::nullopt);
  EXPECT_TRUE(at::allclose(st0, st0_ref));
}

template <typename F>
void ExpectError(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing \"" << needle << "\"";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TssaCpuOps, ArgumentErrorsNameTheArgument) {
  const at::Tensor temp = at::ones({2});
  const at::Tensor delta = at::zeros({2, 16});
  at::Tensor state = at::zeros({1, StateWidth(10, 2)});
  ExpectError([&] { tssa(at::zeros({4, 10}), temp); }, "tssa: w must be [B,N,D]");
  ExpectError(
      [&] {
        tssa(at::zeros({1, 4, 10}), at::ones({3}));
      },
      "divisible by the number of heads K=3");
  ExpectError([&] { tssa(at::zeros({1, 4, 10}, at::kInt), temp); }, "w must be floating point");
  ExpectError(
      [&] {
        tssa_causal(at::zeros({1, 4, 10}), temp, at::zeros({3, 16}), std::nullopt, std::nullopt);
      },
      "denom_bias must be [K=2, Tmax]");
  ExpectError(
      [&] {
        tssa_causal(at::zeros({1, 4, 10}), temp, delta, at::zeros({1, 7}), std::nullopt);
      },
      "state must be [B=1, 2D+K=22]");
  ExpectError(
      [&] {
        tssa_causal(at::zeros({1, 4, 10}), temp, delta, at::zeros({1, 22}, at::kDouble),
                    std::nullopt);
      },
      "state must be float32");
  ExpectError(
      [&] {
        tssa_causal(at::zeros({1, 4, 10}), temp, delta, std::nullopt, at::tensor({13L}));
      },
      "exceeds the context length Tmax=16");
  ExpectError(
      [&] {
        tssa_causal(at::zeros({1, 4, 10}), temp, delta, std::nullopt, at::tensor({-1L}));
      },
      "positions must be >= 0");
  ExpectError(
      [&] {
        tssa_step(at::zeros({1, 10}), temp, delta, at::zeros({1}, at::kInt), state);
      },
      "positions must be int64");
  ExpectError(
      [&] {
        tssa_step(at::zeros({2, 10}), temp, delta, at::zeros({2}, at::kLong), state);
      },
      "state must be [B=2, 2D+K=22]");
  // A failed step leaves the state untouched.
  EXPECT_TRUE(at::equal(state, at::zeros({1, StateWidth(10, 2)})));
}

TEST(TssaCpuOps, ParallelTasksRunEveryTaskExactlyOnceAndShareTheWork) {
  // Thread 0 stalls on every task it takes, so the other threads steal from its share.
  for (const bool reverse : {false, true}) {
    for (const int64_t tasks : {1, 2, 3, 64, 1000}) {
      std::vector<std::atomic<int>> runs(tasks);
      std::atomic<int64_t> by_others{0};
      cpu::ParallelTasks(tasks, reverse, [&](int64_t t) {
        if (at::get_thread_num() == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        } else {
          by_others.fetch_add(1);
        }
        runs[t].fetch_add(1);
      });
      for (int64_t t = 0; t < tasks; ++t)
        ASSERT_EQ(runs[t].load(), 1) << "task " << t << " of " << tasks;
      // With several threads the others run more than their static share (they steal).
      if (at::get_num_threads() > 1 && tasks >= 64) {
        EXPECT_GT(by_others.load(), tasks - tasks / at::get_num_threads()) << tasks << " tasks";
      }
    }
  }
}

TEST(TssaCpuOps, ActiveIsaFollowsLibTorch) {
  const auto& isas = cpu::AvailableCpuIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), CpuIsa::kDefault);
  // LibTorch's choice (ATEN_CPU_CAPABILITY honoured) when this build has it, else the best below.
  const std::string torch_choice = at::get_cpu_capability();
  const CpuIsa active = cpu::ActiveCpuIsa();
  if (std::find(isas.begin(), isas.end(), active) == isas.end())
    ADD_FAILURE() << "active ISA not available";
  if (torch_choice == "AVX512" || torch_choice == "AVX2" || torch_choice == "DEFAULT") {
    EXPECT_EQ(cpu::CpuIsaName(active), torch_choice);
  }
}

// tost::tssa_step on the CPU with row_ids: a pool in host memory, the named rows stepped and
// written back, the others untouched; bad row_ids refused naming the problem.
TEST(TssaCpuOps, StepWithRowIdsUpdatesOnlyTheNamedRowsOfThePool) {
  at::manual_seed(151);
  const int64_t B = 2, P = 5, D = 24, K = 4, tmax = 16;
  const at::Tensor w = at::randn({B, D});
  const at::Tensor temp = at::rand({K}) + 0.5;
  const at::Tensor db = 0.1 * at::randn({K, tmax});
  const at::Tensor positions = at::tensor(std::vector<int64_t>{3, 9});
  const at::Tensor row_ids = at::tensor(std::vector<int64_t>{4, 1});
  const at::Tensor before = at::rand({P, StateWidth(D, K)}) * 5 + 0.5;
  at::Tensor pool = before.clone();
  at::Tensor pool_ref = before.clone();
  const at::Tensor y = tssa_step(w, temp, db, positions, pool, row_ids);
  const at::Tensor y_ref = reference::tssa_step(w, temp, db, positions, pool_ref, row_ids);
  EXPECT_TRUE(at::allclose(y, y_ref, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(pool, pool_ref, 1e-5, 1e-6));
  for (const int64_t untouched : {0, 2, 3})
    EXPECT_TRUE(at::equal(pool[untouched], before[untouched]));
  EXPECT_FALSE(at::equal(pool[4], before[4]));
  try {
    tssa_step(w, temp, db, positions, pool, at::tensor(std::vector<int64_t>{1, 1}));
    ADD_FAILURE() << "a repeated row id was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 is named twice"), std::string::npos) << e.what();
  }
  try {
    tssa_step(w, temp, db, positions, pool, at::tensor(std::vector<int64_t>{0, 5}));
    ADD_FAILURE() << "a row id outside the pool was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 5 is outside the state pool's rows [0, 5)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tost::kernels
