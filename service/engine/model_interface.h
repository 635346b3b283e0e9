// What the engine needs of a model, and nothing more. The engine batches, schedules and keeps
// sessions; it never sees a tensor or a device. The LibTorch models implement these interfaces in
// service/runtime (torch_models.h); tests implement them with small deterministic fakes, so the
// batcher, the scheduler and the session store are tested without LibTorch or model files.
//
// Thread-safety: every method is const and may be called from any thread. The scheduler calls a
// GenerativeModel from its one step thread; the batcher calls a ClassifierModel from its worker
// thread while membership requests call it from handler threads.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config.h"
#include "model/sequence_state.h"
#include "model/tokenizer.h"

namespace tost::service {

// An image classifier (architecture tost_vision).
class ClassifierModel {
 public:
  virtual ~ClassifierModel() = default;

  virtual const model::ModelConfig& config() const = 0;

  // pixels: float32 [images, in_chans, height, width], preprocessed. Returns logits
  // [images, num_classes] row-major.
  virtual absl::StatusOr<std::vector<float>> Classify(absl::Span<const float> pixels,
                                                      int64_t images, int64_t height,
                                                      int64_t width) const = 0;

  // The logits and, for every TSSA layer, each patch token's membership over the K heads.
  struct Explained {
    std::vector<float> logits;       // [images, num_classes]
    std::vector<float> membership;   // [images, depth, K, grid_h * grid_w]
    int64_t grid_h = 0, grid_w = 0;  // the patch-token grid
  };
  virtual absl::StatusOr<Explained> ClassifyWithMembership(absl::Span<const float> pixels,
                                                           int64_t images, int64_t height,
                                                           int64_t width) const = 0;
};

// A causal language model (architecture tost_lm) whose whole per-sequence memory is a
// model::SequenceState of fixed size.
class GenerativeModel {
 public:
  virtual ~GenerativeModel() = default;

  virtual const model::ModelConfig& config() const = 0;
  virtual const model::Tokenizer& tokenizer() const = 0;

  // A sequence at position 0 with zero statistics.
  virtual model::SequenceState NewSequence() const = 0;

  // Feeds `tokens` (at least one) to `state` in chunks of at most `chunk_tokens`; returns the last
  // token's logits [vocab]. OUT_OF_RANGE (state untouched) past the context length.
  virtual absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens,
                                                     model::SequenceState& state,
                                                     int64_t chunk_tokens) const = 0;

  // One decode step: token b is fed to *states[b]; returns logits [B, vocab] row-major. With
  // `batch_invariant`, row b is bit-identical whatever else shares the step.
  virtual absl::StatusOr<std::vector<float>> Step(absl::Span<const int32_t> tokens,
                                                  absl::Span<model::SequenceState* const> states,
                                                  bool batch_invariant) const = 0;
};

}  // namespace tost::service
