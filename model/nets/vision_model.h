// The ToST vision classifier (XCiT skeleton, TSSA blocks, class-attention tail), exactly as
// docs/model-semantics.md §1.2 describes it. The interface is torch-free so service code can use it
// without LibTorch headers; tensors live in vision_model.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config/config.h"
#include "model/config/device.h"

namespace tost::model {

class VisionModel {
 public:
  // Loads <model_dir>/model.safetensors, validated against `config` (architecture tost_vision),
  // onto `placement`'s device in its dtype (TSSA temperatures stay float32). Images are staged to
  // the device and logits copied back once per batch.
  static absl::StatusOr<std::unique_ptr<VisionModel>> Load(const std::string& model_dir,
                                                           const ModelConfig& config,
                                                           const Placement& placement = {});
  ~VisionModel();

  const ModelConfig& config() const;

  // pixels: float32 [batch, in_chans, height, width], contiguous, already preprocessed.
  // Returns logits [batch, num_classes]. Thread-safe: concurrent calls share only immutable
  // weights.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const float> pixels, int64_t batch,
                                             int64_t height, int64_t width) const;

  // ToST's built-in interpretability: the token-to-group membership Π of every TSSA layer (for
  // each token, a distribution over the K heads), next to the logits.
  struct Explained {
    std::vector<float> logits;       // [batch, num_classes]
    std::vector<float> membership;   // [batch, depth, K, grid_h * grid_w]
    int64_t grid_h = 0, grid_w = 0;  // the patch-token grid
  };
  absl::StatusOr<Explained> ForwardWithMembership(absl::Span<const float> pixels, int64_t batch,
                                                  int64_t height, int64_t width) const;

  // The least memory traffic of a Forward of `images` at the served resolution: every weight read
  // once, the pixels read and the logits written (activations between layers not counted, so a
  // lower bound). Benchmarks divide it by the time and the device's measured bandwidth.
  int64_t ForwardMinBytes(int64_t images) const;

 private:
  struct Impl;
  explicit VisionModel(std::unique_ptr<Impl> impl);
  absl::Status CheckInput(absl::Span<const float> pixels, int64_t batch, int64_t height,
                          int64_t width) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tost::model
