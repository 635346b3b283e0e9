#include "service/serving_core.h"

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"

namespace tost::service {

absl::StatusOr<GenerationScheduler*> ServingCore::Scheduler(const std::string& name) const {
  TOST_RETURN_IF_ERROR(registry.Language(name).status());
  auto it = schedulers.find(name);
  if (it == schedulers.end()) {
    return absl::InternalError(absl::StrCat("language model \"", name, "\" has no generation scheduler"));
  }
  return it->second.get();
}

absl::StatusOr<ModelIdentity> ServingCore::Identity(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const model::LanguageModel* lm, registry.Language(name));
  auto it = weights_sha256.find(name);
  if (it == weights_sha256.end()) return absl::InternalError(absl::StrCat("no weights hash for model \"", name, "\""));
  return ModelIdentity{&lm->config(), it->second};
}

}  // namespace tost::service
