// What the request handlers share: the models, one generation scheduler per language model, the
// session store and the session codec, the authenticator and the drain flag. Owned by Server.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "service/auth.h"
#include "service/dynamic_batcher.h"
#include "service/generation_scheduler.h"
#include "service/model_registry.h"
#include "service/session_codec.h"
#include "service/session_store.h"

namespace tost::service {

struct ServingCore {
  ServingCore(const ModelRegistry& registry, SessionStoreOptions session_options,
              SessionCodec codec, Authenticator auth, Clock* clock)
      : registry(registry),
        sessions(session_options, clock),
        codec(std::move(codec)),
        auth(std::move(auth)) {}

  // The scheduler of language model `name`; NOT_FOUND / FAILED_PRECONDITION / INVALID_ARGUMENT as
  // ModelRegistry::Language.
  absl::StatusOr<GenerationScheduler*> Scheduler(const std::string& name) const;
  // Name, SHA-256 of the weights and config of a served language model, for the session codec.
  absl::StatusOr<ModelIdentity> Identity(const std::string& name) const;

  // Classification through the model's dynamic batcher. Reserve() first, before decoding any
  // image, so a full queue is refused (RESOURCE_EXHAUSTED with a retry hint) before any work;
  // then Classify() with the reserved place: it waits for the batch and returns this request's
  // logits [batch, num_classes].
  absl::StatusOr<DynamicBatcher::Slot> ReserveClassification(const std::string& model,
                                                             int64_t images) const;
  absl::StatusOr<std::vector<float>> Classify(const std::string& model, DynamicBatcher::Slot slot,
                                              std::vector<float> pixels, int64_t images,
                                              absl::Time deadline) const;

  const ModelRegistry& registry;
  std::map<std::string, std::unique_ptr<GenerationScheduler>> schedulers;
  std::map<std::string, std::unique_ptr<DynamicBatcher>> batchers;  // per vision model
  std::map<std::string, std::string> weights_sha256;
  SessionStore sessions;
  SessionCodec codec;
  Authenticator auth;
  std::atomic<bool> draining{false};
};

}  // namespace tost::service
