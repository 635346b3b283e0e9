#include "model/device/decode_graphs.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include "absl/strings/str_cat.h"
#include "model/device/device_failure.h"

#if defined(TOST_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace tost::model {

#if defined(TOST_WITH_CUDA)
struct DecodeGraphs::Graph {
  at::cuda::CUDAGraph graph;
  at::Tensor logits;  // written by every replay
};

// What every capture of the set runs on and allocates from, made once and kept: a stream no one
// else is given (LibTorch's pool hands its 32 streams per priority round-robin to every caller, the
// models' own streams included, so a stream drawn from it may carry another thread's work while
// capturing), and the memory pool all the set's graphs share.
struct DecodeGraphs::CaptureState {
  c10::DeviceIndex device = 0;
  cudaStream_t stream = nullptr;
  at::cuda::MempoolId_t pool{0, 0};

  explicit CaptureState(c10::DeviceIndex d) : device(d) {
    const c10::cuda::CUDAGuard on_device(device);
    // Non-blocking, as LibTorch's own streams: no implicit sync with the legacy default stream,
    // which a capture would refuse.
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    pool = at::cuda::graph_pool_handle();
  }
  CaptureState(const CaptureState&) = delete;
  CaptureState& operator=(const CaptureState&) = delete;
  ~CaptureState() {
    try {
      const c10::cuda::CUDAGuard on_device(device);
      (void)cudaStreamDestroy(stream);  // a lost device cannot be helped here
    } catch (...) {
    }
  }

  c10::cuda::CUDAStream Stream() const { return c10::cuda::getStreamFromExternal(stream, device); }

  // After a capture that did not complete: nothing may be left capturing on the stream, and the
  // caching allocator must stop routing this pool's allocations to the capture. capture_end ends
  // the stream's capture first and the allocator's routing after it, so a capture_end that throws
  // in between (some LibTorch versions) leaves the allocator believing a capture is under way:
  // it then defers freeing every block used across streams, for good. Call after the failed
  // Graph is destroyed (LibTorch versions that clean up in CUDAGraph::reset do it there).
  void AbandonCapture() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) {
        (void)cudaGraphDestroy(partial);
      }
    }
    // Clears what the calls above may have set; a sticky error stays and shows on the next call.
    (void)cudaGetLastError();
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
    } catch (const c10::Error&) {
      // "not currently recording to mempool_id": capture_end or CUDAGraph::reset ended it.
    }
  }
};
#else
struct DecodeGraphs::Graph {};
struct DecodeGraphs::CaptureState {};
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

DecodeGraphs::~DecodeGraphs() {
  graphs_.clear();   // the graphs release their share of the pool
  capture_.reset();  // then the stream they were captured on goes
}

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

bool DecodeGraphs::Prepare(int64_t bucket, bool batch_invariant, const StepFn& step,
                           const std::function<void(int64_t)>& scratch) {
  if (!enabled_) return false;
  if (graphs_.count({bucket, batch_invariant}) > 0) return true;
  return Capture(bucket, batch_invariant, step, scratch);
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
  bool captured = false;  // capture_end returned: nothing of the capture is left to undo
  try {
    if (capture_ == nullptr) capture_ = std::make_unique<CaptureState>(device_.index());
    // Captured on the set's own stream (the default stream cannot be captured), after one eager
    // warm-up there: cuBLAS handles and workspaces, and the caching allocator's blocks, exist
    // before the capture records their addresses.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    const c10::cuda::CUDAStream side = capture_->Stream();
    side.synchronize();
    current.synchronize();
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      scratch(bucket);
      step(ids, positions, rows, batch_invariant);
      side.synchronize();
      scratch(bucket);
      // Every graph of this set shares its memory pool: steps never overlap.
      // Thread-local capture: the other models' threads may allocate and launch meanwhile.
      graph->graph.capture_begin(capture_->pool, cudaStreamCaptureModeThreadLocal);
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
      captured = true;
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
  if (!failure.empty() && !captured && capture_ != nullptr) {
    graph.reset();
    capture_->AbandonCapture();
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
