// Loads every model of a repository directory (<repo>/<name>/config.json + model.safetensors).
// A model that fails to load is kept with its error so the server can report it while the others
// serve.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "model/nets/language_model.h"
#include "model/nets/vision_model.h"

namespace tost::model {

// Where the repository's models run: the server's --device/--dtype, each model's config.json
// "serving" object overriding them (model/config/device.h).
struct ServingOptions {
  DeviceSpec device;  // auto
  ComputeDtype dtype = ComputeDtype::kFloat32;
  int cuda_device_count = 0;  // what the process sees (CudaDeviceCount())
  bool decode_graphs = true;  // Placement::decode_graphs for every CUDA model
};

struct LoadedModel {
  std::string name;  // the directory name
  std::string dir;
  absl::Status status;  // OK when loaded
  ModelConfig config;   // valid when the config parsed
  Placement placement;  // valid when loaded
  std::unique_ptr<VisionModel> vision;
  std::unique_ptr<LanguageModel> language;
};

// Loads one model directory. A model whose placement cannot be had (CUDA asked for and absent)
// fails alone, with that reason. Never throws: every failure is the entry's status, naming the
// path and the reason, with its message (and the name) made valid UTF-8.
LoadedModel LoadModelDirectory(const std::string& dir, const ServingOptions& serving = {});

// Every sub-directory of `repo_dir` holding a config.json (of any kind: a config.json that is not
// a regular file fails that model), sorted by name. An entry that cannot be examined (a symbolic
// link loop, a directory that cannot be searched) is listed as a model that failed to load, with
// the reason. NOT_FOUND if the repository itself is missing or not a directory,
// FAILED_PRECONDITION if it cannot be examined or listed; per-model failures are in each entry's
// status.
absl::StatusOr<std::vector<LoadedModel>> LoadRepository(const std::string& repo_dir,
                                                        const ServingOptions& serving = {});

}  // namespace tost::model
