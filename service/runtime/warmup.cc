#include "service/runtime/warmup.h"

#include "absl/strings/str_cat.h"
#include "base/error_detail.h"

namespace tost::service {

void WarmUpModels(std::vector<model::LoadedModel>& models) {
  for (auto& m : models) {
    if (!m.status.ok()) continue;
    absl::Status status;
    if (m.vision != nullptr) {
      const model::VisionConfig& v = m.config.vision;
      const std::vector<float> zeros(
          static_cast<size_t>(v.in_chans * v.image_height * v.image_width), 0.f);
      status = m.vision->Forward(zeros, 1, v.image_height, v.image_width).status();
    } else if (m.language != nullptr) {
      model::SequenceState s = m.language->NewSequence();
      const int32_t token = 0;
      status = m.language->Prefill(absl::MakeConstSpan(&token, 1), s).status();
      model::SequenceState* seqs[] = {&s};
      if (status.ok()) status = m.language->Step(absl::MakeConstSpan(&token, 1), seqs).status();
    }
    if (!status.ok()) {
      m.status = WithMessage(status, absl::StrCat("warm-up failed: ", status.message()));
      m.vision.reset();
      m.language.reset();
    }
  }
}

}  // namespace tost::service
