// The models a server hosts, loaded from its repository, looked up by name. Immutable after
// construction, so lookups need no lock.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_repository.h"

namespace tost::service {

class ModelRegistry {
 public:
  explicit ModelRegistry(std::vector<model::LoadedModel> models);

  // NOT_FOUND for an unknown name (listing the served ones), FAILED_PRECONDITION for a model that
  // failed to load (with its load error).
  absl::StatusOr<const model::VisionModel*> Vision(const std::string& name) const;
  absl::StatusOr<const model::LanguageModel*> Language(const std::string& name) const;

  const std::vector<model::LoadedModel>& models() const { return models_; }

 private:
  absl::StatusOr<const model::LoadedModel*> Find(const std::string& name) const;

  std::vector<model::LoadedModel> models_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace tost::service
