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
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "model/config/config.h"
#include "model/sampling/sampler.h"
#include "model/state/sequence_state.h"
#include "model/state/state_pool.h"
#include "model/text/tokenizer.h"

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

  // The rows that hold the active sequences' statistics between steps, where the model computes
  // (device memory for a GPU model): the scheduler makes one pool of max_active_jobs rows and
  // gives each active job a row; the calls below read and update rows in place.
  virtual absl::StatusOr<std::unique_ptr<model::StatePool>> NewStatePool(int64_t rows) const = 0;

  // Readies a pool from NewStatePool for decode steps in `batch_invariant` mode, before the first
  // one: what a model does once rather than on a request's step (a GPU model captures its decode
  // graphs here; a capture that fails turns them off, as the pool's decode_mode() then says). The
  // scheduler calls it when it is created, before the server reports SERVING. An error means the
  // model cannot decode at all.
  virtual absl::Status PrepareDecode(model::StatePool& pool, bool batch_invariant) const {
    return absl::OkStatus();
  }

  // Feeds `tokens` (at least one) to the sequence in `row`, at `position`, in chunks of at most
  // `chunk_tokens`; returns the last token's logits [vocab]. OUT_OF_RANGE (row untouched) past the
  // context length. The caller advances its position.
  virtual absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens,
                                                     model::StatePool& pool, int64_t row,
                                                     int64_t position,
                                                     int64_t chunk_tokens) const = 0;

  // Prompt scoring (a completion's echo with logprobs): one forward over `tokens` (at least one,
  // at most the context length) from a fresh sequence, touching no pool row; entry i - 1 says how
  // likely tokens[i] was after the tokens before it (model::ScoreTokens) with the top_n most likely
  // alternatives. UNIMPLEMENTED for a model that cannot.
  virtual absl::StatusOr<std::vector<model::DrawnToken>> ScorePrompt(
      absl::Span<const int32_t> tokens, int32_t top_n) const {
    return absl::UnimplementedError(
        absl::StrCat("model ", config().name, " cannot score a prompt"));
  }

  // One decode step: token b is fed to the sequence in rows[b] (distinct) at positions[b], and
  // that sequence's next token is drawn as draws[b] says (model::DrawTokens is the reference).
  // Only the drawn tokens and the requested logprobs come back: a GPU model keeps its logits on
  // the device. With `batch_invariant`, row b's logits are bit-identical whatever else shares the
  // step. A refused step leaves every row untouched.
  //
  // `before_draw` (may be empty) runs once the forward is under way and before the draws read
  // draws[b].allowed: the caller finishes the constrained rows' masks there, so on a device that
  // computes asynchronously they are computed while the forward runs. It is not called when the
  // step fails before its draw.
  virtual absl::StatusOr<std::vector<model::DrawnToken>> Step(
      absl::Span<const int32_t> tokens, model::StatePool& pool, absl::Span<const int64_t> rows,
      absl::Span<const int64_t> positions, absl::Span<const model::TokenDraw> draws,
      bool batch_invariant, const std::function<void()>& before_draw) const = 0;
};

}  // namespace tost::service
