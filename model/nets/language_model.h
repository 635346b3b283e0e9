// The causal ToST language model (nanoGPT skeleton, causal TSSA with denom_bias, γ layer scale,
// tied embeddings) as docs/model-semantics.md §2 describes it, in three forms that agree:
//   ForwardAll  parallel causal form over whole sequences (all positions' logits);
//   Prefill     chunked tssa_causal continuing a SequenceState (exact: chunks carry statistics);
//   Step        one token for each of B sequences at their own positions (tssa_step).
// Torch-free interface; tensors live in language_model.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config/config.h"
#include "model/config/device.h"
#include "model/sampling/sampler.h"
#include "model/state/sequence_state.h"
#include "model/state/state_pool.h"
#include "model/text/tokenizer.h"

namespace tost::model {

class LanguageModel {
 public:
  // Weights go to `placement`'s device in its dtype (TSSA parameters and statistics stay
  // float32); inputs are staged to the device and results copied back once per call.
  static absl::StatusOr<std::unique_ptr<LanguageModel>> Load(const std::string& model_dir,
                                                             const ModelConfig& config,
                                                             const Placement& placement = {});
  ~LanguageModel();

  const ModelConfig& config() const;
  // The model's tokenizer (config.json "tokenizer"), loaded with the weights.
  const Tokenizer& tokenizer() const;

  // A fresh sequence at position 0 with zero statistics.
  SequenceState NewSequence() const;

  // Feeds `tokens` (≥ 1) to `state` in chunks of at most `chunk_tokens`; returns the last token's
  // logits [vocab]. OUT_OF_RANGE (state untouched) if the context length would be exceeded.
  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens, SequenceState& state,
                                             int64_t chunk_tokens = 256) const;

  // One decode step: token b is fed to *states[b]; returns logits [B, vocab] row-major.
  //
  // Batched matrix products may round differently at different batch sizes (the BLAS picks its
  // blocking by shape). With `batch_invariant`, every row is computed on its own with a fixed
  // shape, so a sequence's logits are bit-identical whatever else shares the step; this costs
  // B small products instead of one batched one.
  absl::StatusOr<std::vector<float>> Step(absl::Span<const int32_t> tokens,
                                          absl::Span<SequenceState* const> states,
                                          bool batch_invariant = false) const;

  // A pool of `rows` sequence states on the model's device (float32 [n_layer, rows, 2·n_embd +
  // n_head], zeros), for the two calls below.
  absl::StatusOr<std::unique_ptr<StatePool>> NewStatePool(int64_t rows) const;

  // Prefill and Step on pool rows, read and updated in place where the model computes: the
  // serving path. `positions` are the sequences' current positions (the caller advances them);
  // the results are bit-identical to the SequenceState forms above. The pool must come from
  // this model's NewStatePool; Step's rows must be distinct.
  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens, StatePool& pool,
                                             int64_t row, int64_t position,
                                             int64_t chunk_tokens = 256) const;
  absl::StatusOr<std::vector<float>> Step(absl::Span<const int32_t> tokens, StatePool& pool,
                                          absl::Span<const int64_t> rows,
                                          absl::Span<const int64_t> positions,
                                          bool batch_invariant = false) const;
  // The same step, then row b's token drawn as draws[b] says (DrawTokens). On a GPU the draw runs
  // where the logits are, so only the drawn ids and the requested logprobs cross to the host;
  // on the CPU it is DrawTokens itself (unless Placement draw_on_device asks for the device
  // form, which tests compare with it). `before_draw`, when set, runs after the step's forward
  // is issued and before the draw reads `draws` (on a GPU, while the forward runs): where the
  // caller finishes what the draws need, the constrained rows' masks.
  absl::StatusOr<std::vector<DrawnToken>> StepAndDraw(
      absl::Span<const int32_t> tokens, StatePool& pool, absl::Span<const int64_t> rows,
      absl::Span<const int64_t> positions, absl::Span<const TokenDraw> draws,
      bool batch_invariant = false, const std::function<void()>& before_draw = nullptr) const;

  // Readies `pool` for decode steps in `batch_invariant` mode before the first one: on a CUDA
  // device, captures (and checks) the decode step's graph of every batch bucket, so the server
  // pays for it and sees a capture fail at start-up, not on a request (a failed capture turns
  // graphs off: decode_mode() says why). Nothing to do on the CPU. The pool must come from this
  // model's NewStatePool; its rows are not touched (captures run on its scratch rows).
  absl::Status PrepareDecode(StatePool& pool, bool batch_invariant) const;

  // The least memory traffic of a decode step of `rows` sequences: every weight read once (the
  // position table and the TSSA denominators only at the rows' positions), each row's
  // statistics read and written, the logits written. Benchmarks divide it by the step's time and
  // the device's measured bandwidth.
  int64_t DecodeStepBytes(int64_t rows) const;

  // The bytes of the lean CPU decode step's packed weights (lean_decoder.h), held beside the
  // weights prefill reads; 0 when that step is off (CUDA, or Placement turns it off).
  int64_t LeanDecodeBytes() const;
  // The most rows a step (or tokens a prefill chunk) the lean step takes (lean_row_limits.h, or
  // Placement::cpu_lean_decode_max_rows); 0 when that step is off.
  int64_t LeanDecodeMaxRows() const;

  // Parallel causal forward from position 0: tokens [batch, length] → logits [batch, length,
  // vocab].
  absl::StatusOr<std::vector<float>> ForwardAll(absl::Span<const int32_t> tokens, int64_t batch,
                                                int64_t length) const;

  // Prompt scoring: one forward over `tokens` (2 to the context length) from position 0, then, for
  // each i in [1, tokens.size()), how likely tokens[i] was after the tokens before it, with the
  // top_n most likely alternatives: ScoreTokens over ForwardAll's logits, computed on the model's
  // device a bounded block of positions at a time, so that only the scores reach the host (not
  // [tokens, vocab] logits: 800 MB for 4,096 positions of a 50,000-token vocabulary).
  // `block_bytes` bounds the device memory of one block's logits (in double, as ScoreTokens sums
  // the partition); at least one position is scored per block.
  static constexpr int64_t kDefaultScoreBlockBytes = int64_t{64} << 20;
  absl::StatusOr<std::vector<DrawnToken>> ScorePrompt(
      absl::Span<const int32_t> tokens, int32_t top_n,
      int64_t block_bytes = kDefaultScoreBlockBytes) const;

 private:
  struct Impl;
  class DevicePool;
  // tokens [batch, length]: the shape, the context length and the vocabulary, or the error.
  absl::Status CheckWholeSequences(absl::Span<const int32_t> tokens, int64_t batch,
                                   int64_t length) const;
  // `pool` as this model's own DevicePool, or INVALID_ARGUMENT.
  absl::StatusOr<const DevicePool*> OwnPool(const StatePool& pool) const;
  // The checks and the device work both pool steps share; `finish` turns the step's logits
  // [B, vocab] (on the device) into the result, inside the LibTorch boundary.
  template <typename Result, typename Finish>
  absl::StatusOr<Result> StepOnPool(absl::Span<const int32_t> tokens, StatePool& pool,
                                    absl::Span<const int64_t> rows,
                                    absl::Span<const int64_t> positions, bool batch_invariant,
                                    const Finish& finish) const;
  explicit LanguageModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tost::model
