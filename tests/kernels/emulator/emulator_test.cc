// The emulator is shown to catch defects: faults injected into the real TSSA kernels (a skipped
// barrier, a workspace buffer one element short, a lane dropped from the shuffle masks, a block
// above the launch bound) must each be reported, and small kernels of its own check each rule of
// the checkers and the launch limits directly. Also: the planner's every chunk size runs.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "emulator.h"
#include "kernels/cuda/device_launch.h"
#include "kernels/cuda/token_bitmask_cuda.h"
#include "kernels/cuda/tssa_cuda.h"
#include "kernels/reference.h"
#include "tests/kernels/gpu/kernel_device.h"

namespace tost::kernels {
namespace {

using testing::Tssa;
using testing::TssaCausal;
using testing::TssaStep;

// Restores the emulator's options and clears faults and reports around each test.
class EmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = emu::GetOptions();
    emu::SetFaults({});
    emu::TakeReports();
  }
  void TearDown() override {
    emu::SetFaults({});
    emu::SetOptions(saved_);
    emu::TakeReports();
  }
  emu::Options saved_;
};

struct Case {
  at::Tensor w, temp, denom_bias, state, positions;
};

Case MakeCase(int64_t batch, int64_t tokens, int64_t channels, int64_t heads) {
  at::manual_seed(5);
  Case c;
  c.w = tokens > 0 ? at::randn({batch, tokens, channels}) : at::randn({batch, channels});
  c.temp = at::rand({heads}) + 0.5;
  c.denom_bias = 0.1 * at::randn({heads, std::max<int64_t>(tokens, 1) + 8});
  c.state = at::cat({at::rand({batch, channels}) * 20 + 0.5, at::rand({batch, channels}) * 5,
                     at::rand({batch, heads}) * 4 + 0.5},
                    1);
  c.positions = at::arange(batch, at::kLong);
  return c;
}

enum class Op { kTssa, kCausal, kStep };

// Runs `op` once and returns every report; the launch must fail when something was reported.
std::vector<std::string> RunAndCollect(Op op, const Case& c) {
  bool threw = false;
  try {
    switch (op) {
      case Op::kTssa:
        Tssa(c.w, c.temp);
        break;
      case Op::kCausal:
        TssaCausal(c.w, c.temp, c.denom_bias, c.state, c.positions);
        break;
      case Op::kStep: {
        at::Tensor state = c.state.clone();
        TssaStep(c.w, c.temp, c.denom_bias, c.positions, state);
        break;
      }
    }
  } catch (const c10::Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("emulated kernel launch failed"), std::string::npos)
        << e.what();
  }
  std::vector<std::string> reports = emu::TakeReports();
  EXPECT_EQ(threw, !reports.empty());
  return reports;
}

bool AnyContains(const std::vector<std::string>& reports, const std::string& a,
                 const std::string& b) {
  for (const std::string& r : reports) {
    if (r.find(a) != std::string::npos && r.find(b) != std::string::npos) return true;
  }
  return false;
}

std::string Joined(const std::vector<std::string>& reports) {
  std::string s;
  for (const std::string& r : reports) s += r + "\n";
  return s;
}

// Shapes where every barrier matters: several tiles per chunk (CausalStats rewrites its tiles),
// several warps per block, more heads than one warp reduces at once.
const Case& VisionCase() {
  static const Case c = MakeCase(2, 20, 40, 8);
  return c;
}
const Case& CausalCase() {
  static const Case c = MakeCase(1, 70, 40, 8);  // tile of 16 tokens within chunks of 64
  return c;
}
const Case& StepCase() {
  static const Case c = MakeCase(2, 0, 384, 64);  // more heads than one warp owns
  return c;
}

TEST_F(EmulatorTest, TheRealKernelsRunCleanAndEveryAccessIsTracked) {
  emu::SetOptions({.seed = 3});
  const uint64_t before = emu::GetCounters().tracked_accesses;
  EXPECT_TRUE(RunAndCollect(Op::kTssa, VisionCase()).empty());
  EXPECT_TRUE(RunAndCollect(Op::kCausal, CausalCase()).empty());
  EXPECT_TRUE(RunAndCollect(Op::kStep, StepCase()).empty());
  // w alone is read at least twice per element by each operator.
  const uint64_t elements = 2 * 20 * 40 + 70 * 40 + 2 * 384;
  EXPECT_GT(emu::GetCounters().tracked_accesses - before, 2 * elements);
}

// Every __syncthreads of every kernel is needed: skipping any one of them is reported as a race.
TEST_F(EmulatorTest, SkippingAnyBarrierIsReportedAsARace) {
  struct Barrier {
    const char* kernel;
    int ordinal;
    Op op;
  };
  const std::vector<Barrier> barriers = {
      {"TssaStatsKernel", 1, Op::kTssa},     {"TssaStatsKernel", 2, Op::kTssa},
      {"TssaStatsKernel", 3, Op::kTssa},     {"CausalStatsKernel", 1, Op::kCausal},
      {"CausalStatsKernel", 2, Op::kCausal}, {"StepKernel", 1, Op::kStep},
      {"StepKernel", 2, Op::kStep},          {"StepKernel", 3, Op::kStep},
      {"StepKernel", 4, Op::kStep}};
  emu::SetOptions({.seed = 3});
  for (const Barrier& b : barriers) {
    emu::SetFaults({.skip_barrier_kernel = b.kernel, .skip_barrier_ordinal = b.ordinal});
    const Case& c = b.op == Op::kTssa     ? VisionCase()
                    : b.op == Op::kCausal ? CausalCase()
                                          : StepCase();
    const std::vector<std::string> reports = RunAndCollect(b.op, c);
    EXPECT_TRUE(AnyContains(reports, b.kernel, "race:"))
        << b.kernel << " barrier " << b.ordinal << " skipped; reports:\n"
        << Joined(reports);
  }
  // The list above is complete: there is no further barrier to skip.
  for (const auto& [kernel, op, count] :
       std::vector<std::tuple<const char*, Op, int>>{{"TssaStatsKernel", Op::kTssa, 3},
                                                     {"CausalStatsKernel", Op::kCausal, 2},
                                                     {"StepKernel", Op::kStep, 4}}) {
    emu::SetFaults({.skip_barrier_kernel = kernel, .skip_barrier_ordinal = count + 1});
    const Case& c = op == Op::kTssa ? VisionCase() : op == Op::kCausal ? CausalCase() : StepCase();
    EXPECT_TRUE(RunAndCollect(op, c).empty()) << kernel;
  }
}

TEST_F(EmulatorTest, AWorkspaceBufferOneElementShortIsReportedOutOfBounds) {
  emu::SetOptions({.seed = 3});
  const std::vector<std::pair<std::string, Op>> buffers = {
      {"part", Op::kTssa},    {"vec", Op::kTssa},      {"pi", Op::kTssa},
      {"part1", Op::kCausal}, {"part23", Op::kCausal}, {"pi", Op::kCausal}};
  for (const auto& [name, op] : buffers) {
    emu::SetFaults({.shrink_workspace_buffer = name});
    const std::vector<std::string> reports =
        RunAndCollect(op, op == Op::kTssa ? VisionCase() : CausalCase());
    EXPECT_TRUE(AnyContains(reports, "out of bounds", "AddressSanitizer"))
        << "buffer " << name << " one float short; reports:\n"
        << Joined(reports);
  }
}

TEST_F(EmulatorTest, ALaneDroppedFromTheShuffleMasksIsReported) {
  emu::SetOptions({.seed = 3});
  const std::vector<std::pair<std::string, Op>> kernels = {{"TssaStatsKernel", Op::kTssa},
                                                           {"CausalStatsKernel", Op::kCausal},
                                                           {"StepKernel", Op::kStep}};
  for (const auto& [kernel, op] : kernels) {
    emu::SetFaults({.drop_lane_kernel = kernel, .drop_lane = 7});
    const Case& c = op == Op::kTssa ? VisionCase() : op == Op::kCausal ? CausalCase() : StepCase();
    const std::vector<std::string> reports = RunAndCollect(op, c);
    EXPECT_TRUE(AnyContains(reports, kernel, "does not include it")) << Joined(reports);
    EXPECT_TRUE(AnyContains(reports, kernel, "outside the mask")) << Joined(reports);
  }
}

TEST_F(EmulatorTest, ALaunchAboveTheBlockLimitIsRefused) {
  const Case c = MakeCase(1, 0, 8192, 128);  // the step kernel at its full 256 threads
  emu::SetFaults({.widen_block_kernel = "StepKernel", .widen_block_factor = 2});
  std::vector<std::string> reports = RunAndCollect(Op::kStep, c);
  EXPECT_TRUE(AnyContains(reports, "launch refused", "exceeds the kernel's launch bound of 256"))
      << Joined(reports);
  emu::SetFaults({.widen_block_kernel = "StepKernel", .widen_block_factor = 8});
  reports = RunAndCollect(Op::kStep, c);
  EXPECT_TRUE(AnyContains(reports, "launch refused", "device limit of 1024 threads"))
      << Joined(reports);
}

// Every chunk size the planner can pick (8 to 64 tokens by sequence length, and fewer tokens than
// the minimum) runs and matches the reference; the chunking never depends on the batch.
TEST_F(EmulatorTest, EveryChunkSizeThePlannerPicks) {
  std::set<int64_t> seen;
  for (const int64_t tokens : {5, 100, 600, 1500, 3000}) {
    const gpu::Dims dims{1, tokens, 40, 8};
    const int64_t chunk = gpu::PlanTssaCausal(dims).chunk_tokens;
    EXPECT_EQ(chunk, gpu::PlanTssa(dims).chunk_tokens);
    EXPECT_EQ(chunk, gpu::PlanTssaCausal(gpu::Dims{64, tokens, 40, 8}).chunk_tokens);
    seen.insert(chunk);
    const Case c = MakeCase(1, tokens, 40, 8);
    const at::Tensor y = Tssa(c.w, c.temp);
    EXPECT_TRUE(at::allclose(y, reference::tssa(c.w, c.temp), 1e-4, 1e-6)) << "chunk " << chunk;
    const auto [yc, st] = TssaCausal(c.w, c.temp, c.denom_bias, c.state, c.positions);
    const auto [yr, sr] = reference::tssa_causal(c.w, c.temp, c.denom_bias, c.state, c.positions);
    EXPECT_TRUE(at::allclose(yc, yr, 1e-4, 1e-6)) << "chunk " << chunk;
    EXPECT_TRUE(at::allclose(st, sr, 1e-4, 1e-5)) << "chunk " << chunk;
  }
  EXPECT_EQ(seen, (std::set<int64_t>{5, 8, 16, 32, 64}));
}

// Positions on the device are not checked by the host (that would synchronise): the kernels guard
// them, a sequence out of range gets NaN and nothing is read out of bounds (ASan would report it).
TEST_F(EmulatorTest, DevicePositionsOutOfRangeGiveNaNNotAnOutOfBoundsRead) {
  const int64_t B = 3, D = 40, K = 8, T = 6, tmax = 16;
  const Case c = MakeCase(B, T, D, K);
  const at::Tensor db = 0.1 * at::randn({K, tmax});
  const std::vector<int64_t> positions = {2, tmax, -1};  // in range, past the end, negative
  const gpu::Dims step{B, 1, D, K};
  at::Tensor state = c.state.clone();
  const at::Tensor w_step = c.w.select(1, 0).contiguous();
  at::Tensor y = at::empty_like(w_step);
  ASSERT_EQ(gpu::LaunchTssaStep(step, gpu::DType::kFloat32, w_step.const_data_ptr(),
                                c.temp.const_data_ptr<float>(), db.const_data_ptr<float>(), tmax,
                                positions.data(), state.mutable_data_ptr<float>(), nullptr, B,
                                y.mutable_data_ptr(), nullptr),
            cudaSuccess)
      << emu::LastLaunchReport();
  EXPECT_TRUE(y[0].isfinite().all().item<bool>());
  EXPECT_TRUE(y[1].isnan().all().item<bool>());
  EXPECT_TRUE(y[2].isnan().all().item<bool>());

  const gpu::Dims causal{B, T, D, K};
  const gpu::Plan plan = gpu::PlanTssaCausal(causal);
  at::Tensor ws = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, at::kByte);
  emu::RegisterWorkspace(ws.mutable_data_ptr(), plan.workspace_bytes);
  at::Tensor yc = at::empty_like(c.w);
  at::Tensor state_out = at::empty_like(c.state);
  const std::vector<int64_t> starts = {0, tmax - T + 1, -3};
  ASSERT_EQ(
      gpu::LaunchTssaCausal(causal, plan, gpu::DType::kFloat32, c.w.const_data_ptr(),
                            c.temp.const_data_ptr<float>(), db.const_data_ptr<float>(), tmax,
                            c.state.const_data_ptr<float>(), starts.data(), yc.mutable_data_ptr(),
                            state_out.mutable_data_ptr<float>(), ws.mutable_data_ptr(), nullptr),
      cudaSuccess)
      << emu::LastLaunchReport();
  EXPECT_TRUE(yc[0].isfinite().all().item<bool>());
  EXPECT_TRUE(yc[1].isnan().all().item<bool>());
  EXPECT_TRUE(yc[2].isnan().all().item<bool>());
  EXPECT_TRUE(emu::TakeReports().empty());
}

// Row ids on the device are not checked by the host either: a row id outside the pool gets NaN and
// the pool is untouched (ASan would report a write past it).
TEST_F(EmulatorTest, DeviceRowIdsOutOfThePoolGiveNaNAndTouchNothing) {
  const int64_t B = 3, P = 4, D = 40, K = 8;
  const Case c = MakeCase(B, 0, D, K);
  at::Tensor pool = MakeCase(P, 0, D, K).state.clone();
  const at::Tensor before = pool.clone();
  const std::vector<int64_t> positions = {1, 2, 3};
  const std::vector<int64_t> row_ids = {1, P, 0};  // the second is one past the pool
  at::Tensor y = at::empty_like(c.w);
  ASSERT_EQ(
      gpu::LaunchTssaStep(gpu::Dims{B, 1, D, K}, gpu::DType::kFloat32, c.w.const_data_ptr(),
                          c.temp.const_data_ptr<float>(), c.denom_bias.const_data_ptr<float>(),
                          c.denom_bias.size(1), positions.data(), pool.mutable_data_ptr<float>(),
                          row_ids.data(), P, y.mutable_data_ptr(), nullptr),
      cudaSuccess)
      << emu::LastLaunchReport();
  EXPECT_TRUE(y[0].isfinite().all().item<bool>());
  EXPECT_TRUE(y[1].isnan().all().item<bool>());
  EXPECT_TRUE(y[2].isfinite().all().item<bool>());
  EXPECT_FALSE(at::equal(pool[1], before[1]));
  EXPECT_FALSE(at::equal(pool[0], before[0]));
  EXPECT_TRUE(at::equal(pool[2], before[2]));
  EXPECT_TRUE(at::equal(pool[3], before[3]));
  EXPECT_TRUE(emu::TakeReports().empty());
}

// Bitmask rows on the device are not checked by the host: one naming a row outside the logits is
// skipped (ASan would report a write past them), the others are applied.
TEST_F(EmulatorTest, DeviceMaskRowsOutsideTheLogitsAreSkipped) {
  const int64_t R = 3, V = 70, W = 3;
  at::manual_seed(9);
  at::Tensor logits = at::randn({R, V});
  const at::Tensor before = logits.clone();
  const at::Tensor mask = at::zeros({3, W}, at::kInt);  // nothing allowed
  for (const int64_t outside : {int64_t{-1}, R}) {
    const std::vector<int64_t> rows = {2, outside, 0};
    logits.copy_(before);
    ASSERT_EQ(gpu::LaunchApplyTokenBitmask({R, V, 3, W}, logits.mutable_data_ptr<float>(),
                                           mask.const_data_ptr<int32_t>(), rows.data(),
                                           gpu::RowIdType::kInt64, nullptr),
              cudaSuccess)
        << emu::LastLaunchReport();
    EXPECT_TRUE(logits[0].isneginf().all().item<bool>());
    EXPECT_TRUE(at::equal(logits[1], before[1]));
    EXPECT_TRUE(logits[2].isneginf().all().item<bool>());
    EXPECT_TRUE(emu::TakeReports().empty());
  }
}

// Distinct rows are the caller's promise: two bitmask rows on one logits row are two blocks writing
// the same words, which the emulator reports as a race (on a GPU both would write -infinity).
TEST_F(EmulatorTest, OneLogitsRowNamedTwiceByDeviceMaskRowsIsARace) {
  const int64_t R = 2, V = 40, W = 2;
  at::Tensor logits = at::zeros({R, V});
  const at::Tensor mask = at::zeros({2, W}, at::kInt);
  const std::vector<int32_t> rows = {1, 1};
  const cudaError_t err = gpu::LaunchApplyTokenBitmask(
      {R, V, 2, W}, logits.mutable_data_ptr<float>(), mask.const_data_ptr<int32_t>(), rows.data(),
      gpu::RowIdType::kInt32, nullptr);
  const std::vector<std::string> reports = emu::TakeReports();
  EXPECT_NE(err, cudaSuccess);
  EXPECT_TRUE(AnyContains(reports, "race", "ApplyTokenBitmaskKernel")) << Joined(reports);
}

// -- The checkers' rules, on kernels of their own ----------------------------------------------

constexpr int kToyThreads = 64;

// Thread i writes shared[i]; with `sync` a barrier, then thread i reads shared[(i + 1) % n].
__global__ void __launch_bounds__(kToyThreads) NeighbourKernel(float* out, bool sync) {
  TOST_DYNAMIC_SHARED(float, s);
  const int i = threadIdx.x;
  s[i] = static_cast<float>(i);
  if (sync) __syncthreads();
  out[i] = s[(i + 1) % blockDim.x];
}

// Lane i writes shared[i]; with `sync` a __syncwarp, then reads its neighbour within the warp.
__global__ void __launch_bounds__(kToyThreads) WarpNeighbourKernel(float* out, bool sync) {
  TOST_DYNAMIC_SHARED(float, s);
  const int i = threadIdx.x;
  s[i] = static_cast<float>(i);
  if (sync) __syncwarp();
  out[i] = s[(i & ~31) + ((i + 1) & 31)];
}

// Only even threads reach the barrier.
__global__ void __launch_bounds__(kToyThreads) DivergentBarrierKernel(float* out) {
  if (threadIdx.x % 2 == 0) __syncthreads();
  out[threadIdx.x] = 1.f;
}

// Every block writes out[0].
__global__ void __launch_bounds__(kToyThreads) SameWordKernel(float* out) {
  if (threadIdx.x == 0) out[0] = static_cast<float>(blockIdx.x);
}

// Reads shared memory nobody wrote.
__global__ void __launch_bounds__(kToyThreads) UninitialisedKernel(float* out) {
  TOST_DYNAMIC_SHARED(float, s);
  out[threadIdx.x] = s[threadIdx.x];
}

template <auto kKernel, typename... Args>
std::vector<std::string> RunToy(gpu::LaunchShape shape, Args... args) {
  const cudaError_t err = gpu::Launch<kKernel, kToyThreads>(shape, args...);
  std::vector<std::string> reports = emu::TakeReports();
  EXPECT_EQ(err == cudaSuccess, reports.empty()) << Joined(reports);
  return reports;
}

TEST_F(EmulatorTest, ABarrierOrdersTheBlockAndItsAbsenceIsARace) {
  std::vector<float> out(kToyThreads);
  const gpu::LaunchShape shape{dim3(1), dim3(kToyThreads), kToyThreads * sizeof(float), nullptr};
  EXPECT_TRUE((RunToy<NeighbourKernel>(shape, out.data(), true)).empty());
  for (int i = 0; i < kToyThreads; ++i) EXPECT_EQ(out[i], (i + 1) % kToyThreads);
  const auto reports = RunToy<NeighbourKernel>(shape, out.data(), false);
  EXPECT_TRUE(AnyContains(reports, "NeighbourKernel", "race:")) << Joined(reports);
}

TEST_F(EmulatorTest, SyncwarpOrdersItsLanes) {
  std::vector<float> out(kToyThreads);
  const gpu::LaunchShape shape{dim3(1), dim3(kToyThreads), kToyThreads * sizeof(float), nullptr};
  EXPECT_TRUE((RunToy<WarpNeighbourKernel>(shape, out.data(), true)).empty());
  const auto reports = RunToy<WarpNeighbourKernel>(shape, out.data(), false);
  EXPECT_TRUE(AnyContains(reports, "WarpNeighbourKernel", "race:")) << Joined(reports);
}

TEST_F(EmulatorTest, ABarrierNotEveryThreadReachesIsReportedNotAHang) {
  std::vector<float> out(kToyThreads);
  const auto reports = RunToy<DivergentBarrierKernel>(
      gpu::LaunchShape{dim3(1), dim3(kToyThreads), 0, nullptr}, out.data());
  EXPECT_TRUE(AnyContains(reports, "DivergentBarrierKernel", "__syncthreads")) << Joined(reports);
}

TEST_F(EmulatorTest, TwoBlocksWritingOneWordIsARace) {
  float out = 0;
  const auto reports =
      RunToy<SameWordKernel>(gpu::LaunchShape{dim3(3), dim3(32), 0, nullptr}, &out);
  EXPECT_TRUE(AnyContains(reports, "SameWordKernel", "of the same launch")) << Joined(reports);
}

TEST_F(EmulatorTest, ReadingUnwrittenSharedMemoryIsReported) {
  std::vector<float> out(kToyThreads);
  const auto reports = RunToy<UninitialisedKernel>(
      gpu::LaunchShape{dim3(1), dim3(kToyThreads), kToyThreads * sizeof(float), nullptr},
      out.data());
  EXPECT_TRUE(AnyContains(reports, "UninitialisedKernel", "uninitialised read")) << Joined(reports);
}

TEST_F(EmulatorTest, LaunchesAreRefusedAsADeviceRefusesThem) {
  float out[kToyThreads] = {};
  EXPECT_EQ(
      (gpu::Launch<SameWordKernel, kToyThreads>({dim3(1), dim3(kToyThreads * 2), 0, nullptr}, out)),
      cudaErrorLaunchOutOfResources);
  EXPECT_EQ((gpu::Launch<SameWordKernel, 2048>({dim3(1), dim3(2048), 0, nullptr}, out)),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ((gpu::Launch<SameWordKernel, kToyThreads>({dim3(1, 65536), dim3(32), 0, nullptr}, out)),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ((gpu::Launch<SameWordKernel, kToyThreads>({dim3(0), dim3(32), 0, nullptr}, out)),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ((gpu::Launch<SameWordKernel, kToyThreads>(
                {dim3(1), dim3(32), gpu::kMaxDefaultDynamicSharedBytes + 4, nullptr}, out)),
            cudaErrorInvalidValue);
  EXPECT_NE(emu::LastLaunchReport().find("48 KiB"), std::string::npos) << emu::LastLaunchReport();
  emu::TakeReports();
}

}  // namespace
}  // namespace tost::kernels
