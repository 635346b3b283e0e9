// GPU-only cases of the CUDA operators: a non-default stream (the launches and the pinned upload of
// host positions must use the current stream, not the legacy default) and a second device (the
// device guard must follow w). Skipped without a device, or without a second one.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernels/tssa_ops.h"

namespace tost::kernels {
namespace {

struct Results {
  at::Tensor vision, causal_y, causal_state, step_y, step_state;
};

// All three operators on `device`, with host positions (uploaded by the operator) for the causal
// op.
Results RunAll(const at::Device& device) {
  at::manual_seed(131);
  const int64_t B = 3, T = 70, D = 384, K = 8;
  const auto on = [&](const at::Tensor& t) { return t.to(device); };
  const at::Tensor w = on(at::randn({B, T, D}));
  const at::Tensor temp = on(at::rand({K}) + 0.5);
  const at::Tensor db = on(0.1 * at::randn({K, T + 16}));
  const at::Tensor positions = at::tensor(std::vector<int64_t>{0, 5, 16});
  Results r;
  r.vision = tssa(w, temp);
  std::tie(r.causal_y, r.causal_state) = tssa_causal(w, temp, db, std::nullopt, positions);
  r.step_state = r.causal_state.clone();
  r.step_y = tssa_step(w.select(1, 0), temp, db, on(positions), r.step_state);
  return r;
}

void ExpectEqual(const Results& a, const Results& b) {
  EXPECT_TRUE(at::equal(a.vision.cpu(), b.vision.cpu()));
  EXPECT_TRUE(at::equal(a.causal_y.cpu(), b.causal_y.cpu()));
  EXPECT_TRUE(at::equal(a.causal_state.cpu(), b.causal_state.cpu()));
  EXPECT_TRUE(at::equal(a.step_y.cpu(), b.step_y.cpu()));
  EXPECT_TRUE(at::equal(a.step_state.cpu(), b.step_state.cpu()));
}

TEST(TssaCudaStreams, ANonDefaultStreamGivesTheSameResults) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Results on_default = RunAll(at::Device(at::kCUDA, 0));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
  Results on_pool;
  {
    const c10::cuda::CUDAStreamGuard guard(stream);
    on_pool = RunAll(at::Device(at::kCUDA, 0));
    stream.synchronize();
  }
  ExpectEqual(on_default, on_pool);
}

TEST(TssaCudaStreams, ASecondDeviceGivesTheSameResults) {
  if (!at::hasCUDA() || c10::cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  // The current device stays 0: the operators must select w's device themselves.
  ExpectEqual(RunAll(at::Device(at::kCUDA, 0)), RunAll(at::Device(at::kCUDA, 1)));
}

}  // namespace
}  // namespace tost::kernels
