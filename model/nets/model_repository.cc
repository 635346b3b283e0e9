#include "model/nets/model_repository.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/utf8.h"

namespace tost::model {

namespace fs = std::filesystem;

namespace {

LoadedModel LoadModelDirectoryOrFail(const std::string& dir, const ServingOptions& serving) {
  LoadedModel m;
  m.dir = dir;
  m.name = fs::path(dir).filename().string();
  if (const std::optional<size_t> bad = FirstInvalidUtf8(m.name); bad.has_value()) {
    // Names travel in UTF-8 strings (ListModels, metrics labels): this one could not be served.
    m.status = absl::InvalidArgumentError(
        absl::StrCat(dir, ": the model directory's name is not valid UTF-8 (byte ", *bad,
                     "); a model's name must be UTF-8 text, the same as config.json \"name\""));
    return m;
  }
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
  absl::StatusOr<Placement> placement = ResolvePlacement(
      serving.device, serving.dtype, m.config.serving_device, m.config.serving_dtype,
      serving.cuda_device_count, m.name, m.config.serving_dtypes);
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

// An entry of the repository that looks like a model but cannot even be examined: reported as a
// model that failed to load, so that it is seen (ListModels, the log) without stopping the others.
LoadedModel Unexaminable(const fs::path& path, const std::string& what, const std::error_code& ec) {
  LoadedModel m;
  m.dir = path.string();
  m.name = EscapeInvalidUtf8(path.filename().string());
  m.status = absl::FailedPreconditionError(EscapeInvalidUtf8(
      absl::StrCat(path.string(), ": cannot examine ", what, ": ", ec.message())));
  return m;
}

}  // namespace

LoadedModel LoadModelDirectory(const std::string& dir, const ServingOptions& serving) {
  LoadedModel m;
  try {
    m = LoadModelDirectoryOrFail(dir, serving);
  } catch (const std::exception& e) {
    // The loaders return errors as statuses; this is for what they did not foresee (memory
    // running out in a parser, say): one model fails, not the server.
    m = LoadedModel();
    m.dir = dir;
    m.name = fs::path(dir).filename().string();
    m.status = absl::InternalError(absl::StrCat(dir, ": loading failed: ", e.what()));
  }
  // Load errors quote paths and file contents; what ListModels reports must be UTF-8.
  m.name = EscapeInvalidUtf8(m.name);
  m.status = WithUtf8Message(m.status);
  return m;
}

absl::StatusOr<std::vector<LoadedModel>> LoadRepository(const std::string& repo_dir,
                                                        const ServingOptions& serving) {
  // Only the error_code overloads of std::filesystem: the throwing ones would end the process on
  // a symbolic link loop or an unreadable directory.
  std::error_code ec;
  const fs::file_status repo_status = fs::status(repo_dir, ec);
  if (ec && repo_status.type() != fs::file_type::not_found) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot examine the model repository ", repo_dir, ": ", ec.message()));
  }
  if (!fs::is_directory(repo_status)) {
    return absl::NotFoundError(absl::StrCat("model repository ", repo_dir, " is not a directory",
                                            ec ? absl::StrCat(" (", ec.message(), ")") : ""));
  }
  std::vector<std::string> dirs;
  std::vector<LoadedModel> models;
  const fs::directory_iterator end;
  fs::directory_iterator it(repo_dir, ec);
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path path = it->path();
    std::error_code entry_ec;
    const fs::file_status entry = fs::status(path, entry_ec);  // follows symbolic links
    if (entry_ec) {
      models.push_back(Unexaminable(path, "the repository entry", entry_ec));
      continue;
    }
    if (!fs::is_directory(entry)) continue;  // a stray file: not a model
    // symlink_status: a config.json that is a link (even a broken one or a loop) is still the
    // model's; reading it says what is wrong with it.
    const fs::file_status config = fs::symlink_status(path / "config.json", entry_ec);
    if (config.type() == fs::file_type::not_found) continue;  // a folder without one: not a model
    if (entry_ec) {
      models.push_back(Unexaminable(path, "its config.json", entry_ec));
    } else {
      dirs.push_back(path.string());
    }
  }
  if (ec) {
    return absl::FailedPreconditionError(EscapeInvalidUtf8(
        absl::StrCat("cannot list the model repository ", repo_dir, ": ", ec.message())));
  }
  for (const auto& d : dirs) models.push_back(LoadModelDirectory(d, serving));
  std::sort(models.begin(), models.end(),
            [](const LoadedModel& a, const LoadedModel& b) { return a.name < b.name; });
  return models;
}

}  // namespace tost::model
