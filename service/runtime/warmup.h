// Runs every loaded model once before the server reports ready, so the first real request does
// not pay for lazy initialisation (LibTorch's kernel selection, allocator growth, page faults on
// the weights). A model whose warm-up fails is reported like a load failure.
#pragma once

#include <vector>

#include "model/nets/model_repository.h"

namespace tost::service {

// Warms each loaded model in place; a failure replaces the model's status with the error.
void WarmUpModels(std::vector<model::LoadedModel>& models);

}  // namespace tost::service
