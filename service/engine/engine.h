// The serving engine: the models of a repository as the front ends see them, one dynamic batcher
// per classifier, one generation scheduler per language model, the session store and the session
// codec, and the drain state. It knows models only through service/engine/model_interface.h, and
// links neither gRPC nor LibTorch (its CMake target enforces it): the front ends (service/api)
// translate protocols into engine calls, service/runtime loads the LibTorch models behind the
// interfaces, and service/server.cc wires them together.
//
// Thread-safety: every method may be called from any thread once Create() has returned.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/config/config.h"
#include "service/engine/clock.h"
#include "service/engine/dynamic_batcher.h"
#include "service/engine/generation_scheduler.h"
#include "service/engine/model_interface.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/session_codec.h"
#include "service/engine/session_store.h"
#include "service/engine/tenant_ledger.h"

namespace tost::service {

// One model of the repository, served or not.
struct ModelEntry {
  std::string name;
  absl::Status load_status;                     // OK: it serves; else why it does not
  model::ModelConfig config;                    // valid when its config.json parsed
  const ClassifierModel* classifier = nullptr;  // tost_vision; not owned, outlives the engine
  const GenerativeModel* generator = nullptr;   // tost_lm; not owned, outlives the engine
  std::string weights_sha256;                   // generators: 32 raw bytes, for session blobs
  model::Placement placement;                   // where it runs (valid when it loaded)
};

// What a session store backend is built from: the codec and model identities to seal the states
// it keeps outside this process (a shared store holds blobs as ExportSession writes them, so a
// compromised store cannot inject state), the clock, and the budget options.
struct SessionStoreContext {
  SessionStoreOptions options;
  const SessionCodec* codec = nullptr;  // the engine's; outlives the store
  std::function<absl::StatusOr<ModelIdentity>(const std::string& model)> identity;
  Clock* clock = nullptr;
};
using SessionStoreFactory =
    std::function<absl::StatusOr<std::unique_ptr<SessionStore>>(SessionStoreContext context)>;

struct EngineOptions {
  GenerationSchedulerOptions generation;  // per language model (observer: shared, not owned)
  DynamicBatcherOptions batching;         // per classifier; model_name is filled in per model
  SessionStoreOptions sessions;
  // Builds the session store; null: MemorySessionStore (this process's memory).
  SessionStoreFactory session_store;
  // Builds a tier of the prefix-state cache shared by replicas (sealed with the engine's codec);
  // null: none.
  std::function<absl::StatusOr<std::unique_ptr<PrefixCacheTier>>(const SessionCodec* codec)>
      prefix_cache_tier;
  // One cache for all language models (its byte bound is shared); every key names its model.
  PrefixCacheOptions prefix_cache;
  // Per language model: the compiled-constraint cache and its compile-time bound.
  ConstraintCompilerOptions constraints;
  // Tenants' weights and quotas, and the priority range, for every language model.
  TenantOptions tenants;
  // false: no scheduler or batcher threads; tests drive them (StepOnce, ProcessReady).
  bool start_threads = true;
};

// What ServerStatus and the metrics read.
struct GeneratorStats {
  std::string model;
  GenerationSchedulerStats scheduler;
  int32_t max_active = 0;
  int32_t max_queued = 0;
  int64_t state_bytes_per_session = 0;
  PrefixCacheModelStats prefix_cache;
  ConstraintCacheStats constraints;
};
struct ClassifierStats {
  std::string model;
  DynamicBatcherStats batcher;
  int64_t max_queue_size = 0;
};
struct EngineStats {
  bool draining = false;
  std::vector<GeneratorStats> generators;    // by model name
  std::vector<ClassifierStats> classifiers;  // by model name
  SessionStoreStats sessions;
  int64_t session_budget_bytes = 0;  // SessionStoreOptions::max_state_bytes
  int64_t max_sessions = 0;
  int64_t prefix_cache_budget_bytes = 0;  // PrefixCacheOptions::max_bytes (0: disabled)
  std::vector<TenantUsage> tenants;       // the configured tenants, then kOtherTenant
};

// A served classifier and its dynamic batcher: what one Engine::Classifier() lookup gives a front
// end for the whole of a request. Cheap to copy; valid while the engine lives.
class ServedClassifier {
 public:
  const ClassifierModel& model() const { return *model_; }
  const model::ModelConfig& config() const { return model_->config(); }

  // Classification through the model's dynamic batcher, in two steps so that a full queue is
  // refused (RESOURCE_EXHAUSTED with a retry hint; UNAVAILABLE while draining) before the caller
  // decodes anything: Reserve a place for `images`, then Classify with it, which waits for the
  // batch and returns this request's logits [images, num_classes].
  absl::StatusOr<DynamicBatcher::Reservation> Reserve(int64_t images) const;
  absl::StatusOr<std::vector<float>> Classify(DynamicBatcher::Reservation reservation,
                                              std::vector<float> pixels, int64_t images,
                                              absl::Time deadline) const;

 private:
  friend class Engine;
  ServedClassifier(const ClassifierModel* model, DynamicBatcher* batcher)
      : model_(model), batcher_(batcher) {}

  const ClassifierModel* model_;
  DynamicBatcher* batcher_;
};

class Engine {
 public:
  // Builds a batcher per served classifier and a scheduler per served language model.
  // INVALID_ARGUMENT for invalid options, two models of one name, a served model with no
  // interface (or two), or a generator without its weights hash.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::vector<ModelEntry> models,
                                                        EngineOptions options, SessionCodec codec,
                                                        Clock* clock);
  // Shutdown().
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Every model of the repository, served or not, in repository order.
  const std::vector<ModelEntry>& models() const { return models_; }
  // NOT_FOUND for a name the repository does not hold (listing the ones it does).
  absl::StatusOr<const ModelEntry*> Find(const std::string& name) const;
  // NOT_FOUND as Find; FAILED_PRECONDITION for a model that failed to load (with its error);
  // INVALID_ARGUMENT for a model of the other kind (naming the RPC it needs).
  absl::StatusOr<ServedClassifier> Classifier(const std::string& name) const;
  absl::StatusOr<GenerationScheduler*> Scheduler(const std::string& name) const;
  // The identity a session blob of language model `name` must match.
  absl::StatusOr<ModelIdentity> Identity(const std::string& name) const;
  // Both, from one lookup (what a Generate admission needs).
  struct ServedGenerator {
    GenerationScheduler* scheduler = nullptr;
    ModelIdentity identity;
  };
  absl::StatusOr<ServedGenerator> Generator(const std::string& name) const;

  // A fresh per-sequence constraint for a generation on language model `name`, compiled (or found
  // in the model's cache) on the calling thread, in one of `caller`'s compile slots (the request's
  // owner): errors as ConstraintCompiler::Compile's, and Generator()'s for the name.
  absl::StatusOr<std::unique_ptr<TokenConstraint>> CompileConstraint(
      const std::string& name, const structured::Constraint& spec, const std::string& caller) const;

  SessionStore& sessions() { return *sessions_; }
  // Tenants' weights, quotas and usage (what admission checks a call's priority and sessions
  // against).
  TenantLedger& tenants() const { return *tenants_; }
  const SessionCodec& codec() const { return codec_; }
  // The clock its schedulers time jobs by (a front end's timings must share it).
  Clock* clock() const { return clock_; }

  // The first half of a drain: new generations are refused (UNAVAILABLE), queued classification
  // requests run now and new ones are refused; admitted generations run on.
  void StopAdmitting();
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  // Generations admitted and not finished, over all models.
  int32_t generations_in_flight() const;
  // Ends every generation (FinishReason kDrained, with its resumable state) and fails queued
  // classification requests. Idempotent.
  void Shutdown();

  EngineStats Stats() const;
  // Removes sessions idle past their timeout (the server calls it periodically).
  void ReapIdleSessions() { sessions_->ReapIdle(); }

 private:
  Engine(std::vector<ModelEntry> models, PrefixCacheOptions prefix_cache, SessionCodec codec);
  absl::StatusOr<const ModelEntry*> FindServed(const std::string& name) const;

  const std::vector<ModelEntry> models_;
  std::map<std::string, size_t> by_name_;
  // First: the shared session store and the shared prefix tier seal with it.
  const SessionCodec codec_;
  Clock* clock_ = nullptr;
  // Before the cache that offers it entries, and the schedulers that fill the cache.
  std::unique_ptr<PrefixCacheTier> prefix_tier_;
  // Before the schedulers: they use it until they are destroyed.
  PrefixStateCache prefix_cache_;
  std::unique_ptr<TenantLedger> tenants_;
  std::map<std::string, std::unique_ptr<GenerationScheduler>> schedulers_;
  std::map<std::string, std::unique_ptr<DynamicBatcher>> batchers_;
  std::map<std::string, std::unique_ptr<ConstraintCompiler>> constraints_;
  std::unique_ptr<SessionStore> sessions_;
  std::atomic<bool> draining_{false};
};

}  // namespace tost::service
