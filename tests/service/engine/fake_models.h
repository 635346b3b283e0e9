// Deterministic stand-ins for the LibTorch models behind the engine's model interfaces
// (service/engine/model_interface.h), so the batcher, the scheduler, the sessions and the Engine
// are tested without LibTorch, a GPU or model files.
//
// FakeLanguageModel behaves like a causal model whose whole memory is its SequenceState: feeding a
// token advances the position and folds (token, position) into every statistic, and the logits
// are a hash of all statistics and the position. A sequence continued from anything but its exact
// state (a statistic off by one, a wrong position) therefore draws other tokens, which is what the
// session tests need to have teeth. Its statistics are integers below 2^24 kept in floats, so the
// arithmetic is exact and the model is batch-invariant by construction.
//
// FakeClassifierModel answers each image with per-class weighted sums of its pixels
// (ExpectedLogits), so every request can check it got its own rows back, and it records the batch
// sizes it was called with. Hold() parks calls at a gate until Release(), to keep a batch in
// flight.
//
// Both are thread-safe like the real models: the scheduler or batcher thread calls them while the
// test reads their logs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "model/config/config.h"
#include "model/state/sequence_state.h"
#include "model/text/tokenizer.h"
#include "service/engine/model_interface.h"

namespace tost::service::testing {

struct FakeLanguageOptions {
  std::string name = "fake-lm";
  int64_t vocab_size = 260;  // bytes 0-255, then special tokens
  int64_t eos_token_id = 256;
  int64_t context_length = 512;
  // State floats: n_layer × (2·n_embd + n_head), as for a real tost_lm.
  int64_t n_layer = 2;
  int64_t n_embd = 4;
  int64_t n_head = 2;
  // Once a sequence has consumed this many tokens the model all but certainly says end of text
  // (-1: never), so a test reaches FinishReason kEos when it wants to and never otherwise.
  int64_t eos_at_position = -1;
  // A real model's statistics depend in their last bits on where a prompt was cut into prefill
  // chunks (a cut reorders float additions), and a decode step feeds its token like a prefill cut
  // after it. With this set the fake does the same, exaggerated: each piece of a Prefill (at most
  // chunk_tokens) and each Step row ends by folding a mark into the statistics, so two states
  // hold the same bits only if their tokens were cut at the same positions.
  bool cut_sensitive = false;
};

class FakeLanguageModel final : public GenerativeModel {
 public:
  explicit FakeLanguageModel(FakeLanguageOptions options = {});

  const model::ModelConfig& config() const override { return config_; }
  const model::Tokenizer& tokenizer() const override { return tokenizer_; }
  model::SequenceState NewSequence() const override;
  // The serving interface: rows of a HostStatePool, fed through the SequenceState forms below.
  absl::StatusOr<std::unique_ptr<model::StatePool>> NewStatePool(int64_t rows) const override;
  // Records the call's batch_invariant (prepare_decode_calls) and returns what
  // FailPrepareDecodeWith set (OK by default).
  absl::Status PrepareDecode(model::StatePool& pool, bool batch_invariant) const override;
  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens,
                                             model::StatePool& pool, int64_t row, int64_t position,
                                             int64_t chunk_tokens) const override;
  // Draws on the host from the logits of the SequenceState form (model::DrawTokens).
  absl::StatusOr<std::vector<model::DrawnToken>> Step(
      absl::Span<const int32_t> tokens, model::StatePool& pool, absl::Span<const int64_t> rows,
      absl::Span<const int64_t> positions, absl::Span<const model::TokenDraw> draws,
      bool batch_invariant, const std::function<void()>& before_draw) const override;

  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens,
                                             model::SequenceState& state,
                                             int64_t chunk_tokens) const;
  absl::StatusOr<std::vector<float>> Step(absl::Span<const int32_t> tokens,
                                          absl::Span<model::SequenceState* const> states,
                                          bool batch_invariant) const;

  // The logits [vocab] the model gives after consuming everything `state` holds: only printable
  // ASCII (32-126) is likely, so generated text is readable and stop strings can be picked from
  // it.
  std::vector<float> Logits(const model::SequenceState& state) const;
  // Folds one token into `state` as Prefill and Step do (no checks).
  void Feed(int32_t token, model::SequenceState& state) const;
  // The end of a prefill piece or a step with cut_sensitive (nothing without).
  void Cut(model::SequenceState& state) const;

  // Every later Prefill or Step call fails with `status` (OK: stop failing), before touching any
  // state.
  void FailPrefillWith(absl::Status status);
  void FailStepsWith(absl::Status status);

  // Runs `hook` after every later pool Prefill call, with the tokens it fed, on the calling thread
  // (a test submits calls there as if they arrived while the prefill ran); empty: no hook.
  void OnEachPrefill(std::function<void(int64_t tokens)> hook);

  // The batch size of every Step call, in order (failed calls included).
  std::vector<int32_t> step_batch_sizes() const;
  // The token count of every Prefill call, in order (failed calls included).
  std::vector<int64_t> prefill_sizes() const;
  int64_t step_calls() const;

  // Copies through the pools' Store and Load (what crosses between host and device on a GPU):
  // the model's own computing on the rows is not counted.
  int64_t pool_stores() const;
  int64_t pool_loads() const;
  // Every later pool Load fails with `status` (OK: stop failing).
  void FailPoolLoadsWith(absl::Status status);

  // What every pool of this model answers to decode_mode() from now on ("eager" at first), as a
  // GPU model's pool does when its graphs are turned off ("eager: " and why).
  void SetDecodeMode(std::string mode);
  std::string decode_mode() const;
  // The batch_invariant of every PrepareDecode call, in order; and what later calls return.
  std::vector<bool> prepare_decode_calls() const;
  void FailPrepareDecodeWith(absl::Status status);

 private:
  class Pool;
  friend class Pool;
  absl::Status CheckTokens(absl::Span<const int32_t> tokens) const;

  const FakeLanguageOptions options_;
  model::ModelConfig config_;
  model::ByteTokenizer tokenizer_;

  mutable absl::Mutex mu_;
  absl::Status prefill_failure_ ABSL_GUARDED_BY(mu_);
  std::function<void(int64_t)> prefill_hook_ ABSL_GUARDED_BY(mu_);
  absl::Status step_failure_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int32_t> step_batch_sizes_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int64_t> prefill_sizes_ ABSL_GUARDED_BY(mu_);
  mutable int64_t pool_stores_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int64_t pool_loads_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status pool_load_failure_ ABSL_GUARDED_BY(mu_);
  std::string decode_mode_ ABSL_GUARDED_BY(mu_) = "eager";
  mutable std::vector<bool> prepare_decode_calls_ ABSL_GUARDED_BY(mu_);
  absl::Status prepare_decode_failure_ ABSL_GUARDED_BY(mu_);
};

struct FakeVisionOptions {
  std::string name = "fake-vit";
  int64_t image_height = 4;
  int64_t image_width = 4;
  int64_t in_chans = 3;
  int64_t num_classes = 3;
  int64_t depth = 2;
  int64_t num_heads = 2;
  int64_t patch_size = 2;
};

class FakeClassifierModel final : public ClassifierModel {
 public:
  explicit FakeClassifierModel(FakeVisionOptions options = {});

  const model::ModelConfig& config() const override { return config_; }
  // INVALID_ARGUMENT unless `pixels` holds exactly images × in_chans × height × width floats at
  // the configured resolution.
  absl::StatusOr<std::vector<float>> Classify(absl::Span<const float> pixels, int64_t images,
                                              int64_t height, int64_t width) const override;
  // The same logits, and a uniform membership over the heads for every patch token.
  absl::StatusOr<Explained> ClassifyWithMembership(absl::Span<const float> pixels, int64_t images,
                                                   int64_t height, int64_t width) const override;

  // Floats of one preprocessed image.
  int64_t image_floats() const;
  // The logits [num_classes] of one image: class c weighs pixel p by ((p·(c+3)) mod 7) − 3.
  std::vector<float> ExpectedLogits(absl::Span<const float> image) const;

  // From now on calls wait at a gate until Release() (which also opens it for later calls).
  void Hold();
  void Release();
  // Blocks until `n` calls are waiting at the gate.
  void AwaitCallsHeld(int n) const;

  // Every later call fails with `status` (OK: stop failing).
  void FailWith(absl::Status status);

  // The image count of every Classify call, in order (failed calls included).
  std::vector<int64_t> batch_sizes() const;

 private:
  absl::StatusOr<std::vector<float>> Run(absl::Span<const float> pixels, int64_t images,
                                         int64_t height, int64_t width) const;

  const FakeVisionOptions options_;
  model::ModelConfig config_;

  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  mutable int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int64_t> batch_sizes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::service::testing
