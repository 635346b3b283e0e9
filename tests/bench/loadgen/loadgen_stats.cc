#include "tests/bench/loadgen/loadgen_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tost::loadgen {

void Samples::EnsureSorted() const {
  if (!sorted_) {
    std::sort(values_ms_.begin(), values_ms_.end());
    sorted_ = true;
  }
}

double Samples::Percentile(double p) const {
  if (values_ms_.empty()) return 0;
  EnsureSorted();
  const double n = static_cast<double>(values_ms_.size());
  // Nearest rank: ceil(p/100 * n), at least 1. The small slack keeps a product that should be an
  // integer (99.9% of 1000) from rounding up to the next rank.
  const double exact = std::clamp(p, 0.0, 100.0) / 100.0 * n;
  size_t rank = static_cast<size_t>(std::ceil(exact - 1e-9 * std::max(1.0, exact)));
  rank = std::clamp<size_t>(rank, 1, values_ms_.size());
  return values_ms_[rank - 1];
}

double Samples::Max() const {
  if (values_ms_.empty()) return 0;
  EnsureSorted();
  return values_ms_.back();
}

double Samples::Mean() const {
  if (values_ms_.empty()) return 0;
  return std::accumulate(values_ms_.begin(), values_ms_.end(), 0.0) /
         static_cast<double>(values_ms_.size());
}

void Samples::Merge(const Samples& other) {
  values_ms_.insert(values_ms_.end(), other.values_ms_.begin(), other.values_ms_.end());
  sorted_ = values_ms_.empty();
}

absl::StatusOr<Arrivals> ParseArrivals(absl::string_view name) {
  if (name == "poisson") return Arrivals::kPoisson;
  if (name == "uniform") return Arrivals::kUniform;
  return absl::InvalidArgumentError(
      absl::StrCat("arrivals: expected \"poisson\" or \"uniform\", got \"", name, "\""));
}

ArrivalSchedule::ArrivalSchedule(Arrivals arrivals, double rate_per_s, uint64_t seed)
    : arrivals_(arrivals), rate_per_s_(rate_per_s), rng_(seed), gap_(rate_per_s) {}

double ArrivalSchedule::Next() {
  if (arrivals_ == Arrivals::kUniform) {
    // n / rate rather than a running sum: no drift from accumulated rounding over long runs.
    return static_cast<double>(n_++) / rate_per_s_;
  }
  const double t = t_s_;
  t_s_ += gap_(rng_);
  return t;
}

const char* WorkloadName(Workload w) { return w == Workload::kClassify ? "classify" : "generate"; }

absl::StatusOr<std::vector<MixEntry>> ParseMix(absl::string_view spec) {
  std::vector<MixEntry> mix;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    MixEntry entry{Workload::kClassify, 1.0};
    if (parts[0] == "classify") {
      entry.workload = Workload::kClassify;
    } else if (parts[0] == "generate") {
      entry.workload = Workload::kGenerate;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload mix: expected \"classify\" or \"generate\" (optionally \":weight\"), got \"",
          item, "\""));
    }
    if (parts.size() == 2 && (!absl::SimpleAtod(parts[1], &entry.weight) || !(entry.weight > 0) ||
                              !std::isfinite(entry.weight))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload mix: expected a positive weight after \":\", got \"", parts[1], "\""));
    }
    for (const MixEntry& seen : mix) {
      if (seen.workload == entry.workload) {
        return absl::InvalidArgumentError(
            absl::StrCat("workload mix: \"", parts[0], "\" appears twice in \"", spec, "\""));
      }
    }
    mix.push_back(entry);
  }
  if (mix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("workload mix: expected at least one workload, got \"", spec, "\""));
  }
  return mix;
}

namespace {
std::vector<double> Weights(const std::vector<MixEntry>& mix) {
  std::vector<double> w;
  for (const MixEntry& e : mix) w.push_back(e.weight);
  return w;
}
}  // namespace

MixPicker::MixPicker(std::vector<MixEntry> mix, uint64_t seed) : mix_(std::move(mix)), rng_(seed) {
  const std::vector<double> w = Weights(mix_);
  pick_ = std::discrete_distribution<size_t>(w.begin(), w.end());
}

Workload MixPicker::Pick() {
  if (mix_.size() == 1) return mix_[0].workload;
  return mix_[pick_(rng_)].workload;
}

namespace {

nlohmann::json PercentilesJson(const Samples& s) {
  return {{"count", s.size()},       {"mean", s.Mean()},        {"p50", s.Percentile(50)},
          {"p90", s.Percentile(90)}, {"p99", s.Percentile(99)}, {"max", s.Max()}};
}

double PerSecond(int64_t n, double seconds) { return seconds > 0 ? n / seconds : 0; }

}  // namespace

std::string ResultJson(const RunResult& r) {
  nlohmann::json j;
  const RunInfo& i = r.info;
  j["config"] = {{"target", i.target},
                 {"mode", i.mode},
                 {"arrivals", i.arrivals},
                 {"rate_per_s", i.rate_per_s},
                 {"concurrency", i.concurrency},
                 {"duration_s", i.duration_s},
                 {"warmup_s", i.warmup_s},
                 {"max_requests", i.max_requests},
                 {"cpu", i.cpu},
                 {"mix", i.mix},
                 {"workload_params", i.workload_params}};
  j["measured_s"] = r.measured_s;
  j["client_cpu_s"] = r.client_cpu_s;
  j["client_preemptions"] = r.client_preemptions;
  j["max_in_flight"] = r.max_in_flight;
  j["late_sends"] = r.late_sends;
  j["skipped_sends"] = r.skipped_sends;
  j["send_lag_ms"] = PercentilesJson(r.send_lag_ms);
  int64_t started = 0, ok = 0, errors = 0;
  Samples all_latency;
  nlohmann::json workloads = nlohmann::json::object();
  for (const auto& [w, s] : r.by_workload) {
    nlohmann::json o;
    int64_t e = 0;
    for (const auto& [code, n] : s.errors_by_code) e += n;
    o["started"] = s.started;
    o["ok"] = s.ok;
    o["errors"] = e;
    o["errors_by_code"] = s.errors_by_code;
    o["latency_ms"] = PercentilesJson(s.latency_ms);
    o["requests_per_s"] = PerSecond(s.ok, r.measured_s);
    if (w == Workload::kClassify) {
      o["images"] = s.images;
      o["images_per_s"] = PerSecond(s.images, r.measured_s);
    } else {
      o["tokens"] = s.tokens;
      o["tokens_per_s"] = PerSecond(s.tokens, r.measured_s);
      o["ttft_ms"] = PercentilesJson(s.ttft_ms);
      o["itl_ms"] = PercentilesJson(s.itl_ms);
    }
    workloads[WorkloadName(w)] = o;
    started += s.started;
    ok += s.ok;
    errors += e;
    all_latency.Merge(s.latency_ms);
  }
  j["workloads"] = workloads;
  j["total"] = {{"started", started},
                {"ok", ok},
                {"errors", errors},
                {"requests_per_s", PerSecond(ok, r.measured_s)},
                {"latency_ms", PercentilesJson(all_latency)}};
  return j.dump(2);
}

std::string ResultSummary(const RunResult& r) {
  const RunInfo& i = r.info;
  std::string out = i.mode == "rate"
                        ? absl::StrFormat("%s: open loop, %s arrivals at %.1f/s", i.target,
                                          i.arrivals, i.rate_per_s)
                        : absl::StrFormat("%s: closed loop, %d in flight", i.target, i.concurrency);
  absl::StrAppendFormat(&out,
                        ", mix %s; measured %.2f s, client CPU %.2f s (preempted %d times), max "
                        "in flight %d\n",
                        i.mix, r.measured_s, r.client_cpu_s, r.client_preemptions, r.max_in_flight);
  if (!r.send_lag_ms.empty()) {
    absl::StrAppendFormat(&out, "  send lag ms p50 %.3f p99 %.3f max %.3f\n",
                          r.send_lag_ms.Percentile(50), r.send_lag_ms.Percentile(99),
                          r.send_lag_ms.Max());
  }
  if (r.late_sends > 0 || r.skipped_sends > 0) {
    absl::StrAppendFormat(&out,
                          "  WARNING: %d sends > 1 ms late, %d skipped at --max_in_flight: the "
                          "load generator did not keep its schedule\n",
                          r.late_sends, r.skipped_sends);
  }
  for (const auto& [w, s] : r.by_workload) {
    int64_t e = 0;
    std::string codes;
    for (const auto& [code, n] : s.errors_by_code) {
      e += n;
      absl::StrAppend(&codes, codes.empty() ? "" : ", ", code, " ", n);
    }
    absl::StrAppendFormat(&out, "  %-8s %7d ok %5d errors%s | %8.1f req/s", WorkloadName(w), s.ok,
                          e, codes.empty() ? "" : absl::StrCat(" (", codes, ")"),
                          PerSecond(s.ok, r.measured_s));
    if (w == Workload::kClassify) {
      absl::StrAppendFormat(&out, " %9.1f images/s", PerSecond(s.images, r.measured_s));
    } else {
      absl::StrAppendFormat(&out, " %9.1f tokens/s", PerSecond(s.tokens, r.measured_s));
    }
    absl::StrAppendFormat(&out, "\n    latency ms  p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f\n",
                          s.latency_ms.Percentile(50), s.latency_ms.Percentile(90),
                          s.latency_ms.Percentile(99), s.latency_ms.Max());
    if (w == Workload::kGenerate) {
      absl::StrAppendFormat(&out, "    TTFT ms     p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f\n",
                            s.ttft_ms.Percentile(50), s.ttft_ms.Percentile(90),
                            s.ttft_ms.Percentile(99), s.ttft_ms.Max());
      absl::StrAppendFormat(&out, "    ITL ms      p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f\n",
                            s.itl_ms.Percentile(50), s.itl_ms.Percentile(90),
                            s.itl_ms.Percentile(99), s.itl_ms.Max());
    }
  }
  return out;
}

}  // namespace tost::loadgen
