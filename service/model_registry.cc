#include "service/model_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/status_macros.h"

namespace tost::service {

ModelRegistry::ModelRegistry(std::vector<model::LoadedModel> models) : models_(std::move(models)) {
  for (size_t i = 0; i < models_.size(); ++i) by_name_[models_[i].name] = i;
}

absl::StatusOr<const model::LoadedModel*> ModelRegistry::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::vector<std::string> names;
    for (const auto& m : models_) names.push_back(m.name);
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" is not served; models: [",
                                            absl::StrJoin(names, ", "), "]"));
  }
  const model::LoadedModel& m = models_[it->second];
  if (!m.status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model \"", name, "\" failed to load: ", m.status.message()));
  }
  return &m;
}

absl::StatusOr<const model::VisionModel*> ModelRegistry::Vision(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const model::LoadedModel* m, Find(name));
  if (m->vision == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model \"", name, "\" is a ",
                                                   model::ArchitectureName(m->config.architecture),
                                                   " model; Classify needs a tost_vision model"));
  }
  return m->vision.get();
}

absl::StatusOr<const model::LanguageModel*> ModelRegistry::Language(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const model::LoadedModel* m, Find(name));
  if (m->language == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model \"", name, "\" is a ",
                                                   model::ArchitectureName(m->config.architecture),
                                                   " model; Generate needs a tost_lm model"));
  }
  return m->language.get();
}

}  // namespace tost::service
