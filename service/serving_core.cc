#include "service/serving_core.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "model/status_macros.h"

namespace tost::service {

absl::StatusOr<GenerationScheduler*> ServingCore::Scheduler(const std::string& name) const {
  TOST_RETURN_IF_ERROR(registry.Language(name).status());
  auto it = schedulers.find(name);
  if (it == schedulers.end()) {
    return absl::InternalError(
        absl::StrCat("language model \"", name, "\" has no generation scheduler"));
  }
  return it->second.get();
}

absl::StatusOr<ModelIdentity> ServingCore::Identity(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const model::LanguageModel* lm, registry.Language(name));
  auto it = weights_sha256.find(name);
  if (it == weights_sha256.end())
    return absl::InternalError(absl::StrCat("no weights hash for model \"", name, "\""));
  return ModelIdentity{&lm->config(), it->second};
}

absl::StatusOr<DynamicBatcher::Slot> ServingCore::ReserveClassification(const std::string& model,
                                                                        int64_t images) const {
  TOST_RETURN_IF_ERROR(registry.Vision(model).status());
  auto it = batchers.find(model);
  if (it == batchers.end())
    return absl::InternalError(absl::StrCat("vision model \"", model, "\" has no batcher"));
  return it->second->Reserve(images);
}

absl::StatusOr<std::vector<float>> ServingCore::Classify(const std::string& model,
                                                         DynamicBatcher::Slot slot,
                                                         std::vector<float> pixels, int64_t images,
                                                         absl::Time deadline) const {
  TOST_ASSIGN_OR_RETURN(const model::VisionModel* vm, registry.Vision(model));
  DynamicBatcher& batcher = *batchers.at(model);
  absl::Notification done;
  absl::StatusOr<std::vector<float>> result;
  BatchRequest request;
  request.resolution = {vm->config().vision.image_height, vm->config().vision.image_width};
  request.batch = images;
  request.input = std::move(pixels);
  request.deadline = deadline;
  request.done = [&](absl::StatusOr<std::vector<float>> rows) {
    result = std::move(rows);
    done.Notify();
  };
  TOST_RETURN_IF_ERROR(batcher.Submit(std::move(slot), std::move(request)));
  done.WaitForNotification();
  return result;
}

}  // namespace tost::service
