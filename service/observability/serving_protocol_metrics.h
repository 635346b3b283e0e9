// The metrics an inference gateway's endpoint picker scores replicas by (the Gateway API Inference
// Extension's "model server protocol"): per language model, generation requests queued and
// running, the state budget's utilisation (0-1, what a KV-cache server reports as its cache
// usage), and an info gauge describing the prefix-state cache. docs/metrics.md maps each to the
// protocol's requirement.
//
// The protocol lets names differ as long as types and meanings match; the picker's default
// configuration reads vLLM's names, so with `vllm_names` the same values are exported a second time
// under those (vllm:num_requests_waiting, ...), labelled model_name as vLLM labels them.
#pragma once

#include <vector>

#include <prometheus/metric_family.h>

#include "service/engine/engine.h"

namespace tost::service {

// One language model's figures, as the families export them.
struct ServingProtocolSample {
  std::string model;
  // Admitted, waiting for an active place: queued, or parked (a running one that gave its place
  // to a higher priority or another tenant's share, waiting with its state to resume).
  int64_t waiting = 0;
  int64_t running = 0;          // holding an active place (prefilling, decoding, or paused on the
                                // client's reading)
  double utilization = 0;       // in [0, 1]
  int64_t cache_positions = 0;  // the prefix-state cache's capacity in blocks of one token
};

// The figures of every served language model of `engine`, from `stats` (one Engine::Stats()):
//   utilization = max(session state bytes / session budget, running / max active places),
// capped at 1: a new generation waits for an active place once either is full, and idle sessions
// beyond the budget are evicted (lost, with the in-memory store).
//   cache_positions = token positions the prefix-state cache holds at most for one caller, with
// entries as long as the model's context (PrefixStateCache::PositionsWithin); 0 when it is off.
std::vector<ServingProtocolSample> ServingProtocolSamples(const Engine& engine,
                                                          const EngineStats& stats);

// The families of `samples`: the tost_ ones, and with `vllm_names` vLLM's as well.
std::vector<prometheus::MetricFamily> ServingProtocolFamilies(
    const std::vector<ServingProtocolSample>& samples, bool vllm_names);

}  // namespace tost::service
