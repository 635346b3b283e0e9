// The CUDA TSSA kernels (kernels/cuda/) against the ATen reference on the CPU
// (kernels/reference.cc), which is the ground truth. Each test feeds the same inputs to both: the
// kernels are reached through kernel_device.h (the `tost::` operators on a GPU, or the emulator's
// test operators running the same kernel sources on the CPU), the reference is called directly on
// CPU copies. Without a CUDA device the GPU binary skips every test; the emulated binary runs them
// at smaller sizes (the emulator checks every access, see tests/kernels/emulator/emulator.h).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/reference.h"
#include "kernels/tssa_ops.h"
#include "tests/kernels/gpu/kernel_device.h"

namespace tost::kernels {
namespace {

using testing::DeviceAvailable;
using testing::OnDevice;
using testing::Tssa;
using testing::TssaCausal;
using testing::TssaStep;

#define TOST_REQUIRE_DEVICE()                                                            \
  do {                                                                                   \
    if (!DeviceAvailable()) GTEST_SKIP() << "no " << testing::DeviceName() << " device"; \
  } while (0)

#ifdef TOST_KERNEL_TESTS_EMULATED
// Every access of the emulated kernels is checked: sizes that keep the label at a few minutes on
// two cores while still taking every code path.
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// ---------------------------------------------------------------------------------------------
// Helpers.

struct Tol {
  double rtol;
  double atol;
};

// y is rounded to w's dtype by both sides from float32 values that differ only in summation
// order, so half types may differ by one unit in the last place.
Tol YTol(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return {4e-3, 1e-5};
    case at::kBFloat16:
      return {2e-2, 1e-4};
    case at::kDouble:
      return {1e-10, 1e-12};
    default:
      return {1e-4, 1e-6};
  }
}
constexpr Tol kStateTol{1e-4, 1e-5};  // the state is float32 at every input precision

void ExpectClose(const at::Tensor& got, const at::Tensor& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  if (want.numel() == 0) return;
  const at::Tensor g = got.detach().to(at::kCPU).to(at::kDouble);
  const at::Tensor w = want.detach().to(at::kCPU).to(at::kDouble);
  const at::Tensor diff = (g - w).abs();
  const at::Tensor bad = (diff > tol.atol + tol.rtol * w.abs()) | (g.isnan() != w.isnan());
  const int64_t n_bad = bad.sum().item<int64_t>();
  EXPECT_EQ(n_bad, 0) << what << ": " << n_bad << " of " << g.numel()
                      << " elements outside rtol=" << tol.rtol << " atol=" << tol.atol
                      << "; max |diff| = " << at::nan_to_num(diff).max().item<double>();
}

at::Tensor Cuda(const at::Tensor& t) { return testing::ToDevice(t); }

// The same strided view of a CPU tensor and of its device copy. (Copying a strided CPU view to the
// device would give a contiguous, aligned tensor: views have to be taken on the device.)
struct Pair {
  at::Tensor cpu;
  at::Tensor cuda;
};

template <typename View>
Pair Strided(const at::Tensor& base, View view) {
  return {view(base), view(Cuda(base))};
}

struct Inputs {
  at::Tensor w;           // CPU, in the test dtype
  at::Tensor temp;        // [K] float32
  at::Tensor denom_bias;  // [K, Tmax] float32
};

// w ~ N(0,1); temp ~ U(0.5, 1.5) (learned temperatures stay near their init of 1); δ ~ 0.1·N(0,1).
Inputs MakeInputs(std::vector<int64_t> w_sizes, int64_t heads, int64_t tmax, at::ScalarType dtype,
                  uint64_t seed) {
  at::manual_seed(seed);
  Inputs in;
  in.w = at::randn(w_sizes).to(dtype);
  in.temp = at::rand({heads}) + 0.5;
  in.denom_bias = 0.1 * at::randn({heads, tmax});
  return in;
}

// A plausible running state after some tokens: S1 > 0, 0 ≤ S2, S3 > 0.
at::Tensor MakeState(int64_t batch, int64_t channels, int64_t heads, uint64_t seed) {
  at::manual_seed(seed);
  const at::Tensor s1 = at::rand({batch, channels}) * 20 + 0.5;
  const at::Tensor s2 = at::rand({batch, channels}) * 5;
  const at::Tensor s3 = at::rand({batch, heads}) * 4 + 0.5;
  return at::cat({s1, s2, s3}, 1);
}

std::string DTypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "f32";
    case at::kHalf:
      return "f16";
    case at::kBFloat16:
      return "bf16";
    default:
      return "other";
  }
}

struct Shape {
  int64_t batch;
  int64_t tokens;
  int64_t channels;
  int64_t heads;
};

std::string ShapeName(const Shape& s) {
  std::ostringstream os;
  os << "B" << s.batch << "_T" << s.tokens << "_D" << s.channels << "_K" << s.heads;
  return os.str();
}

using Param = std::tuple<Shape, at::ScalarType>;

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return ShapeName(std::get<0>(info.param)) + "_" + DTypeName(std::get<1>(info.param));
}

const auto kDTypes = ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf);

// Odd head widths (p = 5), the registered model sizes (p = 48, 64), one token, long sequences,
// and widths that take every per-thread channel count of the kernels (D up to 8192).
// Emulated: the same paths at fewer tokens, plus odd D and K (p = 5, scalar loads) and a width for
// every per-thread channel count of the row kernels (1, 2, 4, 8, 16, 32).
// Also K = 1, K = 1024 (p = 1) and D = 1280 with K = 20.
// The stats kernel's tiles of w² in shared memory: one tile per chunk, several tiles with one row
// group (D 1280, D 8192 at one row a tile) and with two (D 392 and 384 at 16-token chunks: 8 rows
// a tile in float32), and one-token chunks (a row of D 8192 fits beside K 1024's Π only so).
std::vector<Shape> VisionShapes() {
  if (kEmulated) {
    return {{2, 7, 20, 4},     {1, 1, 20, 4},      {3, 70, 40, 8},    {2, 20, 15, 3},
            {1, 5, 768, 12},   {1, 2, 2304, 36},   {1, 2, 8192, 128}, {4, 9, 12, 12},
            {2, 9, 16, 1},     {1, 3, 1024, 1024}, {1, 5, 1280, 20},  {1, 520, 392, 8},
            {1, 9, 8192, 1024}};
  }
  return {{2, 7, 20, 4},       {1, 1, 20, 4},      {3, 1000, 384, 8}, {2, 197, 768, 12},
          {1, 33, 2304, 36},   {2, 9, 8192, 128},  {4, 50, 12, 12},   {2, 300, 16, 1},
          {1, 40, 1024, 1024}, {2, 150, 1280, 20}, {1, 9, 8192, 1024}};
}
std::vector<Shape> CausalShapes() {
  if (kEmulated) {
    return {{2, 7, 20, 4},     {3, 1, 20, 4},   {1, 70, 40, 8},   {2, 13, 15, 3},
            {1, 5, 384, 8},    {1, 9, 768, 12}, {1, 3, 1536, 12}, {1, 3, 2304, 36},
            {1, 2, 8192, 128}, {3, 10, 12, 12}, {2, 9, 16, 1},    {1, 3, 1024, 1024},
            {1, 5, 1280, 20}};
  }
  return {{2, 7, 20, 4},       {3, 1, 20, 4},     {1, 1000, 384, 8}, {2, 130, 768, 12},
          {1, 70, 2304, 36},   {2, 9, 8192, 128}, {3, 40, 12, 12},   {2, 300, 16, 1},
          {1, 40, 1024, 1024}, {2, 150, 1280, 20}};
}
const auto kVisionShapes = ::testing::ValuesIn(VisionShapes());
const auto kCausalShapes = ::testing::ValuesIn(CausalShapes());

// ---------------------------------------------------------------------------------------------
// tssa (vision).

class TssaCudaTest : public ::testing::TestWithParam<Param> {};

TEST_P(TssaCudaTest, MatchesReference) {
  TOST_REQUIRE_DEVICE();
  const auto [s, dtype] = GetParam();
  const Inputs in = MakeInputs({s.batch, s.tokens, s.channels}, s.heads, 1, dtype, 1);
  const at::Tensor want = reference::tssa(in.w, in.temp);
  const at::Tensor got = Tssa(Cuda(in.w), Cuda(in.temp));
  EXPECT_TRUE(OnDevice(got));
  ExpectClose(got, want, YTol(dtype), "tssa y");
}

INSTANTIATE_TEST_SUITE_P(Shapes, TssaCudaTest, ::testing::Combine(kVisionShapes, kDTypes),
                         ParamName);

// Transposed, channel-sliced and misaligned (storage offset of one element) w, strided temp.
class TssaCudaLayoutTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(TssaCudaLayoutTest, NonContiguousInputs) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const int64_t B = 2, N = kEmulated ? 17 : 77, D = kEmulated ? 40 : 384, K = 8;
  at::manual_seed(7);
  const Pair temp =
      Strided(at::rand({K, 2}) + 0.5, [](const at::Tensor& t) { return t.select(1, 1); });
  const std::vector<std::pair<std::string, Pair>> variants = {
      {"transposed", Strided(at::randn({B, D, N}).to(dtype),
                             [](const at::Tensor& t) { return t.transpose(1, 2); })},
      {"channel slice", Strided(at::randn({B, N, D + 6}).to(dtype),
                                [&](const at::Tensor& t) { return t.slice(2, 3, 3 + D); })},
      {"misaligned", Strided(at::randn({B * N * D + 1}).to(dtype),
                             [&](const at::Tensor& t) {
                               return t.slice(0, 1).view({B, N, D});
                             })},
  };
  ASSERT_FALSE(temp.cuda.is_contiguous());
  for (const auto& [name, w] : variants) {
    ASSERT_TRUE(!w.cuda.is_contiguous() || w.cuda.storage_offset() == 1) << name;
    const at::Tensor want = reference::tssa(w.cpu, temp.cpu);
    const at::Tensor got = Tssa(w.cuda, temp.cuda);
    ExpectClose(got, want, YTol(dtype), "tssa y, " + name + " w");
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, TssaCudaLayoutTest, kDTypes,
                         [](const auto& info) { return DTypeName(info.param); });

TEST(TssaCudaMisc, Deterministic) {
  TOST_REQUIRE_DEVICE();
  const Inputs in = kEmulated ? MakeInputs({2, 60, 40}, 8, 1, at::kFloat, 3)
                              : MakeInputs({4, 500, 384}, 8, 1, at::kFloat, 3);
  const at::Tensor w = Cuda(in.w), temp = Cuda(in.temp);
  EXPECT_TRUE(at::equal(Tssa(w, temp), Tssa(w, temp)));
}

TEST(TssaCudaMisc, Float64RunsTheReferenceOnTheDevice) {
  TOST_REQUIRE_DEVICE();
  const Inputs in = MakeInputs({2, 31, 20}, 4, 40, at::kDouble, 4);
  ExpectClose(Tssa(Cuda(in.w), Cuda(in.temp)), reference::tssa(in.w, in.temp), YTol(at::kDouble),
              "tssa f64");
  const auto [y, st] =
      TssaCausal(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), std::nullopt, std::nullopt);
  const auto [y_ref, st_ref] =
      reference::tssa_causal(in.w, in.temp, in.denom_bias, std::nullopt, std::nullopt);
  ExpectClose(y, y_ref, YTol(at::kDouble), "tssa_causal f64 y");
  ExpectClose(st, st_ref, kStateTol, "tssa_causal f64 state");
}

TEST(TssaCudaMisc, EmptyInputs) {
  TOST_REQUIRE_DEVICE();
  const at::Tensor temp = Cuda(at::ones({4}));
  EXPECT_EQ(Tssa(Cuda(at::zeros({2, 0, 20})), temp).sizes(), at::IntArrayRef({2, 0, 20}));
  EXPECT_EQ(Tssa(Cuda(at::zeros({0, 5, 20})), temp).sizes(), at::IntArrayRef({0, 5, 20}));
}

// ---------------------------------------------------------------------------------------------
// tssa_causal (prefill).

class TssaCausalCudaTest : public ::testing::TestWithParam<Param> {};

TEST_P(TssaCausalCudaTest, FromEmptyStateMatchesReference) {
  TOST_REQUIRE_DEVICE();
  const auto [s, dtype] = GetParam();
  const Inputs in = MakeInputs({s.batch, s.tokens, s.channels}, s.heads, s.tokens + 3, dtype, 11);
  const auto [y_ref, st_ref] =
      reference::tssa_causal(in.w, in.temp, in.denom_bias, std::nullopt, std::nullopt);
  const auto [y, st] =
      TssaCausal(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), std::nullopt, std::nullopt);
  ExpectClose(y, y_ref, YTol(dtype), "tssa_causal y");
  ExpectClose(st, st_ref, kStateTol, "tssa_causal state");
}

TEST_P(TssaCausalCudaTest, ContinuesFromStateAtPositions) {
  TOST_REQUIRE_DEVICE();
  const auto [s, dtype] = GetParam();
  const int64_t tmax = s.tokens + 40;
  const Inputs in = MakeInputs({s.batch, s.tokens, s.channels}, s.heads, tmax, dtype, 12);
  const at::Tensor state = MakeState(s.batch, s.channels, s.heads, 13);
  const at::Tensor positions = at::arange(s.batch, at::kLong) * 13 % 41;  // distinct starts, ≤ 40
  const auto [y_ref, st_ref] =
      reference::tssa_causal(in.w, in.temp, in.denom_bias, state, positions);
  const auto [y, st] =
      TssaCausal(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(state), Cuda(positions));
  ExpectClose(y, y_ref, YTol(dtype), "tssa_causal y");
  ExpectClose(st, st_ref, kStateTol, "tssa_causal state");
}

INSTANTIATE_TEST_SUITE_P(Shapes, TssaCausalCudaTest, ::testing::Combine(kCausalShapes, kDTypes),
                         ParamName);

class TssaCausalCudaDTypeTest : public ::testing::TestWithParam<at::ScalarType> {};

// Prefill in two calls, the state and positions carried from the first to the second, equals one
// call over the whole sequence (and the reference).
TEST_P(TssaCausalCudaDTypeTest, ChunkedEqualsWhole) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const int64_t B = 2, T = kEmulated ? 100 : 1000, D = kEmulated ? 40 : 384, K = 8,
                split = kEmulated ? 37 : 377;
  const Inputs in = MakeInputs({B, T, D}, K, T + 8, dtype, 21);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{0, 5});
  const at::Tensor w = Cuda(in.w), temp = Cuda(in.temp), db = Cuda(in.denom_bias),
                   pos = Cuda(positions);

  const auto [y_whole, st_whole] = TssaCausal(w, temp, db, std::nullopt, pos);
  const auto [y1, st1] = TssaCausal(w.slice(1, 0, split), temp, db, std::nullopt, pos);
  const auto [y2, st2] = TssaCausal(w.slice(1, split), temp, db, st1, pos + split);
  ExpectClose(at::cat({y1, y2}, 1), y_whole, YTol(dtype), "chunked y vs whole y");
  ExpectClose(st2, st_whole, kStateTol, "chunked state vs whole state");

  const auto [y_ref, st_ref] =
      reference::tssa_causal(in.w, in.temp, in.denom_bias, std::nullopt, positions);
  ExpectClose(y_whole, y_ref, YTol(dtype), "whole y vs reference");
  ExpectClose(st_whole, st_ref, kStateTol, "whole state vs reference");
}

// Strided w, temp, denom_bias and state; positions on the host.
TEST_P(TssaCausalCudaDTypeTest, NonContiguousInputs) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const int64_t B = 3, T = kEmulated ? 12 : 45, D = kEmulated ? 48 : 768, K = 12, tmax = 64;
  at::manual_seed(31);
  const Pair w = Strided(at::randn({B, D, T}).to(dtype),
                         [](const at::Tensor& t) { return t.transpose(1, 2); });
  const Pair temp =
      Strided(at::rand({K, 3}) + 0.5, [](const at::Tensor& t) { return t.select(1, 2); });
  const Pair denom_bias =
      Strided(0.1 * at::randn({tmax, K}), [](const at::Tensor& t) { return t.t(); });
  const Pair state =
      Strided(MakeState(B, D, K, 32).t().contiguous(), [](const at::Tensor& t) { return t.t(); });
  ASSERT_FALSE(w.cuda.is_contiguous() || temp.cuda.is_contiguous() ||
               denom_bias.cuda.is_contiguous() || state.cuda.is_contiguous());
  ASSERT_EQ(state.cuda.sizes(), at::IntArrayRef({B, StateWidth(D, K)}));
  const at::Tensor positions = at::tensor(std::vector<int64_t>{3, 0, 19});

  const auto [y_ref, st_ref] =
      reference::tssa_causal(w.cpu, temp.cpu, denom_bias.cpu, state.cpu, positions);
  const auto [y, st] = TssaCausal(w.cuda, temp.cuda, denom_bias.cuda, state.cuda, positions);
  ExpectClose(y, y_ref, YTol(dtype), "tssa_causal y, strided inputs");
  ExpectClose(st, st_ref, kStateTol, "tssa_causal state, strided inputs");

  const Pair w_mis = Strided(at::randn({B * T * D + 1}).to(dtype), [&](const at::Tensor& t) {
    return t.slice(0, 1).view({B, T, D});
  });
  ASSERT_EQ(w_mis.cuda.storage_offset(), 1);
  const auto [y2_ref, st2_ref] =
      reference::tssa_causal(w_mis.cpu, temp.cpu, denom_bias.cpu, std::nullopt, std::nullopt);
  const auto [y2, st2] =
      TssaCausal(w_mis.cuda, temp.cuda, denom_bias.cuda, std::nullopt, std::nullopt);
  ExpectClose(y2, y2_ref, YTol(dtype), "tssa_causal y, misaligned w");
  ExpectClose(st2, st2_ref, kStateTol, "tssa_causal state, misaligned w");
}

// ---------------------------------------------------------------------------------------------
// tssa_step (decode).

// T single steps from a given state equal one tssa_causal call over the T tokens (CUDA and
// reference), for y and for the final state.
TEST_P(TssaCausalCudaDTypeTest, RepeatedStepEqualsCausal) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const std::vector<Shape> shapes =
      kEmulated ? std::vector<Shape>{Shape{3, 7, 20, 4}, Shape{2, 6, 40, 8}, Shape{1, 3, 2304, 36}}
                : std::vector<Shape>{Shape{3, 7, 20, 4}, Shape{2, 20, 384, 8},
                                     Shape{2, 6, 2304, 36}, Shape{1, 3, 8192, 128}};
  for (const Shape& s : shapes) {
    const int64_t tmax = s.tokens + 16;
    const Inputs in = MakeInputs({s.batch, s.tokens, s.channels}, s.heads, tmax, dtype, 41);
    const at::Tensor state0 = MakeState(s.batch, s.channels, s.heads, 42);
    const at::Tensor positions = at::arange(s.batch, at::kLong) * 5 % 17;
    const at::Tensor w = Cuda(in.w), temp = Cuda(in.temp), db = Cuda(in.denom_bias),
                     pos = Cuda(positions);

    at::Tensor state = Cuda(state0).clone();
    std::vector<at::Tensor> ys;
    for (int64_t t = 0; t < s.tokens; ++t)
      ys.push_back(TssaStep(w.select(1, t), temp, db, pos + t, state));
    const at::Tensor y_steps = at::stack(ys, 1);

    const auto [y_causal, st_causal] = TssaCausal(w, temp, db, Cuda(state0), pos);
    const auto [y_ref, st_ref] =
        reference::tssa_causal(in.w, in.temp, in.denom_bias, state0, positions);
    const std::string name = ShapeName(s);
    ExpectClose(y_steps, y_causal, YTol(dtype), name + ": steps y vs tssa_causal y");
    ExpectClose(state, st_causal, kStateTol, name + ": steps state vs tssa_causal state");
    ExpectClose(y_steps, y_ref, YTol(dtype), name + ": steps y vs reference");
    ExpectClose(state, st_ref, kStateTol, name + ": steps state vs reference");
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, TssaCausalCudaDTypeTest, kDTypes,
                         [](const auto& info) { return DTypeName(info.param); });

TEST(TssaStepCuda, FromZeroStateMatchesReferenceStep) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 4, D = kEmulated ? 96 : 768, K = 12, tmax = 32;
  const Inputs in = MakeInputs({B, D}, K, tmax, at::kFloat, 51);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{0, 1, 30, 31});
  at::Tensor st_ref = at::zeros({B, StateWidth(D, K)});
  at::Tensor st = Cuda(st_ref);
  const at::Tensor y_ref = reference::tssa_step(in.w, in.temp, in.denom_bias, positions, st_ref);
  const at::Tensor y =
      TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions), st);
  ExpectClose(y, y_ref, YTol(at::kFloat), "tssa_step y");
  ExpectClose(st, st_ref, kStateTol, "tssa_step state");
}

// A strided state (a view into a wider cache) is updated in place.
TEST(TssaStepCuda, UpdatesStridedStateInPlace) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 3, D = kEmulated ? 40 : 384, K = 8, tmax = 16;
  const int64_t width = StateWidth(D, K);
  const Inputs in = MakeInputs({B, D}, K, tmax, at::kBFloat16, 61);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{2, 9, 15});
  at::Tensor cache_ref = at::cat({at::zeros({B, 5}), MakeState(B, D, K, 62), at::zeros({B, 7})}, 1);
  at::Tensor cache = Cuda(cache_ref);
  at::Tensor st_ref = cache_ref.slice(1, 5, 5 + width);
  at::Tensor st = cache.slice(1, 5, 5 + width);
  ASSERT_FALSE(st.is_contiguous());
  const at::Tensor y_ref = reference::tssa_step(in.w, in.temp, in.denom_bias, positions, st_ref);
  const at::Tensor y =
      TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions), st);
  ExpectClose(y, y_ref, YTol(at::kBFloat16), "tssa_step y");
  ExpectClose(cache, cache_ref, kStateTol, "state cache after tssa_step");
}

// With row_ids, the state is a pool: the row at row_ids[b] is sequence b's, read and updated in
// place, and every other row is left exactly as it was (what a device-resident state pool relies
// on).
TEST(TssaStepCuda, RowIdsIndexAPoolInPlace) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 3, P = 7, D = kEmulated ? 40 : 384, K = 8, tmax = 32;
  const Inputs in = MakeInputs({B, D}, K, tmax, at::kFloat, 141);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{4, 0, 17});
  const at::Tensor row_ids = at::tensor(std::vector<int64_t>{5, 0, 3});
  at::Tensor pool_ref = MakeState(P, D, K, 142);
  at::Tensor pool = Cuda(pool_ref);
  const at::Tensor before = pool_ref.clone();
  const at::Tensor y_ref =
      reference::tssa_step(in.w, in.temp, in.denom_bias, positions, pool_ref, row_ids);
  const at::Tensor y = TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions),
                                pool, Cuda(row_ids));
  ExpectClose(y, y_ref, YTol(at::kFloat), "tssa_step y with row_ids");
  ExpectClose(pool, pool_ref, kStateTol, "state pool with row_ids");
  // The reference with row_ids equals stepping the gathered rows without them.
  at::Tensor rows = before.index_select(0, row_ids);
  const at::Tensor y_rows = reference::tssa_step(in.w, in.temp, in.denom_bias, positions, rows);
  EXPECT_TRUE(at::equal(y_rows, y_ref));
  EXPECT_TRUE(at::equal(rows, pool_ref.index_select(0, row_ids)));
  for (const int64_t untouched : {1, 2, 4, 6}) {
    EXPECT_TRUE(at::equal(pool.to(at::kCPU)[untouched], before[untouched])) << "row " << untouched;
  }
  // Host row_ids are checked: a repeated or out-of-range row id is refused before any work.
  EXPECT_THROW(TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions), pool,
                        at::tensor(std::vector<int64_t>{5, 0, 5})),
               c10::Error);
  EXPECT_THROW(TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions), pool,
                        at::tensor(std::vector<int64_t>{5, 0, 7})),
               c10::Error);
}

// ---------------------------------------------------------------------------------------------
// Edge cases and argument errors.

TEST(TssaCausalCudaMisc, NoTokensReturnsACopyOfTheState) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 2, D = 20, K = 4;
  const at::Tensor state = Cuda(MakeState(B, D, K, 71));
  const auto [y, st] = TssaCausal(Cuda(at::zeros({B, 0, D})), Cuda(at::ones({K})),
                                  Cuda(at::zeros({K, 8})), state, Cuda(at::zeros({B}, at::kLong)));
  EXPECT_EQ(y.sizes(), at::IntArrayRef({B, 0, D}));
  EXPECT_TRUE(at::equal(st, state));
  EXPECT_FALSE(st.is_same(state));
  const auto [y0, st0] = TssaCausal(Cuda(at::zeros({B, 0, D})), Cuda(at::ones({K})),
                                    Cuda(at::zeros({K, 8})), std::nullopt, std::nullopt);
  EXPECT_TRUE(at::equal(st0, at::zeros({B, StateWidth(D, K)}, st0.options())));
}

TEST(TssaCausalCudaMisc, RejectsBadArgumentsLikeTheReference) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 2, T = 5, D = 20, K = 4;
  const at::Tensor w = Cuda(at::randn({B, T, D}));
  const at::Tensor temp = Cuda(at::ones({K}));
  const at::Tensor db = Cuda(at::zeros({K, 8}));
  const at::Tensor bad_state = Cuda(at::zeros({B, 2 * D}));
  EXPECT_THROW(TssaCausal(w, temp, db, bad_state, std::nullopt), c10::Error);
  // Positions on the host are range-checked there, wherever w is.
  EXPECT_THROW(TssaCausal(w, temp, db, std::nullopt, at::full({B}, 4, at::kLong)), c10::Error);
  EXPECT_THROW(Tssa(w, Cuda(at::ones({3}))), c10::Error);
  at::Tensor st = Cuda(at::zeros({B, StateWidth(D, K)}));
  EXPECT_THROW(TssaStep(w.select(1, 0), temp, db, at::full({B}, 8, at::kLong), st), c10::Error);
  // Positions already on the device are not read back (that would synchronise every call): a
  // sequence outside denom_bias comes out NaN instead, and nothing outside it is read
  // (compute-sanitizer memcheck runs this case).
  if (!Cuda(at::zeros({1})).device().is_cpu()) {
    const auto [y_out, st_out] =
        TssaCausal(w, temp, db, std::nullopt, Cuda(at::tensor(std::vector<int64_t>{0, 4})));
    EXPECT_FALSE(y_out.select(0, 0).isnan().any().item<bool>());
    EXPECT_TRUE(y_out.select(0, 1).isnan().all().item<bool>());
    at::Tensor st2 = Cuda(at::zeros({B, StateWidth(D, K)}));
    const at::Tensor y_step =
        TssaStep(w.select(1, 0), temp, db, Cuda(at::tensor(std::vector<int64_t>{7, 8})), st2);
    EXPECT_FALSE(y_step.select(0, 0).isnan().any().item<bool>());
    EXPECT_TRUE(y_step.select(0, 1).isnan().all().item<bool>());
  }
  try {
    TssaCausal(w, temp, db, bad_state, std::nullopt);
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("state must be [B=2, 2D+K=44]"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Against a float64 reference, at ordinary and at high temperatures.

// One unit in the last place of `dtype` at each element of `rounded` (values of that dtype).
at::Tensor Ulp(const at::Tensor& rounded, at::ScalarType dtype) {
  const int mantissa_bits = dtype == at::kBFloat16 ? 7 : 10;
  const double min_normal = dtype == at::kBFloat16 ? 1.1754943508222875e-38 : 6.103515625e-05;
  const at::Tensor magnitude = rounded.abs().clamp_min(min_normal);
  return at::pow(2.0, at::floor(at::log2(magnitude)) - mantissa_bits);
}

// float32 within `rtol` of the float64 result; bfloat16/float16 within one unit in the last place
// of the float64 result rounded to the dtype.
void ExpectNearFloat64(const at::Tensor& got, const at::Tensor& want64, at::ScalarType dtype,
                       double rtol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want64.sizes()) << what;
  const at::Tensor g = got.detach().to(at::kCPU).to(at::kDouble);
  at::Tensor target = want64;
  at::Tensor bound;
  if (dtype == at::kFloat) {
    bound = rtol * want64.abs() + 1e-12;
  } else {
    target = want64.to(dtype).to(at::kDouble);
    bound = Ulp(target, dtype);
  }
  const at::Tensor excess = (g - target).abs() - bound;
  const int64_t n_bad = (excess > 0).sum().item<int64_t>() + g.isnan().sum().item<int64_t>();
  EXPECT_EQ(n_bad, 0) << what << ": " << n_bad << " of " << g.numel()
                      << " elements outside the bound; worst excess "
                      << at::nan_to_num(excess).max().item<double>();
}

using Float64Param = std::tuple<at::ScalarType, bool>;  // dtype, temperatures of 20–50

class TssaFloat64ReferenceTest : public ::testing::TestWithParam<Float64Param> {};

TEST_P(TssaFloat64ReferenceTest, VisionAndCausalWithinTolerance) {
  TOST_REQUIRE_DEVICE();
  const auto [dtype, hot] = GetParam();
  const Shape s = kEmulated ? Shape{2, 50, 40, 8} : Shape{4, 300, 384, 8};
  // denom_bias covers every sequence's positions: sequence b starts at 3·b (below).
  Inputs in =
      MakeInputs({s.batch, s.tokens, s.channels}, s.heads, s.tokens + 3 * s.batch, dtype, 81);
  if (hot) in.temp = at::rand({s.heads}) * 30 + 20;  // Π far from uniform
  // Statistics are float32 at every precision: 1e-5 relative, 5e-5 at high temperatures.
  const double rtol = hot ? 5e-5 : 1e-5;
  const at::Tensor w64 = in.w.to(at::kDouble);
  const at::Tensor temp64 = in.temp.to(at::kDouble);
  const at::Tensor db64 = in.denom_bias.to(at::kDouble);

  ExpectNearFloat64(Tssa(Cuda(in.w), Cuda(in.temp)), reference::tssa(w64, temp64), dtype, rtol,
                    "tssa y");
  const at::Tensor state0 = MakeState(s.batch, s.channels, s.heads, 82);
  const at::Tensor positions = at::arange(s.batch, at::kLong) * 3;
  const auto [y, st] =
      TssaCausal(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(state0), Cuda(positions));
  const auto [y64, st64] = reference::tssa_causal(w64, temp64, db64, state0, positions);
  ExpectNearFloat64(y, y64, dtype, rtol, "tssa_causal y");
  ExpectNearFloat64(st, st64, at::kFloat, rtol, "tssa_causal state");
}

INSTANTIATE_TEST_SUITE_P(DTypes, TssaFloat64ReferenceTest,
                         ::testing::Combine(kDTypes, ::testing::Bool()), [](const auto& info) {
                           return DTypeName(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_hot" : "_normal");
                         });

TEST(TssaStepCuda, Float64RunsTheReference) {
  TOST_REQUIRE_DEVICE();
  const int64_t B = 3, D = 40, K = 8, tmax = 16;
  const Inputs in = MakeInputs({B, D}, K, tmax, at::kDouble, 91);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{0, 7, 15});
  at::Tensor st_ref = MakeState(B, D, K, 92);
  at::Tensor st = Cuda(st_ref);
  const at::Tensor y_ref = reference::tssa_step(in.w, in.temp, in.denom_bias, positions, st_ref);
  const at::Tensor y =
      TssaStep(Cuda(in.w), Cuda(in.temp), Cuda(in.denom_bias), Cuda(positions), st);
  ExpectClose(y, y_ref, YTol(at::kDouble), "tssa_step f64 y");
  ExpectClose(st, st_ref, kStateTol, "tssa_step f64 state");
}

// ---------------------------------------------------------------------------------------------
// Batch invariance: a sequence's result does not depend on what it is batched with (the chunking
// and the order of every sum depend on its length only), bit for bit.

class TssaBatchInvarianceTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(TssaBatchInvarianceTest, VisionAtBatch64EqualsEachImageAlone) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const Inputs in = MakeInputs({64, 196, kEmulated ? 40 : 384}, 8, 1, dtype, 101);
  const at::Tensor w = Cuda(in.w), temp = Cuda(in.temp);
  const at::Tensor y = Tssa(w, temp);
  std::vector<int64_t> images = {0, 17, 63};
  if (!kEmulated) {
    images.resize(64);
    for (int64_t b = 0; b < 64; ++b) images[static_cast<size_t>(b)] = b;
  }
  for (const int64_t b : images) {
    EXPECT_TRUE(at::equal(y.slice(0, b, b + 1), Tssa(w.slice(0, b, b + 1), temp))) << "image " << b;
  }
}

TEST_P(TssaBatchInvarianceTest, CausalAtBatch32EqualsEachSequenceAlone) {
  TOST_REQUIRE_DEVICE();
  const at::ScalarType dtype = GetParam();
  const int64_t T = kEmulated ? 40 : 300, D = kEmulated ? 40 : 384, K = 8;
  const Inputs in = MakeInputs({32, T, D}, K, T + 40, dtype, 111);
  const at::Tensor state0 = Cuda(MakeState(32, D, K, 112));
  const at::Tensor positions = Cuda(at::arange(32, at::kLong));
  const at::Tensor w = Cuda(in.w), temp = Cuda(in.temp), db = Cuda(in.denom_bias);
  const auto [y, st] = TssaCausal(w, temp, db, state0, positions);
  for (const int64_t b : {int64_t{0}, int64_t{13}, int64_t{31}}) {
    const auto [y1, st1] = TssaCausal(w.slice(0, b, b + 1), temp, db, state0.slice(0, b, b + 1),
                                      positions.slice(0, b, b + 1));
    EXPECT_TRUE(at::equal(y.slice(0, b, b + 1), y1)) << "sequence " << b << " y";
    EXPECT_TRUE(at::equal(st.slice(0, b, b + 1), st1)) << "sequence " << b << " state";
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, TssaBatchInvarianceTest,
                         ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return DTypeName(info.param); });

// Offsets past 2^31 elements: the second sequence of w starts beyond int32 range; its result equals
// the same sequence computed alone (offsets within int32), bit for bit.
TEST(TssaCudaMisc, Int64Offsets) {
  TOST_REQUIRE_DEVICE();
  if (kEmulated) GTEST_SKIP() << "needs 2^31 elements (4 GiB in bfloat16): GPU only";
  const int64_t N = int64_t{1} << 23, D = 128, K = 2;
  at::manual_seed(121);
  const at::Tensor w = Cuda(at::randn({2, N, D}).to(at::kBFloat16));
  const at::Tensor temp = Cuda(at::rand({K}) + 0.5);
  ASSERT_GE(w.numel(), int64_t{1} << 31);
  const at::Tensor y = Tssa(w, temp);
  EXPECT_TRUE(at::equal(y.slice(0, 1, 2), Tssa(w.slice(0, 1, 2), temp)));
}

}  // namespace
}  // namespace tost::kernels
