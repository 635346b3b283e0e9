#include "service/observability/serving_protocol_metrics.h"

#include <algorithm>
#include <string>
#include <utility>

#include <prometheus/client_metric.h>

#include "absl/strings/str_cat.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/session_codec.h"

namespace tost::service {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

ClientMetric Gauge(double value, std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

MetricFamily Family(std::string name, std::string help, std::vector<ClientMetric> metrics) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = MetricType::Gauge;
  f.metric = std::move(metrics);
  return f;
}

double Fraction(int64_t part, int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// One naming of the families: the label that carries the model, and each family's name.
struct Names {
  const char* model_label;
  const char* waiting;
  const char* running;
  std::vector<const char*> utilization;  // vLLM renamed its cache gauge; old pickers read the old
  const char* cache_info;
};

const Names kTostNames = {"model",
                          "tost_generation_requests_waiting",
                          "tost_generation_requests_running",
                          {"tost_state_budget_utilization"},
                          "tost_prefix_cache_config_info"};
const Names kVllmNames = {"model_name",
                          "vllm:num_requests_waiting",
                          "vllm:num_requests_running",
                          {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
                          "vllm:cache_config_info"};

void AppendFamilies(const std::vector<ServingProtocolSample>& samples, const Names& names,
                    std::vector<MetricFamily>& out) {
  std::vector<ClientMetric> waiting, running, utilization, info;
  for (const ServingProtocolSample& s : samples) {
    const std::vector<ClientMetric::Label> model = {{names.model_label, s.model}};
    waiting.push_back(Gauge(static_cast<double>(s.waiting), model));
    running.push_back(Gauge(static_cast<double>(s.running), model));
    utilization.push_back(Gauge(s.utilization, model));
    info.push_back(Gauge(1, {{"block_size", "1"},
                             {names.model_label, s.model},
                             {"num_gpu_blocks", absl::StrCat(s.cache_positions)}}));
  }
  out.push_back(Family(names.waiting,
                       "Generation requests admitted and waiting for an active place (queued, or "
                       "parked to resume), per language model",
                       std::move(waiting)));
  out.push_back(Family(names.running,
                       "Generation requests holding an active place (prefilling, decoding, or "
                       "paused for their client), per language model",
                       std::move(running)));
  for (const char* name : names.utilization) {
    out.push_back(Family(name,
                         "State budget utilisation, 0-1: the larger of session state bytes over "
                         "--session_budget_bytes and running generations over "
                         "--max_active_generations",
                         utilization));
  }
  out.push_back(Family(names.cache_info,
                       "1, labelled with the prefix-state cache's block size (1: it holds states "
                       "at any token position) and its capacity in such blocks",
                       std::move(info)));
}

}  // namespace

std::vector<ServingProtocolSample> ServingProtocolSamples(const Engine& engine,
                                                          const EngineStats& stats) {
  std::vector<ServingProtocolSample> out;
  const double sessions = Fraction(stats.sessions.state_bytes, stats.session_budget_bytes);
  for (const GeneratorStats& g : stats.generators) {
    ServingProtocolSample s;
    s.model = g.model;
    s.waiting = g.scheduler.queued + g.scheduler.parked;
    s.running = g.scheduler.active;
    s.utilization = std::clamp(std::max(sessions, Fraction(s.running, g.max_active)), 0.0, 1.0);
    if (auto entry = engine.Find(g.model); entry.ok()) {
      const model::LanguageConfig& lm = (*entry)->config.language;
      s.cache_positions = PrefixStateCache::PositionsWithin(
          stats.prefix_cache_budget_bytes,
          {.model = g.model, .weights_sha256 = (*entry)->weights_sha256, .owner = kAnonymousCaller},
          lm.context_length, lm.n_layer * lm.state_floats_per_layer());
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<MetricFamily> ServingProtocolFamilies(const std::vector<ServingProtocolSample>& samples,
                                                  bool vllm_names) {
  std::vector<MetricFamily> out;
  AppendFamilies(samples, kTostNames, out);
  if (vllm_names) AppendFamilies(samples, kVllmNames, out);
  return out;
}

}  // namespace tost::service
