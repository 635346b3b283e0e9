// The LibTorch models behind the engine's model interfaces: loads a model repository (every model
// directory, a failure reported per model while the others serve), warms each model up, hashes the
// language models' weights for session blobs, and hands the engine one ModelEntry per model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/nets/model_repository.h"
#include "service/engine/engine.h"

namespace tost::service {

class LoadedRepository {
 public:
  // Loads and warms up every model of `repo_dir`. An unreadable repository is an error; a model
  // that fails to load or warm up is kept with its error.
  static absl::StatusOr<std::unique_ptr<LoadedRepository>> Load(
      const std::string& repo_dir, const model::ServingOptions& serving = {});
  ~LoadedRepository();

  // One entry per model, in repository order; the interfaces point into this object, which must
  // outlive whatever uses them (the engine). An entry's load_status is what clients read of a
  // failed load: its paths relative to the repository, no server detail; models() keeps the whole.
  std::vector<ModelEntry> Entries() const;
  const std::vector<model::LoadedModel>& models() const { return models_; }

 private:
  class Classifier;
  class Generator;
  LoadedRepository() = default;

  std::string repo_dir_;
  std::vector<model::LoadedModel> models_;
  std::vector<std::unique_ptr<Classifier>> classifiers_;  // [i]: models_[i]'s, or null
  std::vector<std::unique_ptr<Generator>> generators_;    // [i]: models_[i]'s, or null
  std::vector<std::string> weights_sha256_;               // [i]: language models only
};

}  // namespace tost::service
