#include "model/device/decode_graphs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "model/device/device_failure.h"

#if defined(TOST_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tost::model {

#if defined(TOST_WITH_CUDA)
struct DecodeGraphs::Graph {
  at::cuda::CUDAGraph graph;
  at::Tensor logits;  // written by every replay
};
#else
struct DecodeGraphs::Graph {};
#endif

DecodeGraphs::DecodeGraphs(c10::Device device, int64_t max_bucket, bool enabled)
    : device_(device),
      staged_(at::zeros({3, max_bucket}, at::TensorOptions(at::kLong).device(device))),
      enabled_(enabled && device.is_cuda()),
      mode_(enabled_ ? "cuda graphs" : "eager") {
#if !defined(TOST_WITH_CUDA)
  if (enabled_) {
    enabled_ = false;
    mode_ = "eager: this build has no CUDA graphs";
  }
#endif
}

DecodeGraphs::~DecodeGraphs() = default;

at::Tensor DecodeGraphs::Inputs(int64_t row, int64_t bucket) const {
  return staged_[row].narrow(0, 0, bucket);
}

at::Tensor DecodeGraphs::Run(int64_t bucket, bool batch_invariant, const StepFn& step,
                             const std::function<void(int64_t)>& scratch) {
#if defined(TOST_WITH_CUDA)
  if (enabled_) {
    auto it = graphs_.find({bucket, batch_invariant});
    if (it == graphs_.end() && Capture(bucket, batch_invariant, step, scratch)) {
      it = graphs_.find({bucket, batch_invariant});
    }
    if (it != graphs_.end()) {
      it->second->graph.replay();
      return it->second->logits;
    }
  }
#endif
  return step(Inputs(0, bucket).view({bucket, 1}), Inputs(1, bucket), Inputs(2, bucket),
              batch_invariant);
}

bool DecodeGraphs::Capture(int64_t bucket, bool batch_invariant, const StepFn& step,
                           const std::function<void(int64_t)>& scratch) {
#if defined(TOST_WITH_CUDA)
  const at::Tensor ids = Inputs(0, bucket).view({bucket, 1});
  const at::Tensor positions = Inputs(1, bucket);
  const at::Tensor rows = Inputs(2, bucket);
  // The real step's inputs are staged already: kept aside while scratch inputs take their place.
  const at::Tensor real = staged_.narrow(1, 0, bucket).clone();
  auto graph = std::make_unique<Graph>();
  std::string failure;
  try {
    // Captured on a side stream (the default stream cannot be captured), after one eager warm-up
    // there: cuBLAS handles and workspaces, and the caching allocator's blocks, exist before the
    // capture records their addresses.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
    side.synchronize();
    current.synchronize();
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      scratch(bucket);
      step(ids, positions, rows, batch_invariant);
      side.synchronize();
      scratch(bucket);
      // Every graph of this pool shares the first one's memory pool: steps never overlap.
      // Thread-local capture: the other models' threads may allocate and launch meanwhile.
      graph->graph.capture_begin(
          graphs_.empty() ? at::cuda::MempoolId_t{0, 0} : graphs_.begin()->second->graph.pool(),
          cudaStreamCaptureModeThreadLocal);
      try {
        graph->logits = step(ids, positions, rows, batch_invariant);
      } catch (...) {
        try {
          graph->graph.capture_end();
        } catch (...) {
        }
        throw;
      }
      graph->graph.capture_end();
      side.synchronize();
    }
    // The graph must compute exactly what the eager step computes on the same rows.
    scratch(bucket);
    graph->graph.replay();
    const at::Tensor replayed = graph->logits.clone();
    scratch(bucket);
    const at::Tensor eager = step(ids, positions, rows, batch_invariant);
    if (!at::equal(replayed, eager)) {
      failure = absl::StrCat("the graph of batch ", bucket, " (batch-invariant ", batch_invariant,
                             ") differs from the eager step");
    }
  } catch (const c10::AcceleratorError& e) {
    // The device itself failed: not a graph problem, and GuardTorch must see it.
    if (IsStickyCudaError(e.get_error_code())) throw;
    failure = absl::StrCat("capturing batch ", bucket, " failed: ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    failure = absl::StrCat("capturing batch ", bucket, " failed: ", e.what_without_backtrace());
  }
  staged_.narrow(1, 0, bucket).copy_(real);
  if (!failure.empty()) {
    enabled_ = false;
    mode_ = absl::StrCat("eager: ", failure);
    graphs_.clear();
    return false;
  }
  graphs_[{bucket, batch_invariant}] = std::move(graph);
  return true;
#else
  return false;
#endif
}

}  // namespace tost::model
