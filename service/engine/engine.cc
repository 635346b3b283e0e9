#include "service/engine/engine.h"
#include "service/engine/client_text.h"
#include "service/engine/memory_session_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"

namespace tost::service {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::vector<ModelEntry> models,
                                                       EngineOptions options, SessionCodec codec,
                                                       Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("Engine needs a clock");
  TOST_RETURN_IF_ERROR(ValidateGenerationSchedulerOptions(options.generation));
  TOST_RETURN_IF_ERROR(ValidateSessionStoreOptions(options.sessions));
  TOST_RETURN_IF_ERROR(ValidatePrefixCacheOptions(options.prefix_cache));
  TOST_RETURN_IF_ERROR(ValidateConstraintCompilerOptions(options.constraints));
  TOST_RETURN_IF_ERROR(ValidateTenantOptions(options.tenants));
  for (const ModelEntry& m : models) {
    if (!m.load_status.ok()) continue;
    if ((m.classifier == nullptr) == (m.generator == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model \"", m.name, "\" is served and needs exactly one of a classifier or a generator"));
    }
    if (m.generator != nullptr && m.weights_sha256.size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "language model \"", m.name, "\" needs the 32-byte SHA-256 of its weights, got ",
          m.weights_sha256.size(), " bytes"));
    }
  }
  std::unique_ptr<Engine> engine(
      new Engine(std::move(models), options.prefix_cache, std::move(codec)));
  engine->clock_ = clock;
  engine->tenants_ = std::make_unique<TenantLedger>(std::move(options.tenants), clock);
  options.generation.tenants = engine->tenants_.get();
  options.sessions.owner_quota = [ledger = engine->tenants_.get()](
                                     const std::string& owner, int64_t sessions_held,
                                     int64_t bytes_held, int64_t new_bytes) {
    return ledger->CheckSessions(owner, sessions_held, bytes_held, new_bytes);
  };
  options.sessions.owner_limits = [ledger = engine->tenants_.get()](const std::string& owner) {
    OwnerSessionLimits limits;
    if (const TenantSpec* t = ledger->options().table.Find(owner); t != nullptr) {
      limits.max_sessions = t->quotas.max_sessions;
      limits.max_bytes = t->quotas.max_session_bytes;
    }
    return limits;
  };
  if (options.prefix_cache_tier && engine->prefix_cache_.enabled()) {
    TOST_ASSIGN_OR_RETURN(engine->prefix_tier_, options.prefix_cache_tier(&engine->codec_));
    engine->prefix_cache_.SetSharedTier(engine->prefix_tier_.get());
  }
  if (options.session_store) {
    const Engine* self = engine.get();
    TOST_ASSIGN_OR_RETURN(
        engine->sessions_,
        options.session_store(SessionStoreContext{
            .options = options.sessions,
            .codec = &self->codec_,
            .identity = [self](const std::string& model) { return self->Identity(model); },
            .clock = clock}));
  } else {
    engine->sessions_ = std::make_unique<MemorySessionStore>(options.sessions, clock);
  }
  if (engine->by_name_.size() != engine->models_.size()) {
    return absl::InvalidArgumentError("two models of the repository share one name");
  }
  for (const ModelEntry& m : engine->models_) {
    if (!m.load_status.ok()) continue;
    if (m.generator != nullptr) {
      TOST_ASSIGN_OR_RETURN(auto scheduler,
                            GenerationScheduler::Create(
                                *m.generator, options.generation, clock,
                                PrefixCacheBinding{&engine->prefix_cache_, m.weights_sha256}));
      if (options.start_threads) scheduler->Start();
      engine->schedulers_[m.name] = std::move(scheduler);
      engine->constraints_[m.name] =
          std::make_unique<ConstraintCompiler>(*m.generator, options.constraints);
    } else {
      DynamicBatcherOptions batching = options.batching;
      batching.model_name = m.name;
      if (!options.start_threads) batching.start_worker_thread = false;
      const ClassifierModel* classifier = m.classifier;
      TOST_ASSIGN_OR_RETURN(engine->batchers_[m.name],
                            DynamicBatcher::Create(
                                batching,
                                [classifier](const BatchInput& in) {
                                  return classifier->Classify(
                                      in.ConcatenatedInput(), in.num_images(),
                                      in.resolution().height, in.resolution().width);
                                },
                                clock));
    }
  }
  return engine;
}

Engine::Engine(std::vector<ModelEntry> models, PrefixCacheOptions prefix_cache, SessionCodec codec)
    : models_(std::move(models)), codec_(std::move(codec)), prefix_cache_(prefix_cache) {
  for (size_t i = 0; i < models_.size(); ++i) by_name_[models_[i].name] = i;
}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<const ModelEntry*> Engine::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::vector<std::string> names;
    for (const auto& m : models_) names.push_back(m.name);
    return absl::NotFoundError(absl::StrCat("model ", QuoteClientText(name),
                                            " is not served; models: [", absl::StrJoin(names, ", "),
                                            "]"));
  }
  return &models_[it->second];
}

absl::StatusOr<const ModelEntry*> Engine::FindServed(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const ModelEntry* m, Find(name));
  if (!m->load_status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model \"", name, "\" failed to load: ", m->load_status.message()));
  }
  return m;
}

absl::StatusOr<ServedClassifier> Engine::Classifier(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const ModelEntry* m, FindServed(name));
  if (m->classifier == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model \"", name, "\" is a ",
                                                   model::ArchitectureName(m->config.architecture),
                                                   " model; Classify needs a tost_vision model"));
  }
  return ServedClassifier(m->classifier, batchers_.at(name).get());
}

absl::StatusOr<std::unique_ptr<TokenConstraint>> Engine::CompileConstraint(
    const std::string& name, const structured::Constraint& spec, const std::string& caller) const {
  TOST_RETURN_IF_ERROR(Scheduler(name).status());
  return constraints_.at(name)->Compile(spec, caller);
}

absl::StatusOr<GenerationScheduler*> Engine::Scheduler(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(ServedGenerator served, Generator(name));
  return served.scheduler;
}

absl::StatusOr<ModelIdentity> Engine::Identity(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(ServedGenerator served, Generator(name));
  return std::move(served.identity);
}

absl::StatusOr<Engine::ServedGenerator> Engine::Generator(const std::string& name) const {
  TOST_ASSIGN_OR_RETURN(const ModelEntry* m, FindServed(name));
  if (m->generator == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model \"", name, "\" is a ",
                                                   model::ArchitectureName(m->config.architecture),
                                                   " model; Generate needs a tost_lm model"));
  }
  return ServedGenerator{schedulers_.at(name).get(),
                         ModelIdentity{&m->generator->config(), m->weights_sha256}};
}

absl::StatusOr<DynamicBatcher::Reservation> ServedClassifier::Reserve(int64_t images) const {
  return batcher_->Reserve(images);
}

absl::StatusOr<std::vector<float>> ServedClassifier::Classify(
    DynamicBatcher::Reservation reservation, std::vector<float> pixels, int64_t images,
    absl::Time deadline) const {
  const model::VisionConfig& v = model_->config().vision;
  absl::Notification done;
  absl::StatusOr<std::vector<float>> result;
  BatchRequest request;
  request.resolution = {v.image_height, v.image_width};
  request.batch = images;
  request.input = std::move(pixels);
  request.deadline = deadline;
  request.done = [&](absl::StatusOr<std::vector<float>> rows) {
    result = std::move(rows);
    done.Notify();
  };
  TOST_RETURN_IF_ERROR(batcher_->Submit(std::move(reservation), std::move(request)));
  done.WaitForNotification();
  return result;
}

void Engine::StopAdmitting() {
  draining_.store(true, std::memory_order_relaxed);
  sessions_->StopAdding();
  for (auto& [name, scheduler] : schedulers_) scheduler->StopAdmitting();
  for (auto& [name, batcher] : batchers_) batcher->Shutdown(ShutdownMode::kFinishQueued);
}

int32_t Engine::generations_in_flight() const {
  int32_t n = 0;
  for (const auto& [name, scheduler] : schedulers_) n += scheduler->in_flight();
  return n;
}

void Engine::Shutdown() {
  draining_.store(true, std::memory_order_relaxed);
  sessions_->StopAdding();
  for (auto& [name, scheduler] : schedulers_) scheduler->Shutdown();
  for (auto& [name, batcher] : batchers_) batcher->Shutdown(ShutdownMode::kFailQueued);
}

EngineStats Engine::Stats() const {
  EngineStats out;
  out.draining = draining();
  for (const auto& [name, scheduler] : schedulers_) {
    GeneratorStats g;
    g.model = name;
    g.scheduler = scheduler->stats();
    g.max_active = scheduler->options().max_active_jobs;
    g.max_queued = scheduler->options().max_queued_jobs;
    g.state_bytes_per_session = static_cast<int64_t>(scheduler->NewState({}).ByteSize());
    g.prefix_cache = prefix_cache_.stats(name);
    if (auto it = constraints_.find(name); it != constraints_.end()) {
      g.constraints = it->second->stats();
    }
    out.generators.push_back(std::move(g));
  }
  for (const auto& [name, batcher] : batchers_) {
    out.classifiers.push_back({name, batcher->stats(), batcher->options().max_queue_size});
  }
  out.sessions = sessions_->stats();
  out.session_budget_bytes = sessions_->options().max_state_bytes;
  out.max_sessions = sessions_->options().max_sessions;
  out.prefix_cache_budget_bytes = prefix_cache_.options().max_bytes;
  out.tenants = tenants_->Usage();
  return out;
}

}  // namespace tost::service
