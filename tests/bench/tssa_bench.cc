// tssa_bench: the fused CPU TSSA kernel against the ATen reference and the memory bandwidth of
// the same cores, and a TSSA layer against softmax-attention layers (P1, P2 of docs/kernels.md).
//
// One run prints every figure side by side; each timing is the median of repeats interleaved
// between the variants it is compared with. Layer variants run in child processes (this
// executable with --variant=...), one process per measurement, so peak memory and allocator state
// stay per variant. `--quick` runs a reduced set in seconds (CI); the full run takes minutes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/InferenceMode.h>
#include <torch/headeronly/version.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/decode_pack.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/reference.h"
#include "kernels/tssa_ops.h"
#include "tests/bench/bench_process.h"

namespace tost::bench {
namespace {

constexpr const char* kUsage =
    R"(tssa_bench: fused CPU TSSA kernel vs the ATen reference and DRAM bandwidth (P1),
TSSA layer vs softmax-attention layers in time and peak memory (P2).

usage: tssa_bench [--quick] [--threads=N] [--sections=LIST] [--device=cpu|cuda|cuda:N]
  --quick          reduced sizes and repeats, runs in seconds (CI smoke run; figures are not the
                   acceptance measurements: the bandwidth arrays fit in the last-level cache)
  --threads=N      intra-op threads for every measurement (default: all cores)
  --sections=LIST  comma-separated subset of bandwidth,kernel,causal,layer-time,layer-memory
                   (default: all), or decode-products (only when named): the lean decode
                   step's packed products (kernels/cpu/decode_kernels.h) at int8, bf16, fp16
                   and fp32, every table this CPU runs side by side, one thread
  --sizes=LIST     kernel section only these B:N pairs, e.g. 8:16384,8:65536 (default: B 1 and 8,
                   N 256...65536)
  --device=D       cpu (default: this benchmark) or cuda[:N]: runs tssa_gpu_bench, the same
                   comparison on that GPU (fused CUDA ops vs the ATen reference there, with the
                   device's measured copy bandwidth), passing --quick and --device on
  --help           this text

Figures: kernel times are medians of interleaved repeats of the dispatcher op (tost::tssa, the
fused kernel) and reference::tssa on the same input, D=384, K=8, float32, outputs allocated by
the calls, one child process per size and allocator mode: "warm" (malloc keeps freed memory, as a
long-running server's allocator does) and "glibc" (allocator defaults: blocks of 32 MiB and more
are fresh pages on every call). Rows whose w exceeds the last-level cache start every call on a
cold cache (a buffer twice the cache is read first); smaller w is read just before every call,
so it starts warm, as after the qkv projection. Effective GB/s counts three reads and one write
of w. DRAM bandwidth is the best of read (at::sum), copy (copy_), triad and memcpy over arrays 4x
the last-level cache, each from a cold cache, on the same threads; rows whose w exceeds the cache
also probe read and memcpy bandwidth over w's size between their own repeats. Layer timings and
peak memory come from one child process per variant and size (peak = VmHWM growth during one
forward after a warm-up).
Exit status: 1 when the fused result differs from the reference or a child fails.
)";

constexpr int64_t kChannels = 384;
constexpr int64_t kHeads = 8;

struct Args {
  bool quick = false;
  std::string device = "cpu";
  int threads = 0;
  std::vector<std::string> sections = {"bandwidth", "kernel", "causal", "layer-time",
                                       "layer-memory"};
  std::vector<std::pair<int64_t, int64_t>> sizes;  // kernel section (B, N); empty: the default grid
  // Child mode.
  std::string variant;
  std::string layer;
  std::string alloc;
  int64_t batch = 1;
  int64_t tokens = 0;
  int repeats = 1;
};

bool HasPrefix(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto value = [&](const std::string& key) { return s.substr(key.size()); };
    if (s == "--help" || s == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (s == "--quick") {
      a.quick = true;
    } else if (HasPrefix(s, "--device=")) {
      a.device = value("--device=");
    } else if (HasPrefix(s, "--threads=")) {
      a.threads = std::stoi(value("--threads="));
    } else if (HasPrefix(s, "--sections=")) {
      a.sections.clear();
      std::string list = value("--sections=");
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        a.sections.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (HasPrefix(s, "--sizes=")) {
      std::string list = value("--sizes=");
      for (size_t start = 0; start < list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        const size_t colon = item.find(':');
        if (colon == std::string::npos) {
          std::fprintf(stderr, "tssa_bench: --sizes expects B:N pairs, got '%s'\n", item.c_str());
          std::exit(2);
        }
        a.sizes.emplace_back(std::stoll(item.substr(0, colon)), std::stoll(item.substr(colon + 1)));
        start = comma + 1;
      }
    } else if (HasPrefix(s, "--variant=")) {
      a.variant = value("--variant=");
    } else if (HasPrefix(s, "--layer=")) {
      a.layer = value("--layer=");
    } else if (HasPrefix(s, "--alloc=")) {
      a.alloc = value("--alloc=");
    } else if (HasPrefix(s, "--batch=")) {
      a.batch = std::stoll(value("--batch="));
    } else if (HasPrefix(s, "--tokens=")) {
      a.tokens = std::stoll(value("--tokens="));
    } else if (HasPrefix(s, "--repeats=")) {
      a.repeats = std::stoi(value("--repeats="));
    } else {
      std::fprintf(stderr, "tssa_bench: unknown argument '%s' (see --help)\n", s.c_str());
      std::exit(2);
    }
  }
  return a;
}

bool Wants(const Args& a, const std::string& section) {
  return std::find(a.sections.begin(), a.sections.end(), section) != a.sections.end();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <typename F>
double TimeMs(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t LastLevelCacheBytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  int64_t kib = 0;
  if (in >> kib) return kib * 1024;
  return 32 << 20;
}

// The 1-minute load average: the machine may be shared, and every figure here depends on it.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "unknown" : one;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (HasPrefix(line, "model name")) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// ---------------------------------------------------------------------------------------------
// Memory bandwidth of the same threads.

// Evicts the caches: reads a buffer of twice the last-level cache. Called (untimed) before every
// timed bandwidth-bound measurement, so none starts on data a previous one left in the cache
// (with a data set a few times the cache, the tail of the previous pass would still be there).
// Reads every element of `t` (at::sum) into a sink the compiler cannot drop.
void ReadThrough(const at::Tensor& t) {
  static volatile float sink = 0;
  sink = sink + at::sum(t).item<float>();
}

void FlushCaches() {
  // Never destroyed: it must outlive nothing and LibTorch's own statics go first at exit.
  static const at::Tensor* buffer =
      new at::Tensor(at::ones({2 * LastLevelCacheBytes() / static_cast<int64_t>(sizeof(float))}));
  ReadThrough(*buffer);
}

// Streaming probes over float32 tensors of the same size, on at::get_num_threads() threads, with
// LibTorch's own vectorised kernels (AVX-512 here, like ours): read = at::sum, copy = copy_ into
// another tensor, triad = a = b + 3c, and memcpy per thread (glibc uses non-temporal stores for
// large blocks, so it moves 2 bytes per byte copied instead of 3).
struct Bandwidth {
  double read_gbs = 0, copy_gbs = 0, triad_gbs = 0, memcpy_gbs = 0;
  double best() const { return std::max({read_gbs, copy_gbs, triad_gbs, memcpy_gbs}); }
};

class BandwidthProbe {
 public:
  explicit BandwidthProbe(const at::Tensor& src)
      : b_(src),
        a_(at::empty_like(src)),
        c_(at::full_like(src, 0.5)),
        bytes_(static_cast<double>(src.nbytes())) {
    a_.zero_();  // pages mapped before timing
  }
  double ReadMs() const {
    FlushCaches();
    return TimeMs([&] { ReadThrough(b_); });
  }
  double CopyMs() {
    FlushCaches();
    return TimeMs([&] { a_.copy_(b_); });
  }
  double TriadMs() {
    FlushCaches();
    return TimeMs([&] { at::add_out(a_, b_, c_, 3.0); });
  }
  double MemcpyMs() {
    const int64_t n = b_.nbytes();
    char* dst = static_cast<char*>(a_.data_ptr());
    const char* src = static_cast<const char*>(b_.const_data_ptr());
    FlushCaches();
    // Through the kernels' ParallelTasks: at::parallel_for would run on one thread here (its OpenMP
    // region exists only in translation units compiled with -fopenmp, see
    // kernels/cpu/CMakeLists.txt).
    constexpr int64_t kChunk = 4 << 20;
    return TimeMs([&] {
      kernels::cpu::ParallelTasks((n + kChunk - 1) / kChunk, /*reverse=*/false, [&](int64_t t) {
        std::memcpy(dst + t * kChunk, src + t * kChunk,
                    static_cast<size_t>(std::min(kChunk, n - t * kChunk)));
      });
    });
  }
  double bytes() const { return bytes_; }

 private:
  at::Tensor b_, a_, c_;
  double bytes_;
};

Bandwidth MeasureBandwidth(int64_t array_bytes, int repeats) {
  BandwidthProbe probe(at::randn({array_bytes / static_cast<int64_t>(sizeof(float))}));
  probe.ReadMs(), probe.CopyMs(), probe.TriadMs(), probe.MemcpyMs();  // warm-up
  std::vector<double> tr, tc, tt, tm;
  for (int r = 0; r < repeats; ++r) {
    tr.push_back(probe.ReadMs());
    tc.push_back(probe.CopyMs());
    tt.push_back(probe.TriadMs());
    tm.push_back(probe.MemcpyMs());
  }
  const double bytes = probe.bytes();
  return Bandwidth{bytes / Median(tr) / 1e6, 2 * bytes / Median(tc) / 1e6,
                   3 * bytes / Median(tt) / 1e6, 2 * bytes / Median(tm) / 1e6};
}

// ---------------------------------------------------------------------------------------------
// P1: fused kernel vs reference.

struct KernelRow {
  int64_t batch = 0, tokens = 0;
  // Per allocator mode (0: malloc retains freed memory, 1: glibc defaults): medians in ms.
  double ref_ms[2] = {0, 0}, fused_ms[2] = {0, 0};
  // w beyond the last-level cache: read / memcpy bandwidth of w's size, timed between the repeats.
  double probe_gbs = 0;
  double w_bytes() const { return static_cast<double>(batch * tokens * kChannels * sizeof(float)); }
  double gbs(double ms) const { return 4 * w_bytes() / ms / 1e6; }
};

at::Tensor RandomInput(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen);
}

// Repeats so that one size takes about `budget_ms`, within [lo, hi].
int RepeatsFor(double one_round_ms, double budget_ms, int lo, int hi) {
  return std::clamp(static_cast<int>(budget_ms / std::max(one_round_ms, 1e-3)), lo, hi);
}

constexpr const char* kAllocModes[2] = {"retain", "default"};

// Child: one (allocator mode, B, N) row of P1. Exit status 1 when the fused result differs.
int RunKernelRowChild(const Args& args) {
  if (args.alloc == "retain") {
    ConfigureAllocator(AllocatorMode::kRetain);
  } else if (args.alloc != "default") {
    throw std::runtime_error("unknown --alloc '" + args.alloc + "' (retain, default)");
  }
  const int64_t b = args.batch, n = args.tokens;
  const at::Tensor temp = RandomInput({kHeads}, 2).abs() + 0.5;
  const at::Tensor w = RandomInput({b, n, kChannels}, 1000 + n);
  // Warm-up, and the correctness check the exit status reports.
  at::Tensor y_ref, y;
  const double t_ref0 = TimeMs([&] { y_ref = kernels::reference::tssa(w, temp); });
  const double t_fused0 = TimeMs([&] { y = kernels::tssa(w, temp); });
  if (!at::allclose(y, y_ref, 1e-4, 1e-5)) {
    std::fprintf(stderr, "MISMATCH: fused tssa differs from the reference at B=%ld N=%ld\n", b, n);
    return 1;
  }
  y_ref = at::Tensor(), y = at::Tensor();
  const int reps = args.quick ? 3 : RepeatsFor(t_ref0 + t_fused0, 4000, 3, 15);
  // Beyond the cache the kernel is bandwidth-bound: probe the bandwidth in the same loop, so that
  // both see the same machine (other tenants' load varies over a run).
  std::optional<BandwidthProbe> probe;
  const double w_bytes = static_cast<double>(w.nbytes());
  if (w_bytes > static_cast<double>(LastLevelCacheBytes()) && args.alloc == "retain")
    probe.emplace(w);
  // w beyond the cache: every call starts on a cold cache (a call following another over the same
  // w would find the tail of w still cached); within the cache: every call starts with w warm, as
  // it is when the qkv projection has just written it. Both need preparing before each call: the
  // reference's temporaries (about six tensors of w's size) evict w from the cache, so without it
  // the call after the reference would start cold and the one after the fused kernel warm.
  const bool beyond_cache = w_bytes > static_cast<double>(LastLevelCacheBytes());
  const auto prepare = [&] {
    if (beyond_cache) {
      FlushCaches();
    } else {
      ReadThrough(w);
    }
  };
  std::vector<double> tr, tf, tp_read, tp_copy;
  for (int r = 0; r < reps; ++r) {
    prepare();
    tr.push_back(TimeMs([&] { kernels::reference::tssa(w, temp); }));
    prepare();
    tf.push_back(TimeMs([&] { kernels::tssa(w, temp); }));
    if (probe) tp_read.push_back(probe->ReadMs()), tp_copy.push_back(probe->MemcpyMs());
  }
  std::map<std::string, double> result{
      {"ref_ms", Median(tr)}, {"fused_ms", Median(tf)}, {"repeats", reps}};
  if (probe)
    result["probe_gbs"] = std::max(w_bytes / Median(tp_read), 2 * w_bytes / Median(tp_copy)) / 1e6;
  std::printf("%s\n", ResultLine(result).c_str());
  return 0;
}

bool RunKernelSection(const Args& args, const Bandwidth& bw) {
  std::vector<std::pair<int64_t, int64_t>> sizes = args.sizes;
  if (sizes.empty()) {
    for (const int64_t b : {1, 8}) {
      for (const int64_t n : args.quick ? std::vector<int64_t>{256, 1024, 4096}
                                        : std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192,
                                                               16384, 32768, 65536}) {
        if (!(args.quick && b == 8 && n > 1024)) sizes.emplace_back(b, n);
      }
    }
  }
  bool ok = true;
  std::vector<KernelRow> rows;
  for (const auto& [b, n] : sizes) {
    KernelRow row{b, n};
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<std::string> child = {
          "--variant=kernel-row", std::string("--alloc=") + kAllocModes[mode],
          "--batch=" + std::to_string(b), "--tokens=" + std::to_string(n),
          "--threads=" + std::to_string(at::get_num_threads())};
      if (args.quick) child.push_back("--quick");
      std::map<std::string, double> r;
      try {
        r = RunChild(child);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        ok = false;
        continue;
      }
      row.ref_ms[mode] = r["ref_ms"];
      row.fused_ms[mode] = r["fused_ms"];
      if (r.count("probe_gbs")) row.probe_gbs = r["probe_gbs"];
      std::printf(
          "  kernel %-7s B=%ld N=%-6ld reference %9.3f ms  fused %8.3f ms  (%5.1fx, %6.1f GB/s)  "
          "[%g repeats]\n",
          kAllocModes[mode], b, n, row.ref_ms[mode], row.fused_ms[mode],
          row.ref_ms[mode] / row.fused_ms[mode], row.gbs(row.fused_ms[mode]), r["repeats"]);
      std::fflush(stdout);
    }
    rows.push_back(row);
  }

  std::printf(
      "\nP1  fused tost::tssa vs reference::tssa (D=%ld, K=%ld, float32, %d threads, kernels ISA "
      "%s)\n",
      kChannels, kHeads, at::get_num_threads(),
      std::string(kernels::cpu::CpuIsaName(kernels::cpu::ActiveCpuIsa())).c_str());
  std::printf("  DRAM bandwidth of these threads (best of read/copy/triad/memcpy): %.1f GB/s%s\n",
              bw.best(), args.quick ? " [quick: arrays fit in cache, not DRAM]" : "");
  std::printf(
      "  warm: malloc keeps freed memory (no page faults on repeated calls); glibc: allocator "
      "defaults\n"
      "  (blocks >= 32 MiB are fresh pages every call). eff GB/s = 4 x bytes(w) / time (three "
      "reads and\n"
      "  one write of w). probe = best of read and memcpy bandwidth over w's size, timed between "
      "the same\n"
      "  repeats (rows with w > LLC)\n");
  std::printf("  %2s %6s | %10s %10s %8s %9s %8s %15s | %10s %10s %8s\n", "B", "N", "ref ms",
              "fused ms", "speedup", "eff GB/s", "of DRAM", "of probe (GB/s)", "glibc ref",
              "glibc fus", "speedup");
  for (const KernelRow& r : rows) {
    char probe[32] = "";
    if (r.probe_gbs > 0) {
      std::snprintf(probe, sizeof(probe), "%3.0f%% (%5.1f)",
                    100 * r.gbs(r.fused_ms[0]) / r.probe_gbs, r.probe_gbs);
    }
    std::printf("  %2ld %6ld | %10.3f %10.3f %7.1fx %9.1f %7.0f%% %15s | %10.3f %10.3f %7.1fx\n",
                r.batch, r.tokens, r.ref_ms[0], r.fused_ms[0], r.ref_ms[0] / r.fused_ms[0],
                r.gbs(r.fused_ms[0]), 100 * r.gbs(r.fused_ms[0]) / bw.best(), probe, r.ref_ms[1],
                r.fused_ms[1], r.ref_ms[1] / r.fused_ms[1]);
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Causal prefill (both scan strategies) and decode step vs the reference (no target; informs the
// scan choice documented in docs/kernels.md).

bool RunCausalSection(const Args& args) {
  using kernels::cpu::CausalScan;
  struct Case {
    int64_t batch, tokens;
  };
  const std::vector<Case> prefill =
      args.quick ? std::vector<Case>{{1, 1024}} : std::vector<Case>{{1, 4096}, {8, 1024}};
  const at::Tensor temp = RandomInput({kHeads}, 3).abs() + 0.5;
  bool ok = true;
  // As the kernel rows' "warm" mode: otherwise whichever variant runs after the reference's
  // temporaries are trimmed pays the page faults of its output.
  ConfigureAllocator(AllocatorMode::kRetain);
  std::printf(
      "\nCausal prefill tost::tssa_causal vs reference (D=%ld, K=%ld, float32, %d threads)\n",
      kChannels, kHeads, at::get_num_threads());
  std::printf("  %2s %6s %10s %14s %12s %9s\n", "B", "T", "ref ms", "sequential ms", "chunked ms",
              "speedup");
  for (const Case& c : prefill) {
    const at::Tensor w = RandomInput({c.batch, c.tokens, kChannels}, 40);
    const at::Tensor delta = RandomInput({kHeads, c.tokens}, 41) * 0.2;
    kernels::cpu::CpuKernelOptions seq, chunked;
    seq.causal_scan = CausalScan::kSequential;
    chunked.causal_scan = CausalScan::kChunked;
    const auto run_ref = [&] {
      return kernels::reference::tssa_causal(w, temp, delta, std::nullopt, std::nullopt);
    };
    const auto run = [&](const kernels::cpu::CpuKernelOptions& o) {
      return kernels::cpu::tssa_causal_with(o, w, temp, delta, std::nullopt, std::nullopt);
    };
    if (!at::allclose(std::get<0>(run(seq)), std::get<0>(run_ref()), 1e-4, 1e-5) ||
        !at::equal(std::get<0>(run(seq)), std::get<0>(run(chunked)))) {
      std::fprintf(stderr, "MISMATCH: tssa_causal at B=%ld T=%ld\n", c.batch, c.tokens);
      ok = false;
    }
    std::vector<double> tr, ts, tc;
    for (int r = 0; r < (args.quick ? 3 : 7); ++r) {
      tr.push_back(TimeMs(run_ref));
      ts.push_back(TimeMs([&] { run(seq); }));
      tc.push_back(TimeMs([&] { run(chunked); }));
    }
    const double best = std::min(Median(ts), Median(tc));
    std::printf("  %2ld %6ld %10.3f %14.3f %12.3f %8.1fx\n", c.batch, c.tokens, Median(tr),
                Median(ts), Median(tc), Median(tr) / best);
  }
  std::printf(
      "  decode step tost::tssa_step vs reference (one token per sequence, state in place)\n");
  std::printf("  %4s %12s %12s %9s\n", "B", "ref us", "fused us", "speedup");
  for (const int64_t b : {int64_t{1}, int64_t{64}}) {
    const at::Tensor w = RandomInput({b, kChannels}, 50);
    const at::Tensor delta = RandomInput({kHeads, 4096}, 51) * 0.2;
    const at::Tensor positions = at::full({b}, 4000, at::kLong);
    at::Tensor state = RandomInput({b, kernels::StateWidth(kChannels, kHeads)}, 52).abs() * 100;
    at::Tensor s_ref = state.clone(), s_fused = state.clone();
    const int reps = args.quick ? 20 : 200;
    std::vector<double> tr, tf;
    for (int r = 0; r < reps; ++r) {
      // Same state every repeat: each call starts from a copy, outside the timed region.
      s_ref.copy_(state), s_fused.copy_(state);
      tr.push_back(
          TimeMs([&] { kernels::reference::tssa_step(w, temp, delta, positions, s_ref); }));
      tf.push_back(TimeMs([&] { kernels::tssa_step(w, temp, delta, positions, s_fused); }));
    }
    if (!at::allclose(s_ref, s_fused, 1e-5, 1e-4)) {
      std::fprintf(stderr, "MISMATCH: tssa_step state at B=%ld\n", b);
      ok = false;
    }
    std::printf("  %4ld %12.1f %12.1f %8.1fx\n", b, 1e3 * Median(tr), 1e3 * Median(tf),
                Median(tr) / Median(tf));
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// P2: layers (child processes).

struct Linear {
  at::Tensor weight, bias;
  Linear(int64_t in, int64_t out, uint64_t seed)
      : weight(RandomInput({out, in}, seed) * 0.02), bias(RandomInput({out}, seed + 1) * 0.02) {}
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, weight, bias); }
};

// One attention block's token mixer at width D: x [1, N, D] -> [1, N, D].
class Layer {
 public:
  explicit Layer(const std::string& kind) : kind_(kind) {
    if (kind == "tssa") {
      in_ = std::make_unique<Linear>(kChannels, kChannels, 10);  // ToST: one projection D -> D
      temp_ = RandomInput({kHeads}, 12).abs() + 0.5;
    } else if (kind == "sdpa" || kind == "materialised") {
      in_ = std::make_unique<Linear>(kChannels, 3 * kChannels, 10);  // q, k, v
    } else {
      throw std::runtime_error("unknown layer '" + kind + "' (tssa, sdpa, materialised)");
    }
    out_ = std::make_unique<Linear>(kChannels, kChannels, 20);
  }

  at::Tensor Forward(const at::Tensor& x) const {
    const int64_t b = x.size(0), n = x.size(1), hd = kChannels / kHeads;
    if (kind_ == "tssa") return (*out_)(kernels::tssa((*in_)(x), temp_));
    const at::Tensor qkv = (*in_)(x).view({b, n, 3, kHeads, hd}).permute({2, 0, 3, 1, 4});
    const at::Tensor q = qkv[0], k = qkv[1], v = qkv[2];
    at::Tensor o;
    if (kind_ == "sdpa") {
      o = at::scaled_dot_product_attention(q, k, v);
    } else {
      // As ViT computes it: attn = softmax((q @ kᵀ) · scale); attn @ v.
      const at::Tensor attn =
          at::softmax(at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd))), -1);
      o = at::matmul(attn, v);
    }
    return (*out_)(o.transpose(1, 2).reshape({b, n, kChannels}));
  }

 private:
  std::string kind_;
  std::unique_ptr<Linear> in_, out_;
  at::Tensor temp_;
};

int RunChildVariant(const Args& args) {
  c10::InferenceMode guard;
  if (args.variant == "kernel-row") return RunKernelRowChild(args);
  const Layer layer(args.layer);
  const at::Tensor x = RandomInput({1, args.tokens, kChannels}, 30);
  std::map<std::string, double> result;
  if (args.variant == "layer-time") {
    ConfigureAllocator(AllocatorMode::kRetain);
    layer.Forward(x);  // warm-up
    std::vector<double> t;
    for (int r = 0; r < args.repeats; ++r) t.push_back(TimeMs([&] { layer.Forward(x); }));
    result["time_ms"] = Median(t);
  } else if (args.variant == "layer-memory") {
    ConfigureAllocator(AllocatorMode::kRelease);
    layer.Forward(x);  // warm-up: thread pools, library workspaces
    ReleaseFreeMemory();
    const MemoryStatus before = ReadMemoryStatus();
    if (!ResetPeakRss())
      throw std::runtime_error("cannot reset VmHWM through /proc/self/clear_refs");
    const at::Tensor y = layer.Forward(x);
    const MemoryStatus after = ReadMemoryStatus();
    result["peak_bytes"] = static_cast<double>(after.hwm_bytes - before.rss_bytes);
    result["process_peak_bytes"] = static_cast<double>(after.hwm_bytes);
    result["checksum"] = y.sum().item<double>();
  } else {
    throw std::runtime_error("unknown --variant '" + args.variant + "'");
  }
  std::printf("%s\n", ResultLine(result).c_str());
  return 0;
}

std::vector<std::string> ChildArgs(const std::string& variant, const std::string& layer,
                                   int64_t tokens, int repeats) {
  return {"--variant=" + variant, "--layer=" + layer, "--tokens=" + std::to_string(tokens),
          "--repeats=" + std::to_string(repeats),
          "--threads=" + std::to_string(at::get_num_threads())};
}

// The lean decode step's products on the bench LM's four dense layers (C 384: 384→1152, 384→384,
// 384→1536, 1536→384) at int8, bf16, fp16 and fp32, one thread, every product table this CPU
// runs: per table and row count the median time of the four products, and its ratio to the first
// table's. The tables: the widening product at every row count (AVX2 and AVX-512: the path before
// the float32 tiles), the tables the lean step takes (float32 tiles from 8 rows at AVX2 and 12 at
// AVX-512 for int8 and 16-bit weights the dot products do not take), and AVX-512 with the BF16
// and VNNI dot products where the CPU has them.
void RunDecodeProductsSection(const Args& args) {
  using namespace kernels::cpu;
  const std::vector<std::pair<int64_t, int64_t>> layers = {
      {1152, 384}, {384, 384}, {1536, 384}, {384, 1536}};
  const std::vector<int64_t> row_counts =
      args.quick ? std::vector<int64_t>{1, 16}
                 : std::vector<int64_t>{1, 2, 4, 6, 8, 12, 16, 32, 64, 128};
  struct Table {
    std::string name;
    const DecodeKernels* kernels;
  };
  std::vector<Table> tables;
  for (CpuIsa isa : AvailableCpuIsas()) {
    if (isa == CpuIsa::kDefault) continue;
    tables.push_back({std::string(CpuIsaName(isa)) + " widening", &WideningDecodeKernelsFor(isa)});
    tables.push_back(
        {std::string(CpuIsaName(isa)) + " " + std::string(Int8ProductsName(isa, false)),
         &DecodeKernelsFor(isa, false)});
  }
  if (CpuHasDotProducts()) {
    tables.push_back({"AVX512 dot products", &DecodeKernelsFor(CpuIsa::kAvx512, true)});
  }
  const int previous_threads = at::get_num_threads();
  at::set_num_threads(1);
  const int reps = args.quick ? 3 : 15;
  for (PackedType type :
       {PackedType::kInt8, PackedType::kBFloat16, PackedType::kFloat16, PackedType::kFloat32}) {
    std::printf(
        "\nLean decode products, %s weights, bench LM layers (384x1152, 384x384, 384x1536, "
        "1536x384), 1 thread, ms for the four (median of %d interleaved repeats); ratio = first "
        "table's time / this table's\n  %6s",
        type == PackedType::kInt8       ? "int8"
        : type == PackedType::kBFloat16 ? "bf16"
        : type == PackedType::kFloat16  ? "fp16"
                                        : "fp32",
        reps, "rows");
    for (const Table& t : tables) std::printf(" %22s %6s", t.name.c_str(), "ratio");
    std::printf("\n");
    at::manual_seed(7);
    // Weights packed per table (the VNNI table packs int8 in quads).
    std::vector<std::vector<PackedWeights>> packed(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      for (auto [out, in] : layers) {
        const int64_t group = tables[t].kernels->input_group[static_cast<int>(type)];
        at::manual_seed(out * 7919 + in);
        packed[t].push_back(PackWeights(at::randn({out, in}), at::randn({out}), type, group));
      }
    }
    for (int64_t rows : row_counts) {
      const at::Tensor x = at::randn({rows, 1536});
      std::vector<float> y(static_cast<size_t>(rows * 1536));
      std::vector<uint32_t> prepared(static_cast<size_t>(rows * 1537 + 16));
      std::vector<std::vector<double>> ms(tables.size());
      for (int rep = 0; rep < reps + 1; ++rep) {
        for (size_t t = 0; t < tables.size(); ++t) {
          const auto t0 = std::chrono::steady_clock::now();
          for (const PackedWeights& p : packed[t]) {
            const PackedMatrix& m = p.matrix;
            tables[t].kernels->prepare(m, x.data_ptr<float>(), rows, m.in, prepared.data());
            tables[t].kernels->matmul(m, x.data_ptr<float>(), rows, m.in, prepared.data(), 0,
                                      m.panels(), y.data(), m.out);
          }
          const double elapsed =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          if (rep > 0) ms[t].push_back(elapsed);  // the first round warms the caches
        }
      }
      std::printf("  %6lld", static_cast<long long>(rows));
      const double first = Median(ms[0]);
      for (size_t t = 0; t < tables.size(); ++t) {
        const double m = Median(ms[t]);
        std::printf(" %22.3f %5.2fx", m, first / m);
      }
      std::printf("\n");
    }
  }
  // LibTorch's int8 products (model/nets/linear_layer.h), which take the steps and prefill chunks
  // beyond the lean step's row limit: the weight widened to bf16 for a bf16 product (the path at
  // AVX-512, and before on every CPU) and to float32 for MKL (now where the kernels run below
  // AVX-512), each then ·scale + bias in float32. Run under ONEDNN_MAX_CPU_ISA and
  // MKL_ENABLE_INSTRUCTIONS to time them as another CPU runs them.
  std::printf(
      "\nLibTorch int8 products, same layers, 1 thread, ms for the four (median of %d interleaved "
      "repeats); ratio = bf16-widened / fp32-widened\n  %6s %22s %22s %6s\n",
      reps, "rows", "bf16-widened", "fp32-widened", "ratio");
  std::vector<Int8Rows> weights;
  std::vector<at::Tensor> biases;
  for (auto [out, in] : layers) {
    at::manual_seed(out * 7919 + in);
    weights.push_back(QuantiseInt8PerRow(at::randn({out, in})));
    biases.push_back(at::randn({out}));
  }
  for (int64_t rows : row_counts) {
    if (rows < 16) continue;  // below, LibTorch's path is _weight_int8pack_mm either way
    const at::Tensor x = at::randn({rows, 1536});
    std::vector<double> bf16_ms, fp32_ms;
    for (int rep = 0; rep < reps + 1; ++rep) {
      for (bool fp32 : {false, true}) {
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t l = 0; l < layers.size(); ++l) {
          const at::Tensor xl = x.narrow(1, 0, layers[l].second);
          const at::Tensor y =
              fp32 ? at::linear(xl, weights[l].values.to(at::kFloat))
                   : at::linear(xl.to(at::kBFloat16), weights[l].values.to(at::kBFloat16));
          at::addcmul(biases[l], y, weights[l].scale);
        }
        const double elapsed =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        if (rep > 0) (fp32 ? fp32_ms : bf16_ms).push_back(elapsed);
      }
    }
    std::printf("  %6lld %22.3f %22.3f %5.2fx\n", static_cast<long long>(rows), Median(bf16_ms),
                Median(fp32_ms), Median(bf16_ms) / Median(fp32_ms));
  }
  at::set_num_threads(previous_threads);
}

void RunLayerTimeSection(const Args& args) {
  const std::vector<int64_t> tokens =
      args.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  const int rounds = args.quick ? 1 : 3, inner = args.quick ? 2 : 3;
  std::map<std::pair<std::string, int64_t>, std::vector<double>> times;
  for (int r = 0; r < rounds; ++r) {
    for (const int64_t n : tokens) {
      for (const std::string layer : {"tssa", "sdpa"}) {
        times[{layer, n}].push_back(RunChild(ChildArgs("layer-time", layer, n, inner))["time_ms"]);
        std::printf("  layer-time %-5s N=%-6ld round %d: %.2f ms\n", layer.c_str(), n, r,
                    times[{layer, n}].back());
        std::fflush(stdout);
      }
    }
  }
  std::printf(
      "\nP2a TSSA layer (qkv D->D, tost::tssa, to_out) vs softmax-attention layer (qkv D->3D, "
      "at::scaled_dot_product_attention, proj), D=%ld, %ld heads, batch 1\n",
      kChannels, kHeads);
  std::printf("  %6s %12s %12s %9s\n", "N", "TSSA ms", "SDPA ms", "SDPA/TSSA");
  for (const int64_t n : tokens) {
    const double t = Median(times[{"tssa", n}]), s = Median(times[{"sdpa", n}]);
    std::printf("  %6ld %12.2f %12.2f %8.1fx\n", n, t, s, s / t);
  }
}

void RunLayerMemorySection(const Args& args) {
  const std::vector<int64_t> tokens =
      args.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 2048, 4096, 8192};
  std::map<std::pair<std::string, int64_t>, double> peak;
  for (const int64_t n : tokens) {
    for (const std::string layer : {"tssa", "materialised", "sdpa"}) {
      peak[{layer, n}] = RunChild(ChildArgs("layer-memory", layer, n, 1))["peak_bytes"];
      std::printf("  layer-memory %-12s N=%-6ld peak %.1f MiB\n", layer.c_str(), n,
                  peak[{layer, n}] / (1 << 20));
      std::fflush(stdout);
    }
  }
  std::printf("\nP2b peak memory of one forward (VmHWM growth, own process each), D=%ld, batch 1\n",
              kChannels);
  std::printf("  %6s %12s %18s %9s %12s\n", "N", "TSSA MiB", "softmax(QK^T)V MiB", "ratio",
              "SDPA MiB");
  for (const int64_t n : tokens) {
    const double t = peak[{"tssa", n}], m = peak[{"materialised", n}], s = peak[{"sdpa", n}];
    std::printf("  %6ld %12.1f %18.1f %8.1fx %12.1f\n", n, t / (1 << 20), m / (1 << 20),
                m / std::max(t, 1.0), s / (1 << 20));
  }
}

int Main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  if (args.device != "cpu") {
    if (args.device != "cuda" && !HasPrefix(args.device, "cuda:")) {
      std::fprintf(stderr, "tssa_bench: --device expects cpu, cuda or cuda:N, got '%s'\n",
                   args.device.c_str());
      return 2;
    }
    // The GPU comparison lives in its own binary (it links LibTorch's CUDA libraries and builds in
    // the standalone kernels project a lent GPU machine compiles); this one hands over to it.
    const std::string gpu_bench =
        (std::filesystem::path(argv[0]).parent_path() / ".." / "kernels" / "gpu" / "tssa_gpu_bench")
            .string();
    const std::string device = "--device=" + args.device;
    std::fflush(stdout);
    if (args.quick) {
      execl(gpu_bench.c_str(), "tssa_gpu_bench", "--quick", device.c_str(),
            static_cast<char*>(nullptr));
    } else {
      execl(gpu_bench.c_str(), "tssa_gpu_bench", device.c_str(), static_cast<char*>(nullptr));
    }
    std::fprintf(stderr, "tssa_bench: --device=%s runs %s, which could not be started: %s\n",
                 args.device.c_str(), gpu_bench.c_str(), std::strerror(errno));
    return 2;
  }
  at::set_num_threads(args.threads > 0 ? args.threads
                                       : static_cast<int>(std::thread::hardware_concurrency()));
  if (!args.variant.empty()) return RunChildVariant(args);

  c10::InferenceMode guard;
  std::printf(
      "tssa_bench%s: %s, %d threads (%u CPUs), LibTorch %d.%d.%d CPU capability %s, last-level "
      "cache %.0f MiB, "
      "load average %s\n",
      args.quick ? " --quick" : "", CpuModel().c_str(), at::get_num_threads(),
      std::thread::hardware_concurrency(), TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
      TORCH_VERSION_PATCH, at::get_cpu_capability().c_str(), LastLevelCacheBytes() / 1048576.0,
      LoadAverage().c_str());
  bool ok = true;
  Bandwidth bw;
  if (Wants(args, "bandwidth") || Wants(args, "kernel")) {
    const int64_t bytes =
        args.quick ? (64 << 20) : std::max<int64_t>(4 * LastLevelCacheBytes(), 256 << 20);
    bw = MeasureBandwidth(bytes, args.quick ? 3 : 7);
    std::printf(
        "\nMemory bandwidth, %d threads, %.0f MiB arrays: read %.1f GB/s, copy %.1f GB/s, triad "
        "%.1f GB/s, "
        "memcpy %.1f GB/s\n",
        at::get_num_threads(), bytes / 1048576.0, bw.read_gbs, bw.copy_gbs, bw.triad_gbs,
        bw.memcpy_gbs);
  }
  if (Wants(args, "kernel")) ok = RunKernelSection(args, bw) && ok;
  if (Wants(args, "causal")) ok = RunCausalSection(args) && ok;
  if (Wants(args, "layer-time")) RunLayerTimeSection(args);
  if (Wants(args, "layer-memory")) RunLayerMemorySection(args);
  if (Wants(args, "decode-products")) RunDecodeProductsSection(args);
  std::printf("\nload average at the end: %s\n", LoadAverage().c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tost::bench

int main(int argc, char** argv) {
  try {
    return tost::bench::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tssa_bench: %s\n", e.what());
    return 1;
  }
}
