#include "service/observability/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/server_context.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "model/device/device_memory.h"
#include "proto/grpc_code_name.h"
#include "service/api/before_handler.h"
#include "service/api/grpc_status.h"
#include "service/engine/engine.h"
#include "service/observability/logging.h"
#include "service/observability/process_memory.h"
#include "service/observability/serving_protocol_metrics.h"
#include "service/observability/trace_context.h"

namespace tost::service {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::ClientMetric;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Bucket upper bounds, in the family's base unit, suited to what each one measures.
// Whole RPCs: a sub-millisecond status call up to a long generation stream.
const Histogram::BucketBoundaries kRequestBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
// Waiting for a classification batch: bounded by --max_queue_delay_us (2 ms by default) unless the
// worker is saturated.
const Histogram::BucketBoundaries kQueueBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
// One batched forward pass.
const Histogram::BucketBoundaries kComputeBuckets = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                     0.1,    0.2,   0.5,   1,     2,    5};
// A step's masks: tens of microseconds for a few byte-vocabulary rows, milliseconds for many rows
// of a large vocabulary.
const Histogram::BucketBoundaries kMaskBuckets = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025};
// Images per classification batch, sequences per decode step (powers of two up to 256).
const Histogram::BucketBoundaries kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256};
// Submit to first token: queueing plus prefill.
const Histogram::BucketBoundaries kTtftBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1,     2.5,  5,     10};
// Between two tokens of one stream: one decode step (plus a prefill chunk at most).
const Histogram::BucketBoundaries kItlBuckets = {0.00025, 0.0005, 0.001, 0.002, 0.003,
                                                 0.005,   0.0075, 0.01,  0.015, 0.02,
                                                 0.05,    0.1,    0.25,  0.5,   1};

constexpr std::array<const char*, 4> kRejectionReasons = {"queue_full", "sessions_full", "draining",
                                                          "unauthenticated"};

// Codes that mean "refused before any work" (the log level of such calls is a warning).
bool IsRefusalCode(grpc::StatusCode code) {
  return code == grpc::StatusCode::RESOURCE_EXHAUSTED || code == grpc::StatusCode::UNAVAILABLE ||
         code == grpc::StatusCode::UNAUTHENTICATED;
}

// "/pkg.Service/Method" → "Method" when the method belongs to a service this binary knows (its
// generated descriptors, or the health service, which has none); "other" for anything a client
// made up, so the label stays bounded.
std::string RpcLabel(const char* method) {
  if (method == nullptr) return "other";
  const absl::string_view path(method);
  if (path.size() < 3 || path[0] != '/') return "other";
  const size_t slash = path.find('/', 1);
  if (slash == absl::string_view::npos) return "other";
  const std::string service(path.substr(1, slash - 1));
  const std::string name(path.substr(slash + 1));
  if (service == "grpc.health.v1.Health")
    return name == "Check" || name == "Watch" ? name : "other";
  const auto* desc = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  return desc != nullptr && desc->FindMethodByName(name) != nullptr ? name : "other";
}

ClientMetric GaugeSample(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

ClientMetric CounterSample(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  return m;
}

MetricFamily MakeFamily(std::string name, std::string help, MetricType type,
                        std::vector<ClientMetric> metrics) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  f.metric = std::move(metrics);
  return f;
}

// The families read from their owners at scrape time.
class ScrapeTimeCollector final : public prometheus::Collectable {
 public:
  void Watch(const Engine* engine) {
    absl::MutexLock lock(&mu_);
    engine_ = engine;
  }
  void WatchAdmission(const HandlerPool* stateless, const HandlerPool* store) {
    absl::MutexLock lock(&mu_);
    stateless_admission_ = stateless;
    store_admission_ = store;
  }
  void WatchRecords(const RecordStore* records) {
    absl::MutexLock lock(&mu_);
    records_ = records;
  }
  void ExportVllmNames(bool on) { vllm_names_.store(on, std::memory_order_relaxed); }

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    out.push_back(MakeFamily("tost_process_resident_memory_bytes",
                             "Resident set size of the server process", MetricType::Gauge,
                             {GaugeSample(static_cast<double>(ResidentMemoryBytes()))}));
    const std::vector<model::DeviceMemoryStats> devices = model::CudaDeviceMemory();
    if (!devices.empty()) {
      std::vector<ClientMetric> allocated, reserved;
      for (const auto& d : devices) {
        const std::vector<ClientMetric::Label> labels = {
            {"device", absl::StrCat("cuda:", d.device)}};
        allocated.push_back(GaugeSample(static_cast<double>(d.allocated_bytes), labels));
        reserved.push_back(GaugeSample(static_cast<double>(d.reserved_bytes), labels));
      }
      out.push_back(
          MakeFamily("tost_device_memory_allocated_bytes",
                     "CUDA memory held by live tensors (LibTorch caching allocator), per device",
                     MetricType::Gauge, std::move(allocated)));
      out.push_back(MakeFamily("tost_device_memory_reserved_bytes",
                               "CUDA memory the caching allocator holds from the driver (allocated "
                               "+ cached), per device",
                               MetricType::Gauge, std::move(reserved)));
    }
    absl::MutexLock lock(&mu_);
    std::vector<ClientMetric> admissions;
    for (const auto& [pool, name] :
         {std::pair{stateless_admission_, "stateless"}, std::pair{store_admission_, "store"}}) {
      if (pool == nullptr) continue;
      const HandlerPool::Load load = pool->load();
      admissions.push_back(
          GaugeSample(static_cast<double>(load.running), {{"pool", name}, {"state", "running"}}));
      admissions.push_back(
          GaugeSample(static_cast<double>(load.queued), {{"pool", name}, {"state", "queued"}}));
    }
    if (!admissions.empty()) {
      out.push_back(MakeFamily(
          "tost_admissions",
          "Calls being admitted (Generate, the OpenAI routes; on the store pool also the session "
          "RPCs and the stored responses' routes): running on a thread of their admission pool, "
          "or queued for one",
          MetricType::Gauge, std::move(admissions)));
    }
    if (records_ != nullptr) {
      // The shared store holds its records itself: this replica reports 0 there, and the store's
      // own memory is read from it (INFO memory).
      const RecordStoreStats r = records_->stats();
      out.push_back(MakeFamily("tost_response_store_records",
                               "Stored responses and conversations held in this process's memory",
                               MetricType::Gauge, {GaugeSample(static_cast<double>(r.records))}));
      out.push_back(MakeFamily(
          "tost_response_store_bytes",
          "Bytes of stored responses and conversations held in this process's memory (ids, "
          "owners, records; --response_store_max_bytes bounds it)",
          MetricType::Gauge, {GaugeSample(static_cast<double>(r.bytes))}));
      out.push_back(MakeFamily("tost_response_store_evictions_total",
                               "Stored responses and conversations evicted for room before their "
                               "TTL (least recently used)",
                               MetricType::Counter,
                               {CounterSample(static_cast<double>(r.evicted))}));
    }
    if (engine_ == nullptr) return out;
    const EngineStats stats = engine_->Stats();
    const SessionStoreStats& s = stats.sessions;
    out.push_back(MakeFamily(
        "tost_sessions", "Server-held sessions: active = generating, idle = held between calls",
        MetricType::Gauge,
        {GaugeSample(static_cast<double>(s.busy), {{"state", "active"}}),
         GaugeSample(static_cast<double>(s.sessions - s.busy), {{"state", "idle"}})}));
    out.push_back(MakeFamily(
        "tost_session_state_bytes",
        "Bytes of generation state held by all sessions (sum of GenerationState::ByteSize)",
        MetricType::Gauge, {GaugeSample(static_cast<double>(s.state_bytes))}));
    out.push_back(MakeFamily(
        "tost_session_budget_bytes", "Session state byte budget (--session_budget_bytes)",
        MetricType::Gauge, {GaugeSample(static_cast<double>(stats.session_budget_bytes))}));
    out.push_back(MakeFamily(
        "tost_session_evictions_total",
        "Sessions evicted, by reason (idle timeout or LRU for room)", MetricType::Counter,
        {CounterSample(static_cast<double>(s.evicted_idle), {{"reason", "idle"}}),
         CounterSample(static_cast<double>(s.evicted_lru), {{"reason", "lru"}})}));
    {
      // Per tenant: the configured ones by name, every other caller summed as "other", so the
      // label's values are bounded by the tenants file.
      std::vector<ClientMetric> generations, prompt, generated, window, refusals;
      for (const TenantUsage& t : stats.tenants) {
        const std::vector<ClientMetric::Label> labels = {{"tenant", t.tenant}};
        generations.push_back(GaugeSample(static_cast<double>(t.generations), labels));
        prompt.push_back(CounterSample(static_cast<double>(t.prompt_tokens), labels));
        generated.push_back(CounterSample(static_cast<double>(t.generated_tokens), labels));
        window.push_back(GaugeSample(static_cast<double>(t.window_tokens), labels));
        for (const char* quota :
             {"max_concurrent", "tokens_per_minute", "max_sessions", "max_session_bytes"}) {
          auto it = t.refusals.find(quota);
          refusals.push_back(
              CounterSample(static_cast<double>(it == t.refusals.end() ? 0 : it->second),
                            {{"tenant", t.tenant}, {"quota", quota}}));
        }
      }
      out.push_back(MakeFamily("tost_tenant_generations",
                               "Generations admitted and not finished, per tenant (configured "
                               "tenants by name, every other caller as \"other\")",
                               MetricType::Gauge, std::move(generations)));
      out.push_back(MakeFamily("tost_tenant_prompt_tokens_total",
                               "Prompt tokens of the generations admitted, per tenant",
                               MetricType::Counter, std::move(prompt)));
      out.push_back(MakeFamily("tost_tenant_generated_tokens_total", "Tokens generated, per tenant",
                               MetricType::Counter, std::move(generated)));
      out.push_back(MakeFamily("tost_tenant_window_tokens",
                               "Prompt and generated tokens in the current tokens_per_minute "
                               "window (--tenant_token_window_s), per tenant with that quota",
                               MetricType::Gauge, std::move(window)));
      out.push_back(MakeFamily("tost_tenant_quota_refusals_total",
                               "Calls refused past a tenant's quota, by quota", MetricType::Counter,
                               std::move(refusals)));
      std::vector<ClientMetric> preemptions, parked;
      for (const GeneratorStats& g : stats.generators) {
        preemptions.push_back(CounterSample(static_cast<double>(g.scheduler.preemptions_priority),
                                            {{"model", g.model}, {"reason", "priority"}}));
        preemptions.push_back(CounterSample(static_cast<double>(g.scheduler.preemptions_fair_share),
                                            {{"model", g.model}, {"reason", "fair_share"}}));
        preemptions.push_back(CounterSample(static_cast<double>(g.scheduler.displaced),
                                            {{"model", g.model}, {"reason", "queue_share"}}));
        parked.push_back(
            GaugeSample(static_cast<double>(g.scheduler.parked), {{"model", g.model}}));
      }
      out.push_back(MakeFamily(
          "tost_generation_preemptions_total",
          "Running generations parked (state kept, never recomputed) to give their slot to a "
          "lower priority value (priority) or to another tenant's share (fair_share, quota "
          "throttling included); queue_share: queued generations refused to give their queue "
          "place to another tenant's share when every place was taken",
          MetricType::Counter, std::move(preemptions)));
      out.push_back(MakeFamily("tost_generations_parked",
                               "Generations parked with their state, waiting for a slot",
                               MetricType::Gauge, std::move(parked)));
    }
    std::vector<ClientMetric> lookups, hits, shared_hits, hit_tokens, entries, bytes, evictions;
    for (const GeneratorStats& g : stats.generators) {
      const std::vector<ClientMetric::Label> labels = {{"model", g.model}};
      const PrefixCacheModelStats& p = g.prefix_cache;
      lookups.push_back(CounterSample(static_cast<double>(p.lookups), labels));
      hits.push_back(CounterSample(static_cast<double>(p.hits), labels));
      shared_hits.push_back(CounterSample(static_cast<double>(p.shared_hits), labels));
      hit_tokens.push_back(CounterSample(static_cast<double>(p.hit_tokens), labels));
      evictions.push_back(CounterSample(static_cast<double>(p.evictions), labels));
      entries.push_back(GaugeSample(static_cast<double>(p.entries), labels));
      bytes.push_back(GaugeSample(static_cast<double>(p.bytes), labels));
    }
    out.push_back(MakeFamily("tost_prefix_cache_lookups_total",
                             "Fresh-state generations that looked up the prefix-state cache",
                             MetricType::Counter, std::move(lookups)));
    out.push_back(MakeFamily("tost_prefix_cache_hits_total",
                             "Prefix-state cache lookups that found a cached prefix",
                             MetricType::Counter, std::move(hits)));
    out.push_back(MakeFamily(
        "tost_prefix_cache_shared_hits_total",
        "Prefixes fetched from the shared session store's tier into this replica's cache",
        MetricType::Counter, std::move(shared_hits)));
    out.push_back(MakeFamily("tost_prefix_cache_hit_tokens_total",
                             "Prompt tokens served from the prefix-state cache (not prefilled)",
                             MetricType::Counter, std::move(hit_tokens)));
    out.push_back(MakeFamily("tost_prefix_cache_evictions_total",
                             "Prefix-state cache entries evicted (least recently used) for room",
                             MetricType::Counter, std::move(evictions)));
    out.push_back(MakeFamily("tost_prefix_cache_entries", "Prefix-state cache entries held",
                             MetricType::Gauge, std::move(entries)));
    out.push_back(MakeFamily("tost_prefix_cache_bytes",
                             "Bytes the prefix-state cache holds (statistics, keys, bookkeeping)",
                             MetricType::Gauge, std::move(bytes)));
    out.push_back(MakeFamily(
        "tost_prefix_cache_budget_bytes", "Prefix-state cache byte budget (--prefix_cache_bytes)",
        MetricType::Gauge, {GaugeSample(static_cast<double>(stats.prefix_cache_budget_bytes))}));
    std::vector<ClientMetric> c_hits, c_compiles, c_seconds, c_timeouts, c_slot_refusals, c_running,
        c_evictions, c_entries, c_bytes;
    for (const GeneratorStats& g : stats.generators) {
      const ConstraintCacheStats& c = g.constraints;
      const std::vector<ClientMetric::Label> labels = {{"model", g.model}};
      c_hits.push_back(CounterSample(static_cast<double>(c.hits), labels));
      c_compiles.push_back(
          CounterSample(static_cast<double>(c.compiles), {{"model", g.model}, {"outcome", "ok"}}));
      c_compiles.push_back(CounterSample(static_cast<double>(c.compile_errors),
                                         {{"model", g.model}, {"outcome", "invalid"}}));
      c_compiles.push_back(CounterSample(static_cast<double>(c.stopped),
                                         {{"model", g.model}, {"outcome", "stopped"}}));
      c_compiles.push_back(CounterSample(static_cast<double>(c.worker_failures),
                                         {{"model", g.model}, {"outcome", "failed"}}));
      c_seconds.push_back(
          CounterSample(static_cast<double>(c.compile_micros_total) * 1e-6, labels));
      c_timeouts.push_back(CounterSample(static_cast<double>(c.timeouts), labels));
      c_slot_refusals.push_back(CounterSample(static_cast<double>(c.slot_refusals), labels));
      c_running.push_back(GaugeSample(static_cast<double>(c.compiles_running), labels));
      c_evictions.push_back(CounterSample(static_cast<double>(c.evictions), labels));
      c_entries.push_back(GaugeSample(static_cast<double>(c.entries), labels));
      c_bytes.push_back(GaugeSample(static_cast<double>(c.bytes), labels));
    }
    out.push_back(MakeFamily("tost_constraint_cache_hits_total",
                             "Constrained requests whose constraint was already compiled",
                             MetricType::Counter, std::move(c_hits)));
    out.push_back(MakeFamily(
        "tost_constraint_compiles_total",
        "Constraint compiles finished: ok, refused by the compiler (invalid), stopped past "
        "--constraint_compile_kill_ms or --constraint_compile_memory_mb (stopped), or whose worker "
        "failed (failed)",
        MetricType::Counter, std::move(c_compiles)));
    out.push_back(MakeFamily("tost_constraint_compile_seconds_total",
                             "Wall time of the finished constraint compiles", MetricType::Counter,
                             std::move(c_seconds)));
    out.push_back(MakeFamily("tost_constraint_compile_timeouts_total",
                             "Constrained requests refused because their compile ran past "
                             "--constraint_compile_timeout_ms",
                             MetricType::Counter, std::move(c_timeouts)));
    out.push_back(MakeFamily("tost_constraint_compile_slot_refusals_total",
                             "Constrained requests refused because no compile slot of the model "
                             "(--constraint_compile_slots) or of their caller "
                             "(--constraint_compile_slots_per_caller) freed in time",
                             MetricType::Counter, std::move(c_slot_refusals)));
    out.push_back(MakeFamily("tost_constraint_compiles_running",
                             "Constraint compiles running (each holds a compile slot)",
                             MetricType::Gauge, std::move(c_running)));
    out.push_back(MakeFamily("tost_constraint_cache_evictions_total",
                             "Compiled constraints evicted (least recently used) for room",
                             MetricType::Counter, std::move(c_evictions)));
    out.push_back(MakeFamily("tost_constraint_cache_entries", "Compiled constraints held",
                             MetricType::Gauge, std::move(c_entries)));
    out.push_back(MakeFamily("tost_constraint_cache_bytes",
                             "Bytes the compiled constraints hold (grammars and token masks)",
                             MetricType::Gauge, std::move(c_bytes)));
    std::vector<ClientMetric> depth, capacity;
    for (const ClassifierStats& c : stats.classifiers) {
      const std::vector<ClientMetric::Label> labels = {{"model", c.model},
                                                       {"workload", "classify"}};
      depth.push_back(GaugeSample(
          static_cast<double>(c.batcher.queued_requests + c.batcher.reserved_requests), labels));
      capacity.push_back(GaugeSample(static_cast<double>(c.max_queue_size), labels));
    }
    for (const GeneratorStats& g : stats.generators) {
      const std::vector<ClientMetric::Label> labels = {{"model", g.model},
                                                       {"workload", "generate"}};
      depth.push_back(GaugeSample(static_cast<double>(g.scheduler.queued), labels));
      capacity.push_back(GaugeSample(static_cast<double>(g.max_queued), labels));
    }
    // 1 while a language model's decode steps replay CUDA graphs (its ServerStatus decode_mode is
    // "cuda graphs"), 0 otherwise: on the CPU, with --cuda_graphs=false, and once graphs were
    // turned off ("eager: " and why; the log has a WARNING line saying why).
    std::vector<ClientMetric> graphs_enabled;
    for (const GeneratorStats& g : stats.generators) {
      graphs_enabled.push_back(
          GaugeSample(g.scheduler.decode_mode == "cuda graphs" ? 1 : 0, {{"model", g.model}}));
    }
    out.push_back(MakeFamily("tost_decode_graphs_enabled",
                             "1 while a language model's decode steps replay CUDA graphs, 0 when "
                             "they run eagerly (the CPU, or graphs off)",
                             MetricType::Gauge, std::move(graphs_enabled)));
    out.push_back(MakeFamily("tost_queue_depth",
                             "Requests waiting: classification requests for a batch, generations "
                             "waiting to become active",
                             MetricType::Gauge, std::move(depth)));
    out.push_back(MakeFamily("tost_queue_capacity",
                             "Queue places; more waiting requests are refused (queue_full)",
                             MetricType::Gauge, std::move(capacity)));
    for (auto& f : ServingProtocolFamilies(ServingProtocolSamples(*engine_, stats),
                                           vllm_names_.load(std::memory_order_relaxed))) {
      out.push_back(std::move(f));
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  const Engine* engine_ ABSL_GUARDED_BY(mu_) = nullptr;
  const HandlerPool* stateless_admission_ ABSL_GUARDED_BY(mu_) = nullptr;
  const HandlerPool* store_admission_ ABSL_GUARDED_BY(mu_) = nullptr;
  const RecordStore* records_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<bool> vllm_names_{false};
};

}  // namespace

absl::Status ValidateMetricsOptions(const MetricsOptions& o) {
  if (o.port < -1 || o.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port must be -1 (off), 0 (a free port) or in [1, 65535], got ", o.port));
  }
  if (o.port >= 0 && o.address.empty())
    return absl::InvalidArgumentError("--metrics_address must name an address");
  return absl::OkStatus();
}

struct Metrics::Impl {
  // The series of one model, created once so the hot paths skip the families' label lookups.
  struct ClassifySeries {
    Histogram* queue = nullptr;
    Histogram* compute = nullptr;
    Histogram* batch = nullptr;
    Counter* images = nullptr;
  };
  struct GenerateSeries {
    Histogram* batch = nullptr;
    Counter* prompt_tokens = nullptr;
    Counter* prefill_tokens = nullptr;
    Counter* generated_tokens = nullptr;
    Histogram* ttft = nullptr;
    Histogram* itl = nullptr;
    Histogram* mask = nullptr;
    Histogram* mask_wait = nullptr;
  };

  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<ScrapeTimeCollector> collector = std::make_shared<ScrapeTimeCollector>();

  Family<Counter>& requests = BuildCounter()
                                  .Name("tost_requests_total")
                                  .Help("RPCs finished, by method and gRPC status code")
                                  .Register(*registry);
  Family<Histogram>& request_duration =
      BuildHistogram()
          .Name("tost_request_duration_seconds")
          .Help("RPC duration from arrival to status (whole stream for Generate)")
          .Register(*registry);
  Family<Histogram>& queue_duration =
      BuildHistogram()
          .Name("tost_queue_duration_seconds")
          .Help("Classification: the oldest request's wait for its batch to start")
          .Register(*registry);
  Family<Histogram>& compute_duration = BuildHistogram()
                                            .Name("tost_compute_duration_seconds")
                                            .Help("Classification: one batched forward pass")
                                            .Register(*registry);
  Family<Histogram>& batch_size =
      BuildHistogram()
          .Name("tost_batch_size")
          .Help("Batch size: images per classification batch, sequences per decode step")
          .Register(*registry);
  Family<Counter>& images = BuildCounter()
                                .Name("tost_images_classified_total")
                                .Help("Images classified (successful batches)")
                                .Register(*registry);
  Family<Counter>& prompt_tokens = BuildCounter()
                                       .Name("tost_prompt_tokens_total")
                                       .Help("Prompt tokens of the generations that started")
                                       .Register(*registry);
  Family<Counter>& prefill_tokens =
      BuildCounter()
          .Name("tost_prefill_tokens_total")
          .Help("Prompt tokens fed by prefill chunks (not those the prefix-state cache served)")
          .Register(*registry);
  Family<Counter>& generated_tokens = BuildCounter()
                                          .Name("tost_generated_tokens_total")
                                          .Help("Tokens generated and sent to streams")
                                          .Register(*registry);
  Family<Histogram>& ttft = BuildHistogram()
                                .Name("tost_time_to_first_token_seconds")
                                .Help("Generate: from admission to the stream's first token")
                                .Register(*registry);
  Family<Histogram>& constraint_mask =
      BuildHistogram()
          .Name("tost_constraint_mask_seconds")
          .Help(
              "Constrained generation: computing the token masks of one decode step's rows "
              "(summed over rows)")
          .Register(*registry);
  Family<Histogram>& constraint_mask_wait =
      BuildHistogram()
          .Name("tost_constraint_mask_wait_seconds")
          .Help(
              "Constrained generation: how long a decode step's draw waited for its masks after "
              "the forward was issued")
          .Register(*registry);
  Family<Histogram>& itl = BuildHistogram()
                               .Name("tost_inter_token_latency_seconds")
                               .Help("Generate: between consecutive tokens of one stream")
                               .Register(*registry);
  Family<Counter>& http_requests =
      BuildCounter()
          .Name("tost_http_requests_total")
          .Help("HTTP front end requests answered, by route and HTTP status code")
          .Register(*registry);
  Family<Histogram>& http_request_duration =
      BuildHistogram()
          .Name("tost_http_request_duration_seconds")
          .Help("HTTP front end request duration from its complete request to its last byte")
          .Register(*registry);
  Family<Counter>& rejections = BuildCounter()
                                    .Name("tost_rejections_total")
                                    .Help("Requests refused before any work, by reason")
                                    .Register(*registry);
  // The shared session store (--session_store=redis://...): every command, its round trip, and
  // the connections remade after an error.
  Family<Counter>& store_commands =
      BuildCounter()
          .Name("tost_session_store_commands_total")
          .Help(
              "Commands sent to the shared session store, by outcome (ok: answered; error: not "
              "reached, timed out, or refused)")
          .Register(*registry);
  Family<Histogram>& store_latency =
      BuildHistogram()
          .Name("tost_session_store_command_duration_seconds")
          .Help("Round trip of each command (or pipelined batch) to the shared session store")
          .Register(*registry);
  Family<Counter>& store_reconnects = BuildCounter()
                                          .Name("tost_session_store_reconnects_total")
                                          .Help(
                                              "Connections to the shared session store made "
                                              "again after one failed")
                                          .Register(*registry);
  Counter& store_ok = store_commands.Add({{"outcome", "ok"}});
  Counter& store_error = store_commands.Add({{"outcome", "error"}});
  Histogram& store_duration = store_latency.Add(
      {}, Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                      0.05, 0.1, 0.25, 0.5, 1, 2.5});
  Counter& store_reconnect = store_reconnects.Add({});
  // The Responses API's stored responses (ResponsesObserver).
  Counter& responses_stored = BuildCounter()
                                  .Name("tost_responses_stored_total")
                                  .Help("Responses stored (store: true) by this replica")
                                  .Register(*registry)
                                  .Add({});
  Counter& responses_stored_bytes =
      BuildCounter()
          .Name("tost_responses_stored_bytes_total")
          .Help("Bytes of the response records this replica stored (state, output, input items)")
          .Register(*registry)
          .Add({});
  Counter& response_continuations =
      BuildCounter()
          .Name("tost_response_continuations_total")
          .Help("Responses that continued a stored state (previous_response_id or a conversation)")
          .Register(*registry)
          .Add({});
  Family<Counter>& previous_response_lookups =
      BuildCounter()
          .Name("tost_previous_response_lookups_total")
          .Help(
              "previous_response_id lookups: hit (found) or miss (unknown, expired, deleted, or "
              "another owner's)")
          .Register(*registry);
  Counter& previous_response_hit = previous_response_lookups.Add({{"result", "hit"}});
  Counter& previous_response_miss = previous_response_lookups.Add({{"result", "miss"}});
  Family<Gauge>& model_info =
      BuildGauge()
          .Name("tost_model_info")
          .Help("1 for each served model, with its version and execution backend")
          .Register(*registry);

  absl::Mutex mu;
  std::map<std::string, ClassifySeries, std::less<>> classify ABSL_GUARDED_BY(mu);
  std::map<std::string, GenerateSeries, std::less<>> generate ABSL_GUARDED_BY(mu);

  absl::Mutex http_mu;
  std::unique_ptr<http::HttpServer> http ABSL_GUARDED_BY(http_mu);

  // The request series of one rpc label, created on first use so that every call after the first
  // skips the families' label hashing and maps (a flood of reset streams is thousands a second).
  struct RpcSeries {
    std::string label;
    Histogram* duration = nullptr;
    std::array<std::atomic<Counter*>, 17> by_code{};  // gRPC codes 0..16
  };
  absl::Mutex rpc_mu;
  std::map<std::string, RpcSeries, std::less<>> rpc_series ABSL_GUARDED_BY(rpc_mu);
  // Method path -> its series, for the registered methods only (the label of any other path is
  // "other"), so the map stays as small as the services.
  std::map<std::string, RpcSeries*, std::less<>> method_series ABSL_GUARDED_BY(rpc_mu);

  Impl() {
    for (const char* reason : kRejectionReasons) rejections.Add({{"reason", reason}});
  }

  void Reject(const char* reason) { rejections.Add({{"reason", reason}}).Increment(); }

  // std::map never moves its values, so the pointers stay valid without the lock.
  RpcSeries* Rpc(std::string_view label) ABSL_LOCKS_EXCLUDED(rpc_mu) {
    absl::MutexLock lock(&rpc_mu);
    return RpcLocked(label);
  }

  RpcSeries* RpcLocked(std::string_view label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rpc_mu) {
    if (auto it = rpc_series.find(label); it != rpc_series.end()) return &it->second;
    const std::string name(label);
    RpcSeries& s = rpc_series[name];
    s.label = name;
    s.duration = &request_duration.Add({{"rpc", name}}, kRequestBuckets);
    return &s;
  }

  // The series of the call to `method` (its path, as gRPC gives it).
  RpcSeries* ForMethod(const char* method) ABSL_LOCKS_EXCLUDED(rpc_mu) {
    const absl::string_view path = method != nullptr ? method : "";
    {
      absl::ReaderMutexLock lock(&rpc_mu);
      if (auto it = method_series.find(path); it != method_series.end()) return it->second;
    }
    const std::string label = RpcLabel(method);
    absl::MutexLock lock(&rpc_mu);
    RpcSeries* series = RpcLocked(label);
    if (label != "other") method_series.emplace(std::string(path), series);
    return series;
  }

  // Created at its first call with that code, so only the codes that happened are exported.
  Counter& Requests(RpcSeries& series, grpc::StatusCode code) {
    const size_t i = static_cast<size_t>(code);
    if (i >= series.by_code.size())
      return requests.Add({{"rpc", series.label}, {"code", GrpcCodeName(code)}});
    Counter* counter = series.by_code[i].load(std::memory_order_acquire);
    if (counter == nullptr) {
      counter = &requests.Add({{"rpc", series.label}, {"code", GrpcCodeName(code)}});
      series.by_code[i].store(counter, std::memory_order_release);  // the same one if raced
    }
    return *counter;
  }

  void ObserveRpc(RpcSeries& series, grpc::StatusCode code, absl::Duration elapsed) {
    Requests(series, code).Increment();
    series.duration->Observe(absl::ToDoubleSeconds(elapsed));
    // Only the authenticator answers UNAUTHENTICATED, so the code is the reason; the other reasons
    // come from the components that refused (OnDropped, OnRefused, OnStoreFull), which know them.
    if (code == grpc::StatusCode::UNAUTHENTICATED) Reject("unauthenticated");
  }

  // std::map never moves its values, so the references stay valid without the lock.
  ClassifySeries& Classify(std::string_view model) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (auto it = classify.find(model); it != classify.end()) return it->second;
    const std::string name(model);
    ClassifySeries s;
    s.queue = &queue_duration.Add({{"model", name}}, kQueueBuckets);
    s.compute = &compute_duration.Add({{"model", name}}, kComputeBuckets);
    s.batch = &batch_size.Add({{"model", name}, {"workload", "classify"}}, kBatchBuckets);
    s.images = &images.Add({{"model", name}});
    return classify.emplace(name, s).first->second;
  }

  GenerateSeries& Generate(std::string_view model) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (auto it = generate.find(model); it != generate.end()) return it->second;
    const std::string name(model);
    GenerateSeries s;
    s.batch = &batch_size.Add({{"model", name}, {"workload", "generate"}}, kBatchBuckets);
    s.prompt_tokens = &prompt_tokens.Add({{"model", name}});
    s.prefill_tokens = &prefill_tokens.Add({{"model", name}});
    s.generated_tokens = &generated_tokens.Add({{"model", name}});
    s.ttft = &ttft.Add({{"model", name}}, kTtftBuckets);
    s.itl = &itl.Add({{"model", name}}, kItlBuckets);
    s.mask = &constraint_mask.Add({{"model", name}}, kMaskBuckets);
    s.mask_wait = &constraint_mask_wait.Add({{"model", name}}, kMaskBuckets);
    return generate.emplace(name, s).first->second;
  }
};

http::HttpServerOptions MetricsHttpOptions(const std::string& address, int port) {
  http::HttpServerOptions o;
  o.name = "metrics";
  o.address = address;
  o.port = port;
  o.threads = 1;  // a scrape renders in milliseconds; the others wait on nothing
  o.max_header_bytes = 8192;
  o.read_header_timeout_ms = 5'000;
  o.write_timeout_ms = 10'000;
  o.max_connections = 64;
  // Each scrape on its own connection, as Prometheus opens them: nothing to hold between scrapes.
  o.keep_alive = false;
  o.log_requests = false;  // a line per scrape would be noise
  return o;
}

absl::StatusOr<std::unique_ptr<http::HttpServer>> StartMetricsHttpServer(
    std::function<std::string()> render, http::HttpServerOptions options,
    ScrapeAuthenticator authenticate) {
  http::HttpRouter router;
  const bool is_public = !authenticate;
  router.Handle("GET", "/metrics",
                [render = std::move(render)](std::shared_ptr<http::HttpExchange> exchange) {
                  http::HttpResponse r;
                  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
                  r.body = render();
                  exchange->Respond(std::move(r));
                },
                {.is_public = is_public});
  if (authenticate) router.SetAuthenticator(std::move(authenticate));
  if (!options.error_response) {
    options.error_response = [](int status, std::string_view message) {
      http::HttpResponse r;
      r.status = status;
      r.content_type = "text/plain; charset=utf-8";
      r.body = status == 404
                   ? "metrics are at /metrics\n"
                   : absl::StrCat(absl::string_view(message.data(), message.size()), "\n");
      return r;
    };
  }
  return http::HttpServer::Start(std::move(options), std::move(router));
}

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}

Metrics::~Metrics() { StopServing(); }

absl::Status Metrics::Serve(const MetricsOptions& options, ScrapeAuthenticator authenticate) {
  impl_->collector->ExportVllmNames(options.vllm_names);
  if (options.port < 0) return absl::OkStatus();
  TOST_RETURN_IF_ERROR(ValidateMetricsOptions(options));
  absl::MutexLock lock(&impl_->http_mu);
  if (impl_->http != nullptr)
    return absl::FailedPreconditionError("the metrics endpoint is already serving");
  auto http = StartMetricsHttpServer([this] { return Render(); },
                                     MetricsHttpOptions(options.address, options.port),
                                     std::move(authenticate));
  if (!http.ok()) return http.status();
  impl_->http = std::move(*http);
  return absl::OkStatus();
}

void Metrics::StopServing() {
  std::unique_ptr<http::HttpServer> http;
  {
    absl::MutexLock lock(&impl_->http_mu);
    http = std::move(impl_->http);
  }
  http.reset();  // joins the endpoint's thread (which may be rendering) outside the lock
}

int Metrics::port() const {
  absl::MutexLock lock(&impl_->http_mu);
  return impl_->http != nullptr ? impl_->http->port() : 0;
}

void Metrics::RegisterModel(const std::string& name, const std::string& version,
                            const std::string& backend, bool generates) {
  impl_->model_info.Add({{"model", name}, {"version", version}, {"backend", backend}}).Set(1);
  if (generates) {
    impl_->Generate(name);
  } else {
    impl_->Classify(name);
  }
}

void Metrics::WatchEngine(const Engine* engine) { impl_->collector->Watch(engine); }

void Metrics::WatchAdmission(const HandlerPool* stateless, const HandlerPool* store) {
  impl_->collector->WatchAdmission(stateless, store);
}

void Metrics::ObserveRpc(std::string_view rpc, grpc::StatusCode code, absl::Duration elapsed) {
  impl_->ObserveRpc(*impl_->Rpc(rpc), code, elapsed);
}

void Metrics::OnCommand(absl::Duration latency, bool ok) {
  (ok ? impl_->store_ok : impl_->store_error).Increment();
  impl_->store_duration.Observe(absl::ToDoubleSeconds(latency));
}

void Metrics::OnReconnect() { impl_->store_reconnect.Increment(); }

void Metrics::OnResponseStored(int64_t bytes) {
  impl_->responses_stored.Increment();
  impl_->responses_stored_bytes.Increment(static_cast<double>(bytes));
}

void Metrics::OnPreviousResponseLookup(bool found) {
  (found ? impl_->previous_response_hit : impl_->previous_response_miss).Increment();
}

void Metrics::OnContinuation() { impl_->response_continuations.Increment(); }

void Metrics::WatchRecords(const RecordStore* records) { impl_->collector->WatchRecords(records); }

void Metrics::OnRequestStarted(const http::HttpRequest&) {}

void Metrics::OnRequestFinished(const http::HttpRequest& request, int status,
                                absl::Duration elapsed) {
  // Routes are the router's fixed patterns; anything unmatched shares one label.
  const std::string route = request.route.empty() ? "other" : request.route;
  impl_->http_requests.Add({{"route", route}, {"code", absl::StrCat(status)}}).Increment();
  impl_->http_request_duration.Add({{"route", route}}, kRequestBuckets)
      .Observe(absl::ToDoubleSeconds(elapsed));
  if (status == 401) impl_->Reject("unauthenticated");
}

void Metrics::OnDropped(std::string_view, BatchDropReason reason, int64_t) {
  switch (reason) {
    case BatchDropReason::kQueueFull:
      impl_->Reject("queue_full");
      break;
    case BatchDropReason::kShutdown:
      impl_->Reject("draining");
      break;
    case BatchDropReason::kDeadlineExceeded:
      break;  // accepted, then expired: not a refusal
  }
}

void Metrics::OnRefused(std::string_view, GenerationRefusal reason) {
  impl_->Reject(reason == GenerationRefusal::kQueueFull ? "queue_full" : "draining");
}

void Metrics::OnStoreFull() { impl_->Reject("sessions_full"); }

void Metrics::OnDecodeGraphsOff(std::string_view model, std::string_view decode_mode) {
  std::string_view reason = decode_mode;
  constexpr std::string_view kEager = "eager: ";
  if (reason.starts_with(kEager)) reason.remove_prefix(kEager.size());
  Log(LogLevel::kWarning, "decode graphs off: decode steps run eagerly",
      {{"model", model}, {"reason", reason}});
}

void Metrics::OnBatch(const BatchRecord& record) {
  Impl::ClassifySeries& s = impl_->Classify(record.model_name);
  s.queue->Observe(absl::ToDoubleSeconds(record.queue_delay));
  s.compute->Observe(absl::ToDoubleSeconds(record.compute_time));
  s.batch->Observe(static_cast<double>(record.images));
  if (record.code == absl::StatusCode::kOk) s.images->Increment(static_cast<double>(record.images));
}

void Metrics::OnStep(const GenerationStepRecord& record) {
  Impl::GenerateSeries& s = impl_->Generate(record.model);
  if (record.decode_batch > 0) s.batch->Observe(record.decode_batch);
  if (record.prompt_tokens_started > 0)
    s.prompt_tokens->Increment(static_cast<double>(record.prompt_tokens_started));
  if (record.prefill_tokens > 0)
    s.prefill_tokens->Increment(static_cast<double>(record.prefill_tokens));
  if (record.tokens_emitted > 0)
    s.generated_tokens->Increment(static_cast<double>(record.tokens_emitted));
  for (absl::Duration d : record.time_to_first_token) s.ttft->Observe(absl::ToDoubleSeconds(d));
  for (absl::Duration d : record.inter_token_latency) s.itl->Observe(absl::ToDoubleSeconds(d));
  if (record.constrained_rows > 0) {
    s.mask->Observe(absl::ToDoubleSeconds(record.mask_time));
    s.mask_wait->Observe(absl::ToDoubleSeconds(record.mask_wait));
  }
}

std::string Metrics::Render() const {
  std::vector<MetricFamily> families = impl_->registry->Collect();
  for (auto& f : impl_->collector->Collect()) families.push_back(std::move(f));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

// Calls that end before their handler runs for want of a request (api/before_handler.h): a flood
// of reset streams makes thousands a second, so instead of an access-log line each (formatted and
// written under the log's lock on gRPC's few callback threads, which every other call waits for)
// they are counted here and written as one line per interval, naming the first peers.
class Metrics::EndedBeforeHandlerLog {
 public:
  static constexpr int kMaxPeers = 4;

  explicit EndedBeforeHandlerLog(absl::Duration interval) : interval_(interval) {
    thread_ = std::thread([this] {
      NameThisThread("ended-log");
      while (!stop_.WaitForNotificationWithTimeout(interval_)) Flush();
      Flush();
    });
  }
  ~EndedBeforeHandlerLog() {
    stop_.Notify();
    thread_.join();
  }

  void Add(const char* reason, grpc::ServerContextBase* context) ABSL_LOCKS_EXCLUDED(mu_) {
    bool want_peer;
    {
      absl::MutexLock lock(&mu_);
      ++(std::string_view(reason) == "cancelled" ? cancelled_ : no_request_);
      want_peer = static_cast<int>(peers_.size()) < kMaxPeers && context != nullptr;
    }
    if (!want_peer) return;
    std::string peer = context->peer();  // outside the lock: it allocates
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(peers_.size()) < kMaxPeers &&
        std::find(peers_.begin(), peers_.end(), peer) == peers_.end()) {
      peers_.push_back(std::move(peer));
    }
  }

 private:
  void Flush() ABSL_LOCKS_EXCLUDED(mu_) {
    int64_t no_request, cancelled;
    std::vector<std::string> peers;
    {
      absl::MutexLock lock(&mu_);
      no_request = std::exchange(no_request_, 0);
      cancelled = std::exchange(cancelled_, 0);
      peers.swap(peers_);
    }
    if (no_request + cancelled == 0) return;
    Log(LogLevel::kWarning, "calls ended before their handler ran",
        {{"calls", no_request + cancelled},
         {"no_request", no_request},
         {"cancelled", cancelled},
         {"interval_ms", absl::ToInt64Milliseconds(interval_)},
         {"peers", absl::StrJoin(peers, ",")}});
  }

  const absl::Duration interval_;
  absl::Mutex mu_;
  int64_t no_request_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);  // the first kMaxPeers seen
  absl::Notification stop_;
  std::thread thread_;
};

// Per call: created when the call starts, destroyed when it ends.
class Metrics::RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(Impl* metrics, grpc::experimental::ServerRpcInfo* info,
                 EndedBeforeHandlerLog* ended_log, bool log_requests)
      : metrics_(metrics),
        series_(metrics->ForMethod(info->method())),
        context_(info->server_context()),
        ended_log_(ended_log),
        log_requests_(log_requests),
        start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* md = methods->GetRecvInitialMetadata();
      if (md != nullptr) {
        const auto value = [md](const char* key) {
          auto it = md->find(key);
          return it == md->end() ? std::string_view()
                                 : std::string_view(it->second.data(), it->second.size());
        };
        RequestIdentity who = IdentifyRequest(value("x-request-id"), value("traceparent"));
        request_id_ = std::move(who.request_id);
        trace_id_ = std::move(who.trace_id);
        span_id_ = std::move(who.span_id);
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("x-request-id", RequestId());
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const absl::Duration elapsed = absl::Now() - start_;
      metrics_->ObserveRpc(*series_, status.error_code(), elapsed);
      // Every status a handler sends passes here, where the call's request id is known: the client
      // gets its share of the error, the log the whole of it (api/grpc_status.h).
      const GrpcClientError client = ForGrpcClient(status, RequestId());
      if (client.withheld) methods->ModifySendStatus(client.status);
      if (log_requests_) {
        const char* ended = EndedBeforeHandlerReason(status.error_code(), status.error_message());
        if (ended != nullptr) {
          ended_log_->Add(ended, context_);
        } else {
          LogCall(status, elapsed, client.detail);
        }
      } else if (client.withheld) {
        LogWithheld(status, client.detail);
      }
    }
    methods->Proceed();
  }

 private:
  const std::string& RequestId() {
    if (request_id_.empty()) request_id_ = NewRequestId();
    return request_id_;
  }

  // The error as the server saw it: the whole message, and the server detail in brackets.
  static std::string FullError(const grpc::Status& status, const std::string& detail) {
    if (detail.empty()) return status.error_message();
    return absl::StrCat(status.error_message(), " [", detail, "]");
  }

  static LogLevel LevelFor(grpc::StatusCode code) {
    if (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
        code == grpc::StatusCode::DATA_LOSS) {
      return LogLevel::kError;
    }
    if (IsRefusalCode(code) || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return LogLevel::kWarning;
    }
    return LogLevel::kInfo;
  }

  // The trace of a call that brought a valid traceparent: its id and this server's span id.
  void AppendTrace(std::vector<LogField>& fields) const {
    if (trace_id_.empty()) return;
    fields.push_back({"trace_id", trace_id_});
    fields.push_back({"span_id", span_id_});
  }

  // Without --log_requests, what a client was not sent of its error still goes to the log.
  void LogWithheld(const grpc::Status& status, const std::string& detail) {
    const std::string error = FullError(status, detail);
    std::vector<LogField> fields = {{"request_id", RequestId()},
                                    {"rpc", series_->label},
                                    {"code", GrpcCodeName(status.error_code())},
                                    {"error", error}};
    AppendTrace(fields);
    Log(LevelFor(status.error_code()), "rpc error: part withheld from the client", fields);
  }

  void LogCall(const grpc::Status& status, absl::Duration elapsed, const std::string& detail) {
    const grpc::StatusCode code = status.error_code();
    const std::string peer = context_ != nullptr ? context_->peer() : std::string();
    const std::string error = status.ok() ? std::string() : FullError(status, detail);
    std::vector<LogField> fields = {{"request_id", RequestId()},
                                    {"rpc", series_->label},
                                    {"code", GrpcCodeName(code)},
                                    {"duration_ms", absl::ToDoubleMilliseconds(elapsed)},
                                    {"peer", peer}};
    if (!status.ok()) fields.push_back({"error", error});
    AppendTrace(fields);
    Log(LevelFor(code), "rpc", fields);
  }

  Impl* const metrics_;
  Impl::RpcSeries* const series_;
  grpc::ServerContextBase* const context_;
  EndedBeforeHandlerLog* const ended_log_;
  const bool log_requests_;
  const absl::Time start_;
  std::string request_id_;
  std::string trace_id_;  // from a valid traceparent; empty without
  std::string span_id_;
};

class Metrics::RpcInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcInterceptorFactory(Impl* metrics, bool log_requests)
      : metrics_(metrics), log_requests_(log_requests) {
    if (log_requests_) ended_log_ = std::make_unique<EndedBeforeHandlerLog>(absl::Seconds(1));
  }
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(metrics_, info, ended_log_.get(), log_requests_);
  }

 private:
  Impl* const metrics_;
  const bool log_requests_;
  std::unique_ptr<EndedBeforeHandlerLog> ended_log_;
};

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Metrics::InterceptorFactory(
    bool log_requests) {
  return std::make_unique<RpcInterceptorFactory>(impl_.get(), log_requests);
}

}  // namespace tost::service
