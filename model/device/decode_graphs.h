// CUDA graphs of a language model's decode step, one per (batch bucket, batch-invariant mode),
// replayed instead of launching the step's kernels one by one. Internal to model/ (includes ATen);
// LanguageModel's CUDA state pool owns one.
//
// A graph replays fixed device addresses, so the step reads its inputs from one static buffer,
// `staged()` (int64 [3, max_bucket]: token ids, positions, pool rows), that every step writes
// first, and its logits land in a tensor the graph owns. Capturing runs on scratch rows of the pool
// only (the warm-up before a capture executes, the capture itself does not), then each new graph is
// checked against an eager step on the same inputs, bit for bit: a graph that differs (or a capture
// that fails) turns graphs off for the pool, and decode goes on eagerly at the same padded shapes,
// with the reason in mode().
//
// Every capture runs on one stream the set creates for itself and keeps for its lifetime (a stream
// drawn from LibTorch's pool may be one another model, or another thread, is using: their work
// would be recorded into the graph), and every graph shares one memory pool the set holds (steps
// never overlap). Prepare() captures a bucket's graph ahead of its first step: the model's
// PrepareDecode runs it for every bucket before the server reports SERVING, so a capture that
// fails shows at start-up.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace tost::model {

class DecodeGraphs {
 public:
  // logits [b, vocab] for ids [b, 1], positions [b], rows [b] (views of staged()).
  using StepFn = std::function<at::Tensor(const at::Tensor& ids, const at::Tensor& positions,
                                          const at::Tensor& rows, bool batch_invariant)>;

  // `enabled`: capture graphs (a CUDA device only); otherwise every step runs eagerly.
  DecodeGraphs(c10::Device device, int64_t max_bucket, bool enabled);
  ~DecodeGraphs();

  // int64 [3, max_bucket] on the device: rows 0, 1, 2 are ids, positions and pool rows; a step
  // of bucket b reads the first b columns.
  const at::Tensor& staged() const { return staged_; }

  // The logits [bucket, vocab] of the step staged in the first `bucket` columns, from the
  // bucket's graph (captured on first use) or eagerly. `scratch` stages inputs that touch only
  // scratch rows into the first `bucket` columns and zeroes those rows (for captures and checks).
  at::Tensor Run(int64_t bucket, bool batch_invariant, const StepFn& step,
                 const std::function<void(int64_t bucket)>& scratch);

  // Captures and checks the graph of (bucket, batch_invariant) now unless it exists: what Run
  // would do on the bucket's first step. Leaves staged() as it found it. False when graphs are off
  // (mode() says why), now or before.
  bool Prepare(int64_t bucket, bool batch_invariant, const StepFn& step,
               const std::function<void(int64_t bucket)>& scratch);

  // "cuda graphs" while graphs run, else "eager" and why.
  std::string mode() const { return mode_; }
  int64_t graphs() const { return static_cast<int64_t>(graphs_.size()); }

 private:
  struct Graph;
  struct CaptureState;
  // Captures and checks the graph of (bucket, batch_invariant); false (graphs off, mode_ says
  // why) when it cannot be used.
  bool Capture(int64_t bucket, bool batch_invariant, const StepFn& step,
               const std::function<void(int64_t bucket)>& scratch);
  at::Tensor Inputs(int64_t row, int64_t bucket) const;

  c10::Device device_;
  at::Tensor staged_;
  bool enabled_;
  std::string mode_;
  // The capture stream and the graphs' memory pool, made by the first capture (CUDA only).
  std::unique_ptr<CaptureState> capture_;
  std::map<std::pair<int64_t, bool>, std::unique_ptr<Graph>> graphs_;
};

}  // namespace tost::model
