#include "model/model_repository.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace tost::model {

namespace fs = std::filesystem;

LoadedModel LoadModelDirectory(const std::string& dir, const ServingOptions& serving) {
  LoadedModel m;
  m.dir = dir;
  m.name = fs::path(dir).filename().string();
  auto config = LoadModelConfig(dir);
  if (!config.ok()) {
    m.status = config.status();
    return m;
  }
  m.config = *std::move(config);
  if (m.config.name != m.name) {
    m.status = absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: \"name\" is \"",
                                                       m.config.name, "\" but the directory is \"",
                                                       m.name, "\"; they must match"));
    return m;
  }
  absl::StatusOr<Placement> placement =
      ResolvePlacement(serving.device, serving.dtype, m.config.serving_device,
                       m.config.serving_dtype, serving.cuda_device_count, m.name);
  if (!placement.ok()) {
    m.status = placement.status();
    return m;
  }
  m.placement = *placement;
  m.placement.decode_graphs = serving.decode_graphs;
  if (m.config.architecture == Architecture::kVision) {
    auto loaded = VisionModel::Load(dir, m.config, m.placement);
    if (loaded.ok()) {
      m.vision = *std::move(loaded);
    } else {
      m.status = loaded.status();
    }
  } else {
    auto loaded = LanguageModel::Load(dir, m.config, m.placement);
    if (loaded.ok()) {
      m.language = *std::move(loaded);
    } else {
      m.status = loaded.status();
    }
  }
  return m;
}

absl::StatusOr<std::vector<LoadedModel>> LoadRepository(const std::string& repo_dir,
                                                        const ServingOptions& serving) {
  std::error_code ec;
  if (!fs::is_directory(repo_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model repository ", repo_dir, " is not a directory"));
  }
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(repo_dir, ec)) {
    if (entry.is_directory() && fs::exists(entry.path() / "config.json"))
      dirs.push_back(entry.path().string());
  }
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot list model repository ", repo_dir, ": ", ec.message()));
  std::sort(dirs.begin(), dirs.end());
  std::vector<LoadedModel> models;
  for (const auto& d : dirs) models.push_back(LoadModelDirectory(d, serving));
  return models;
}

}  // namespace tost::model
