// Shared by the generation-engine tests: the shipped byte-level LM loaded once per process.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "model/model_repository.h"
#include "model/torch_threads.h"

namespace tost::service::testing {

inline const model::LoadedModel& ShippedLanguageModel() {
  static const model::LoadedModel* m = [] {
    // One intra-op thread: these tests run beside others on 2 cores, where OpenMP barriers spin.
    model::SetTorchThreads(1);
    auto* loaded = new model::LoadedModel(
        model::LoadModelDirectory(std::string(TOST_SOURCE_DIR) + "/models/tost-austen"));
    return loaded;
  }();
  EXPECT_TRUE(m->status.ok()) << m->status;
  return *m;
}

}  // namespace tost::service::testing
