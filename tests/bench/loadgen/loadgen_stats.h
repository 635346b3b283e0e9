// The parts of tost_loadgen that need no server: latency samples and their percentiles, the
// open-loop arrival schedule, the weighted workload mix, and the JSON/human report of one run.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tost::loadgen {

// Latency samples in milliseconds. Percentiles are nearest-rank (the smallest sample with at least
// p% of the samples at or below it): always an observed value, and the same answer for the same
// samples whatever their order.
class Samples {
 public:
  void Add(double value_ms) {
    values_ms_.push_back(value_ms);
    sorted_ = false;
  }
  size_t size() const { return values_ms_.size(); }
  bool empty() const { return values_ms_.empty(); }
  // p in [0, 100]; 0 when there are no samples.
  double Percentile(double p) const;
  double Max() const;
  double Mean() const;
  void Merge(const Samples& other);

 private:
  // Sorted lazily by Percentile (mutable: sorting changes no observable value).
  mutable std::vector<double> values_ms_;
  mutable bool sorted_ = true;
  void EnsureSorted() const;
};

enum class Arrivals { kPoisson, kUniform };
absl::StatusOr<Arrivals> ParseArrivals(absl::string_view name);

// Open-loop send times, in seconds from the start: exponential gaps of mean 1/rate (Poisson
// arrivals, what independent users produce) or exactly 1/rate apart (uniform).
class ArrivalSchedule {
 public:
  ArrivalSchedule(Arrivals arrivals, double rate_per_s, uint64_t seed);
  // The next send time; strictly increasing for uniform, non-decreasing for Poisson.
  double Next();

 private:
  Arrivals arrivals_;
  double rate_per_s_;
  double t_s_ = 0;
  int64_t n_ = 0;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

enum class Workload { kClassify, kGenerate };
const char* WorkloadName(Workload w);

// "classify", "generate", or "classify:3,generate:1" (weights, any positive numbers).
struct MixEntry {
  Workload workload;
  double weight;
};
absl::StatusOr<std::vector<MixEntry>> ParseMix(absl::string_view spec);

// Picks a workload per request with probability proportional to its weight.
class MixPicker {
 public:
  MixPicker(std::vector<MixEntry> mix, uint64_t seed);
  Workload Pick();

 private:
  std::vector<MixEntry> mix_;
  std::mt19937_64 rng_;
  std::discrete_distribution<size_t> pick_;
};

// What one workload measured over the measurement window.
struct WorkloadStats {
  int64_t started = 0;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors_by_code;  // gRPC code name -> count
  Samples latency_ms;                             // whole call (to the last message for streams)
  Samples ttft_ms;                                // generate: to the first token
  Samples itl_ms;                                 // generate: between consecutive tokens
  int64_t images = 0;                             // classify: images in successful calls
  int64_t tokens = 0;                             // generate: tokens received (any outcome)
};

struct RunInfo {
  std::string target;
  std::string mode;  // "rate" or "concurrency"
  std::string arrivals;
  double rate_per_s = 0;
  int concurrency = 0;
  double duration_s = 0;
  double warmup_s = 0;
  int64_t max_requests = 0;
  int cpu = -1;
  std::string mix;
  std::map<std::string, std::string> workload_params;
};

struct RunResult {
  RunInfo info;
  // From the first measured send to the last measured completion (the throughput denominator).
  double measured_s = 0;
  double client_cpu_s = 0;  // user + system time of the load generator
  // Times another process took the load generator's core from it (a busy machine: its
  // schedule and latencies are then suspect).
  int64_t client_preemptions = 0;
  int64_t max_in_flight = 0;  // most calls outstanding at once
  int64_t late_sends = 0;     // open loop: sends more than 1 ms behind schedule
  int64_t skipped_sends = 0;  // open loop: arrivals not sent because --max_in_flight was reached
  Samples send_lag_ms;        // open loop: actual send time minus scheduled send time
  std::map<Workload, WorkloadStats> by_workload;
};

// The report as JSON (latencies in ms, throughputs per second) and as a few human lines.
std::string ResultJson(const RunResult& result);
std::string ResultSummary(const RunResult& result);

}  // namespace tost::loadgen
