// Generation benchmark (the targets P4, P5, P6 below), on a 4096-token-context causal ToST written
// with random weights into a temporary model repository:
//   P4  decode latency at position 4000 vs 100, ToST (tssa_step on fixed-size statistics) next to
//       a KV-cache transformer of equal size (SDPA over the cache) in the same run;
//   P5  per-session memory: ToST state bytes vs a KV cache of equal dims at 4096 tokens;
//   P6  aggregate decode tokens/s through the real tost_server with 64 concurrent streams vs 1,
//       driven by this C++ client (a Python client would compete for the 2 cores).
// Medians of interleaved repeats. --quick shrinks everything for CI.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <grpcpp/grpcpp.h>

#include "model/config/device.h"
#include "model/config/safetensors.h"
#include "model/config/tensor_list.h"
#include "model/device/device_memory.h"
#include "model/nets/language_model.h"
#include "model/nets/torch_device.h"
#include "model/nets/torch_threads.h"
#include "tests/bench/device_bandwidth.h"
#include "tost/v1/tost.grpc.pb.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  bool quick = false;
  std::string server_bin;
  int sessions = 64;
  int tokens = 64;  // per stream in P6
  int steps = 64;   // decode steps timed per position in P4
  // P4 positions; the ratio is the last over the first. More than two draw the latency curve.
  std::vector<int64_t> positions = {100, 4000};
  // The lean table's long prompt (--long_prompt_tokens; at most the bench LM's context, 4096).
  int long_prompt_tokens = 1024;
  // The lean table's row limit (--lean_max_rows): its largest step and its prefill chunk.
  int64_t lean_max_rows = 64;
  std::string json;  // also write the figures here as JSON
  // More tost_server flags for P6 (--server_arg=--cuda_graphs=false times eager decode).
  std::vector<std::string> server_args;
  // Where both models of P4 run and where P6's server runs (--device: cpu, cuda, cuda:N, auto).
  tost::model::Placement placement;
};

// The figures of one run, for --json.
struct Figures {
  std::vector<int64_t> positions;
  std::vector<double> tost_ms, kv_ms;
  double state_bytes = 0, kv_bytes = 0;
  double one_stream_tokens_per_s = 0, many_tokens_per_s = 0;
  int max_decode_batch = 0;
  std::string decode_mode;  // how P6's server decoded ("cuda graphs", "eager", "eager: why")
  // Fractions of the device's measured copy bandwidth: a decode step of B rows moves at least
  // step_bytes_fixed + B * step_bytes_per_row bytes (LanguageModel::DecodeStepBytes).
  double bandwidth_gbs = 0;
  int64_t step_bytes_fixed = 0, step_bytes_per_row = 0;
  std::vector<double> tost_fraction, kv_fraction;
  double one_stream_fraction = 0, many_fraction = 0;
  // The model's own decode steps in-process, 1 row vs `sessions` rows: the most P6 could reach.
  double step_one_ms = 0, step_many_ms = 0;
};

double FractionOfBandwidth(double bytes, double seconds, double bandwidth_gbs) {
  return bytes / seconds / 1e9 / bandwidth_gbs;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

tost::model::LanguageConfig BenchConfig(bool quick) {
  tost::model::LanguageConfig c;
  c.n_layer = quick ? 2 : 6;
  c.n_head = 6;
  c.n_embd = quick ? 96 : 384;
  c.context_length = 4096;
  c.vocab_size = 257;
  return c;
}

// Writes <repo>/bench-lm/{config.json, model.safetensors} with the official init (normal 0.02).
void WriteModel(const fs::path& repo, const tost::model::LanguageConfig& c) {
  const fs::path dir = repo / "bench-lm";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << "{\"name\":\"bench-lm\",\"architecture\":\"tost_lm\",\"trained\":false,"
      << "\"lm\":{\"n_layer\":" << c.n_layer << ",\"n_head\":" << c.n_head
      << ",\"n_embd\":" << c.n_embd << ",\"context_length\":" << c.context_length
      << ",\"vocab_size\":" << c.vocab_size << "},\"tokenizer\":{\"type\":\"byte\"}}";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<std::vector<float>> storage;
  std::vector<tost::model::StTensorToWrite> tensors;
  for (const auto& e : tost::model::LanguageTensorList(c)) {
    if (e.optional) continue;
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    std::vector<float> v(n);
    const bool ones = e.name.find("ln_") != std::string::npos ||
                      e.name.find("gamma") != std::string::npos ||
                      e.name.find("temp") != std::string::npos;
    const bool zeros = e.name.find("denom_bias") != std::string::npos;
    for (float& x : v) x = ones ? 1.f : zeros ? 0.f : normal(rng);
    storage.push_back(std::move(v));
    tensors.push_back({e.name, tost::model::StDtype::kF32, e.shape,
                       std::string_view(reinterpret_cast<const char*>(storage.back().data()),
                                        n * sizeof(float))});
  }
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      << tost::model::SerializeSafetensors(tensors);
}

// A GPT of the same dims with a KV cache: the softmax-attention baseline for P4/P5.
class KvCacheGpt {
 public:
  KvCacheGpt(const tost::model::LanguageConfig& c, const tost::model::Placement& placement)
      : c_(c) {
    const at::Device device = tost::model::TorchDevice(placement);
    auto w = [&](std::vector<int64_t> s) { return (at::randn(s) * 0.02).to(device); };
    wte_ = w({c.vocab_size, c.n_embd});
    wpe_ = w({c.context_length, c.n_embd});
    for (int64_t l = 0; l < c.n_layer; ++l) {
      layers_.push_back(
          {w({3 * c.n_embd, c.n_embd}), w({c.n_embd, c.n_embd}), w({4 * c.n_embd, c.n_embd}),
           w({c.n_embd, 4 * c.n_embd}),
           at::randn({1, c.n_head, c.context_length, c.n_embd / c.n_head}).to(device),
           at::randn({1, c.n_head, c.context_length, c.n_embd / c.n_head}).to(device)});
    }
    ln_ = at::ones({c.n_embd}).to(device);
  }
  // One decode step at `pos` (the cache holds positions < pos). The logits come back to the host,
  // as ToST's Step returns them (on a GPU this is also what waits for the step).
  at::Tensor Step(int64_t token, int64_t pos) {
    const int64_t p = c_.n_embd / c_.n_head;
    at::Tensor x = (wte_[token] + wpe_[pos]).view({1, c_.n_embd});
    for (auto& L : layers_) {
      const at::Tensor h = at::layer_norm(x, {c_.n_embd}, ln_, {}, 1e-5);
      const auto qkv = at::linear(h, L.qkv).view({1, 3, c_.n_head, 1, p}).unbind(1);
      L.k.select(2, pos).copy_(qkv[1].squeeze(2));
      L.v.select(2, pos).copy_(qkv[2].squeeze(2));
      const at::Tensor att = at::scaled_dot_product_attention(qkv[0], L.k.slice(2, 0, pos + 1),
                                                              L.v.slice(2, 0, pos + 1));
      x = x + at::linear(att.reshape({1, c_.n_embd}), L.proj);
      x = x + at::linear(at::gelu(at::linear(at::layer_norm(x, {c_.n_embd}, ln_, {}, 1e-5), L.fc)),
                         L.fc_out);
    }
    return at::matmul(at::layer_norm(x, {c_.n_embd}, ln_, {}, 1e-5), wte_.t()).to(at::kCPU);
  }
  // The least memory traffic of Step(token, pos), as LanguageModel::DecodeStepBytes counts ToST's:
  // every weight once (one position row), the cache read up to pos and written at pos, the logits.
  int64_t StepBytes(int64_t pos) const {
    int64_t weights = wte_.nbytes() + wpe_.nbytes() / c_.context_length + 3 * ln_.nbytes();
    for (const Layer& L : layers_)
      weights += L.qkv.nbytes() + L.proj.nbytes() + L.fc.nbytes() + L.fc_out.nbytes();
    return weights + CacheBytesPerSequence(pos + 1) + c_.vocab_size * 4;
  }
  int64_t CacheBytesPerSequence(int64_t tokens) const {
    return 2 * c_.n_layer * tokens * c_.n_embd * 4;
  }

 private:
  struct Layer {
    at::Tensor qkv, proj, fc, fc_out, k, v;
  };
  tost::model::LanguageConfig c_;
  at::Tensor wte_, wpe_, ln_;
  std::vector<Layer> layers_;
};

// The bench LM WriteModel wrote, placed as --device asks; exits on failure.
std::unique_ptr<tost::model::LanguageModel> LoadBenchLm(const fs::path& repo,
                                                        const tost::model::LanguageConfig& c,
                                                        const Args& args) {
  tost::model::ModelConfig cfg;
  cfg.name = "bench-lm";
  cfg.architecture = tost::model::Architecture::kLanguage;
  cfg.language = c;
  auto lm = tost::model::LanguageModel::Load((repo / "bench-lm").string(), cfg, args.placement);
  if (!lm.ok()) {
    std::fprintf(stderr, "load failed: %s\n", std::string(lm.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(lm);
}

void RunP4P5(const fs::path& repo, const tost::model::LanguageConfig& c, const Args& args,
             Figures& figures) {
  const std::unique_ptr<tost::model::LanguageModel> lm = LoadBenchLm(repo, c, args);
  // Decode through a state pool row, as the server decodes.
  auto pool = lm->NewStatePool(1);
  if (!pool.ok()) {
    std::fprintf(stderr, "state pool: %s\n", std::string(pool.status().message()).c_str());
    std::exit(1);
  }
  figures.step_bytes_fixed = lm->DecodeStepBytes(0);
  figures.step_bytes_per_row = lm->DecodeStepBytes(1) - figures.step_bytes_fixed;
  KvCacheGpt kv(c, args.placement);
  c10::InferenceMode inference;
  const std::vector<int64_t>& positions = args.positions;
  // ToST states at each position, by real prefill.
  std::vector<tost::model::SequenceState> states;
  for (int64_t pos : positions) {
    tost::model::SequenceState s = lm->NewSequence();
    std::vector<int32_t> prompt(pos);
    for (int64_t i = 0; i < pos; ++i) prompt[i] = static_cast<int32_t>(32 + i % 90);
    if (!lm->Prefill(prompt, s, 512).ok()) std::exit(1);
    states.push_back(std::move(s));
  }
  const int rounds = args.quick ? 3 : 7;
  std::vector<std::vector<double>> tost_ms(positions.size()), kv_ms(positions.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < positions.size(); ++i) {  // interleaved: 100, 4000, 100, 4000, ...
      if (!(*pool)->Store(0, states[i].stats).ok()) std::exit(1);
      const int32_t token = 65;
      const int64_t row = 0;
      auto t0 = Clock::now();
      for (int k = 0; k < args.steps; ++k) {
        const int64_t position = states[i].position + k;
        // What the server runs per step: the step and a greedy draw where the logits are.
        const tost::model::TokenDraw greedy{
            {.temperature = 0.f}, static_cast<uint64_t>(position), {}, 0};
        (void)lm->StepAndDraw(absl::MakeConstSpan(&token, 1), **pool, absl::MakeConstSpan(&row, 1),
                              absl::MakeConstSpan(&position, 1), absl::MakeConstSpan(&greedy, 1));
      }
      tost_ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
                           args.steps);
      t0 = Clock::now();
      for (int k = 0; k < args.steps; ++k) kv.Step(65, positions[i] + k % 64);
      kv_ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
                         args.steps);
    }
  }
  figures.positions = positions;
  for (size_t i = 0; i < positions.size(); ++i) {
    figures.tost_ms.push_back(Median(tost_ms[i]));
    figures.kv_ms.push_back(Median(kv_ms[i]));
    figures.tost_fraction.push_back(FractionOfBandwidth(static_cast<double>(lm->DecodeStepBytes(1)),
                                                        figures.tost_ms.back() / 1e3,
                                                        figures.bandwidth_gbs));
    figures.kv_fraction.push_back(
        FractionOfBandwidth(static_cast<double>(kv.StepBytes(positions[i])),
                            figures.kv_ms.back() / 1e3, figures.bandwidth_gbs));
  }
  const double t100 = figures.tost_ms.front(), t4000 = figures.tost_ms.back();
  const double k100 = figures.kv_ms.front(), k4000 = figures.kv_ms.back();
  if (positions.size() > 2) {
    std::printf("\nP4 curve (ms/token and fraction of bandwidth): position, ToST, KV-cache GPT\n");
    for (size_t i = 0; i < positions.size(); ++i) {
      std::printf("  %6lld %10.3f (%5.1f%%) %10.3f (%5.1f%%)\n",
                  static_cast<long long>(positions[i]), figures.tost_ms[i],
                  100 * figures.tost_fraction[i], figures.kv_ms[i], 100 * figures.kv_fraction[i]);
    }
  }
  std::printf(
      "\nP4 decode latency, one sequence (ms/token, median of %d interleaved rounds of %d steps)\n",
      rounds, args.steps);
  std::printf("  %-28s %10s %10s %8s\n", "model", "pos 100", "pos 4000", "ratio");
  const char* tost_label = !args.placement.cuda           ? "ToST (tssa_step)"
                           : args.placement.decode_graphs ? "ToST (tssa_step, graphs)"
                                                          : "ToST (tssa_step, eager)";
  std::printf("  %-28s %10.3f %10.3f %8.3f   (target <= 1.1)\n", tost_label, t100, t4000,
              t4000 / t100);
  std::printf("  %-28s %10.3f %10.3f %8.3f\n", "KV-cache GPT (SDPA)", k100, k4000, k4000 / k100);
  std::printf(
      "  fraction of the measured %.1f GB/s at pos 100 / 4000: ToST %.1f%% / %.1f%% (a step moves "
      "at least %.2f MB), KV cache %.1f%% / %.1f%%\n",
      figures.bandwidth_gbs, 100 * figures.tost_fraction.front(),
      100 * figures.tost_fraction.back(),
      static_cast<double>(figures.step_bytes_fixed + figures.step_bytes_per_row) / 1e6,
      100 * figures.kv_fraction.front(), 100 * figures.kv_fraction.back());
  const double state_bytes = static_cast<double>(states[0].ByteSize());
  const double kv_bytes = static_cast<double>(kv.CacheBytesPerSequence(4096));
  figures.state_bytes = state_bytes;
  figures.kv_bytes = kv_bytes;
  std::printf(
      "\nP5 memory per sequence: ToST state %.1f KB at any length; KV cache at 4096 tokens %.1f "
      "MB: %.0fx "
      "(target >= 1000x)\n",
      state_bytes / 1024, kv_bytes / (1 << 20), kv_bytes / state_bytes);
}

// One Generate stream; returns tokens received.
int Stream(tost::v1::Tost::Stub& stub, int tokens, int seed) {
  grpc::ClientContext ctx;
  tost::v1::GenerateRequest req;
  req.set_model("bench-lm");
  req.set_prompt_bytes("Once upon a time");
  req.set_max_new_tokens(tokens);
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(seed);
  auto reader = stub.Generate(&ctx, req);
  tost::v1::GenerateResponse msg;
  int n = 0;
  while (reader->Read(&msg)) n += msg.has_token() ? 1 : 0;
  return reader->Finish().ok() ? n : -1;
}

// P6's ceiling: the same model's decode steps in-process (a state pool, sampled draws as the
// server's streams ask for), one row against `sessions` rows, interleaved. What the server loses
// below this ratio is its streams' prompts, scheduling, streaming and gRPC; what this ratio lacks
// of 8x is the model's.
void RunP6InProcess(const fs::path& repo, const tost::model::LanguageConfig& c, const Args& args,
                    Figures& figures) {
  const std::unique_ptr<tost::model::LanguageModel> lm = LoadBenchLm(repo, c, args);
  const int64_t rows = args.sessions;
  auto pool = lm->NewStatePool(rows);
  if (!pool.ok()) {
    std::fprintf(stderr, "P6 in-process: %s\n", std::string(pool.status().message()).c_str());
    std::exit(1);
  }
  const std::vector<int32_t> prompt = {'O', 'n', 'c', 'e', ' ', 'u', 'p', 'o', 'n'};
  std::vector<int64_t> all_rows(rows), positions(rows, static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> tokens(rows, ' ');
  std::vector<tost::model::TokenDraw> draws(rows);
  for (int64_t r = 0; r < rows; ++r) {
    all_rows[r] = r;
    if (!lm->Prefill(prompt, **pool, r, 0).ok()) std::exit(1);
    draws[r].params.seed = static_cast<uint64_t>(r);  // temperature 1, as the server's streams
  }
  const auto step = [&](int64_t batch) {
    const auto n = static_cast<size_t>(batch);
    for (size_t b = 0; b < n; ++b) draws[b].position = static_cast<uint64_t>(positions[b] + 1);
    auto drawn = lm->StepAndDraw(
        absl::MakeConstSpan(tokens.data(), n), **pool, absl::MakeConstSpan(all_rows.data(), n),
        absl::MakeConstSpan(positions.data(), n), absl::MakeConstSpan(draws.data(), n));
    if (!drawn.ok()) std::exit(1);
    for (size_t b = 0; b < n; ++b) {
      tokens[b] = (*drawn)[b].id;
      ++positions[b];
    }
  };
  c10::InferenceMode inference;
  const int steps = args.quick ? 4 : 16;
  std::vector<double> one_ms, many_ms;
  for (int round = 0; round < (args.quick ? 2 : 5); ++round) {
    for (auto [batch, out] : {std::pair{int64_t{1}, &one_ms}, std::pair{rows, &many_ms}}) {
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) step(batch);
      out->push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps);
    }
  }
  figures.step_one_ms = Median(one_ms);
  figures.step_many_ms = Median(many_ms);
  const double one_tps = 1e3 / figures.step_one_ms;
  const double many_tps = 1e3 * static_cast<double>(rows) / figures.step_many_ms;
  std::printf(
      "\nP6 ceiling: the model's decode steps in-process (sampled, median of interleaved rounds)\n"
      "  1 row: %.3f ms/step = %.1f tokens/s; %lld rows: %.3f ms/step = %.1f tokens/s; ratio "
      "%.1fx\n",
      figures.step_one_ms, one_tps, static_cast<long long>(rows), figures.step_many_ms, many_tps,
      many_tps / one_tps);
}

// CPU: the lean decode step (model/nets/lean_decoder.h) against LibTorch's operators on the same
// weights, in-process, one state-pool step of B rows at a time (greedy draws), interleaved rounds.
// This is the table LanguageModel's lean row limits come from.
void RunLeanComparison(const fs::path& repo, const tost::model::LanguageConfig& c,
                       const Args& args) {
  if (args.placement.cuda) return;
  Args lean_args = args, torch_args = args;
  lean_args.placement.cpu_lean_decode_max_rows = args.lean_max_rows;
  torch_args.placement.cpu_lean_decode_max_rows = 0;
  const std::unique_ptr<tost::model::LanguageModel> lean = LoadBenchLm(repo, c, lean_args);
  const std::unique_ptr<tost::model::LanguageModel> torch = LoadBenchLm(repo, c, torch_args);
  std::vector<int64_t> batches =
      args.quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64};
  if (!args.quick && args.lean_max_rows > 64) batches.push_back(args.lean_max_rows);
  const int64_t rows = batches.back();
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(32 + i % 90);
  auto lean_pool = lean->NewStatePool(rows);
  auto torch_pool = torch->NewStatePool(rows);
  if (!lean_pool.ok() || !torch_pool.ok()) std::exit(1);
  std::vector<int64_t> all_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    all_rows[r] = r;
    if (!lean->Prefill(prompt, **lean_pool, r, 0).ok()) std::exit(1);
    if (!torch->Prefill(prompt, **torch_pool, r, 0).ok()) std::exit(1);
  }
  c10::InferenceMode inference;
  const int steps = args.quick ? 4 : 24;
  const int rounds = args.quick ? 2 : 5;
  // Medians of `rounds` interleaved timings of both models: {lean, LibTorch}.
  const auto interleaved = [&](const auto& time) {
    std::vector<double> lean_ms, torch_ms;
    for (int round = 0; round < rounds; ++round) {
      lean_ms.push_back(time(*lean, **lean_pool));
      torch_ms.push_back(time(*torch, **torch_pool));
    }
    return std::pair{Median(lean_ms), Median(torch_ms)};
  };
  std::printf(
      "\nCPU decode step, lean vs LibTorch operators (in-process, ms/step, median of %d "
      "interleaved rounds of %d steps at position ~100)\n  %6s %10s %10s %8s %12s\n",
      rounds, steps, "rows", "lean", "LibTorch", "ratio", "lean tok/s");
  for (int64_t batch : batches) {
    const auto n = static_cast<size_t>(batch);
    std::vector<int32_t> tokens(n, ' ');
    std::vector<tost::model::TokenDraw> draws(n);
    for (auto& d : draws) d.params.temperature = 0.f;
    const auto time_steps = [&](const tost::model::LanguageModel& lm,
                                tost::model::StatePool& pool) {
      std::vector<int64_t> positions(n, static_cast<int64_t>(prompt.size()));
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) {
        auto drawn = lm.StepAndDraw(
            absl::MakeConstSpan(tokens.data(), n), pool, absl::MakeConstSpan(all_rows.data(), n),
            absl::MakeConstSpan(positions.data(), n), absl::MakeConstSpan(draws.data(), n));
        if (!drawn.ok()) std::exit(1);
        for (auto& p : positions) ++p;
      }
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
    };
    const auto [a, b] = interleaved(time_steps);
    std::printf("  %6lld %10.3f %10.3f %8.2f %12.1f\n", static_cast<long long>(batch), a, b, a / b,
                1e3 * static_cast<double>(batch) / a);
  }
  // A short prompt's prefill, as a server request starts (the lean step takes chunks of at most
  // its row limit).
  std::printf("  %6s %10s %10s %8s   (prefill of one prompt, ms)\n", "tokens", "lean", "LibTorch",
              "ratio");
  for (int64_t n : {int64_t{4}, int64_t{16}, int64_t{64}}) {
    const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + n);
    const auto time_prefill = [&](const tost::model::LanguageModel& lm,
                                  tost::model::StatePool& pool) {
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) {
        if (!lm.Prefill(short_prompt, pool, 0, 0).ok()) std::exit(1);
      }
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
    };
    const auto [a, b] = interleaved(time_prefill);
    std::printf("  %6lld %10.3f %10.3f %8.2f\n", static_cast<long long>(n), a, b, a / b);
  }
  if (args.quick) return;
  // A long prompt as the server feeds it (--prefill_chunk_tokens 128): LibTorch's operators take
  // the 128-token chunks; the lean step takes chunks of its row limit.
  std::vector<int32_t> long_prompt(static_cast<size_t>(args.long_prompt_tokens));
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = prompt[i % prompt.size()];
  const auto time_long = [&](const tost::model::LanguageModel& lm, tost::model::StatePool& pool) {
    const int64_t chunk = &lm == lean.get() ? args.lean_max_rows : 128;
    const auto t0 = Clock::now();
    for (int64_t at = 0; at < static_cast<int64_t>(long_prompt.size()); at += 128) {
      const auto piece = absl::MakeConstSpan(long_prompt).subspan(at, 128);  // the tail shorter
      if (!lm.Prefill(piece, pool, 0, at, chunk).ok()) std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  const auto [a, b] = interleaved(time_long);
  std::printf(
      "  %6zu %10.3f %10.3f %8.2f   (lean in %lld-token chunks, LibTorch in 128; %.0f / %.0f "
      "tokens/s)\n",
      long_prompt.size(), a, b, a / b, static_cast<long long>(args.lean_max_rows),
      1e3 * long_prompt.size() / a, 1e3 * long_prompt.size() / b);
}

void RunP6(const fs::path& repo, const Args& args, Figures& figures) {
  int fds[2];
  if (pipe(fds) != 0) std::exit(1);
  const pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    const std::string repo_flag = "--model_repository=" + repo.string();
    const std::string slots = "--max_active_generations=" + std::to_string(args.sessions);
    const std::string device = "--device=" + args.placement.DeviceString();
    const std::string dtype =
        std::string("--dtype=") + tost::model::ComputeDtypeName(args.placement.dtype);
    // Metrics and HTTP on (as deployed), on free ports.
    std::vector<std::string> flags = {repo_flag, "--host=127.0.0.1", "--port=0",     slots, device,
                                      dtype,     "--metrics_port=0", "--http_port=0"};
    flags.insert(flags.end(), args.server_args.begin(), args.server_args.end());
    std::vector<char*> argv = {const_cast<char*>("tost_server")};
    for (std::string& f : flags) argv.push_back(f.data());
    argv.push_back(nullptr);
    execv(args.server_bin.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  char line[256] = {0};
  FILE* out = fdopen(fds[0], "r");
  if (fgets(line, sizeof(line), out) == nullptr) {
    std::fprintf(stderr, "tost_server did not start (%s)\n", args.server_bin.c_str());
    std::exit(1);
  }
  const std::string s(line);
  const std::string port = s.substr(s.rfind(':') + 1, s.find_last_not_of("\n") - s.rfind(':'));
  auto channel = grpc::CreateChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials());
  auto stub = tost::v1::Tost::NewStub(channel);
  Stream(*stub, 4, 0);  // warm-up

  const auto generator_status = [&] {
    tost::v1::ServerStatusResponse status;
    grpc::ClientContext ctx;
    stub->ServerStatus(&ctx, {}, &status);
    return status.generators_size() ? status.generators(0) : tost::v1::GeneratorStatus();
  };
  const int rounds = args.quick ? 1 : 3;
  std::vector<double> one, many, many_fraction;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    const int n1 = Stream(*stub, args.tokens, r);
    one.push_back(n1 / std::chrono::duration<double>(Clock::now() - t0).count());
    std::vector<int> got(args.sessions);
    std::vector<std::thread> threads;
    const tost::v1::GeneratorStatus before = generator_status();
    t0 = Clock::now();
    for (int i = 0; i < args.sessions; ++i)
      threads.emplace_back([&, i] { got[i] = Stream(*stub, args.tokens, 100 + i); });
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const tost::v1::GeneratorStatus after = generator_status();
    int total = 0;
    for (int g : got) total += std::max(g, 0);
    many.push_back(total / seconds);
    // The steps the server ran for these streams, each at least its fixed bytes plus its rows'.
    const double bytes = static_cast<double>(after.decode_steps() - before.decode_steps()) *
                             static_cast<double>(figures.step_bytes_fixed) +
                         static_cast<double>(after.decoded_tokens() - before.decoded_tokens()) *
                             static_cast<double>(figures.step_bytes_per_row);
    many_fraction.push_back(FractionOfBandwidth(bytes, seconds, figures.bandwidth_gbs));
  }
  tost::v1::ServerStatusResponse status;
  grpc::ClientContext ctx;
  stub->ServerStatus(&ctx, {}, &status);
  kill(child, SIGTERM);
  waitpid(child, nullptr, 0);
  const double a = Median(one), b = Median(many);
  figures.one_stream_tokens_per_s = a;
  figures.many_tokens_per_s = b;
  figures.one_stream_fraction = FractionOfBandwidth(
      static_cast<double>(figures.step_bytes_fixed + figures.step_bytes_per_row), 1.0 / a,
      figures.bandwidth_gbs);
  figures.many_fraction = Median(many_fraction);
  figures.max_decode_batch = status.generators_size() ? status.generators(0).max_decode_batch() : 0;
  figures.decode_mode = status.generators_size() ? status.generators(0).decode_mode() : "";
  std::printf(
      "\nP6 aggregate decode throughput through tost_server (%d tokens per stream, median of %d "
      "rounds)\n",
      args.tokens, rounds);
  std::printf(
      "  1 stream: %.1f tokens/s; %d streams: %.1f tokens/s; ratio %.1fx (target >= 8x); "
      "largest decode batch %d; decode: %s\n",
      a, args.sessions, b, b / a, figures.max_decode_batch, figures.decode_mode.c_str());
  std::printf("  fraction of the measured %.1f GB/s: 1 stream %.1f%%, %d streams %.1f%%\n",
              figures.bandwidth_gbs, 100 * figures.one_stream_fraction, args.sessions,
              100 * figures.many_fraction);
}

// The decode mode is free text from the server (a reason after "eager: ").
std::string JsonEscaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// Plain numbers, lists and one string: written by hand rather than linking a JSON library for it.
void WriteJson(const std::string& path, const Args& args, const tost::model::LanguageConfig& c,
               const Figures& f) {
  const auto list = [](const auto& v) {
    std::ostringstream o;
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    o << "]";
    return o.str();
  };
  std::ofstream out(path);
  out << "{\n  \"quick\": " << (args.quick ? "true" : "false")
      << ",\n  \"lm\": {\"n_layer\": " << c.n_layer << ", \"n_embd\": " << c.n_embd
      << ", \"n_head\": " << c.n_head << ", \"context_length\": " << c.context_length
      << "},\n  \"p4\": {\"positions\": " << list(f.positions)
      << ", \"tost_ms\": " << list(f.tost_ms) << ", \"kv_ms\": " << list(f.kv_ms)
      << ", \"tost_ratio\": " << f.tost_ms.back() / f.tost_ms.front()
      << ", \"kv_ratio\": " << f.kv_ms.back() / f.kv_ms.front()
      << ", \"tost_fraction_of_bandwidth\": " << list(f.tost_fraction)
      << ", \"kv_fraction_of_bandwidth\": " << list(f.kv_fraction)
      << ", \"step_bytes_fixed\": " << f.step_bytes_fixed
      << ", \"step_bytes_per_row\": " << f.step_bytes_per_row
      << "},\n  \"p5\": {\"state_bytes\": " << f.state_bytes
      << ", \"kv_bytes_4096\": " << f.kv_bytes << ", \"ratio\": " << f.kv_bytes / f.state_bytes
      << "},\n  \"p6\": {\"streams\": " << args.sessions
      << ", \"one_stream_tokens_per_s\": " << f.one_stream_tokens_per_s
      << ", \"many_tokens_per_s\": " << f.many_tokens_per_s
      << ", \"ratio\": " << f.many_tokens_per_s / f.one_stream_tokens_per_s
      << ", \"max_decode_batch\": " << f.max_decode_batch << ", \"decode_mode\": \""
      << JsonEscaped(f.decode_mode) << "\""
      << ", \"one_stream_fraction_of_bandwidth\": " << f.one_stream_fraction
      << ", \"many_fraction_of_bandwidth\": " << f.many_fraction
      << ", \"in_process_step_one_ms\": " << f.step_one_ms
      << ", \"in_process_step_many_ms\": " << f.step_many_ms
      << "},\n  \"device_copy_bandwidth_gbs\": " << f.bandwidth_gbs << "\n}\n";
  if (!out) {
    std::fprintf(stderr, "tost_generation_bench: cannot write --json %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  bool lean_table_only = false;  // --lean_table_only: the CPU lean-vs-LibTorch step table alone
  int intra_op_threads = 1;
  bool eager = false;  // --eager: CUDA decode steps launched one by one, in P4 and in P6's server
  // --device (cpu, cuda, cuda:N, auto) and --dtype (fp32, bf16, fp16: the weights on the CPU,
  // weights and activations on CUDA) place the model in-process and in P6's server; the KV-cache
  // baseline stays fp32.
  std::string device_text = "cpu", dtype_text = "fp32";
  args.server_bin =
      (fs::path(argv[0]).parent_path() / ".." / ".." / "service" / "tost_server").string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf(
          "tost_generation_bench [--quick] [--server_bin=PATH] [--sessions=64] [--tokens=64] "
          "[--steps=64] [--positions=100,4000] [--json=FILE] [--device=cpu|cuda|cuda:N|auto] "
          "[--dtype=fp32|bf16|fp16|int8] "
          "[--server_arg=FLAG ...] [--eager] [--lean_table_only] [--intra_op_threads=1] "
          "[--long_prompt_tokens=1024] [--lean_max_rows=64]\n"
          "Prints P4 (decode latency at position 4000 vs 100, ToST vs KV cache), P5 (state vs KV "
          "cache\n"
          "memory) and P6 (64-stream vs 1-stream decode throughput through tost_server).\n");
      return 0;
    }
    if (a == "--quick") args.quick = true;
    if (a.rfind("--server_bin=", 0) == 0) args.server_bin = a.substr(13);
    if (a.rfind("--sessions=", 0) == 0) args.sessions = std::stoi(a.substr(11));
    if (a.rfind("--tokens=", 0) == 0) args.tokens = std::stoi(a.substr(9));
    if (a.rfind("--steps=", 0) == 0) args.steps = std::stoi(a.substr(8));
    if (a.rfind("--json=", 0) == 0) args.json = a.substr(7);
    if (a.rfind("--server_arg=", 0) == 0) args.server_args.push_back(a.substr(13));
    if (a == "--eager") eager = true;
    if (a == "--lean_table_only") lean_table_only = true;
    if (a.rfind("--lean_max_rows=", 0) == 0) args.lean_max_rows = std::stoll(a.substr(16));
    if (a.rfind("--long_prompt_tokens=", 0) == 0) {
      args.long_prompt_tokens = std::stoi(a.substr(21));
    }
    if (a.rfind("--intra_op_threads=", 0) == 0) intra_op_threads = std::stoi(a.substr(19));
    if (a.rfind("--device=", 0) == 0) device_text = a.substr(9);
    if (a.rfind("--dtype=", 0) == 0) dtype_text = a.substr(8);
    if (a.rfind("--positions=", 0) == 0) {
      args.positions.clear();
      std::stringstream list(a.substr(12));
      for (std::string item; std::getline(list, item, ',');) {
        args.positions.push_back(std::stoll(item));
      }
      if (args.positions.size() < 2 || args.positions.front() < 1 ||
          args.positions.back() + 64 > 4096) {
        std::fprintf(stderr,
                     "tost_generation_bench: --positions expects at least two positions in "
                     "[1, 4032], got '%s'\n",
                     a.substr(12).c_str());
        return 2;
      }
    }
  }
  {
    auto spec = tost::model::ParseDeviceSpec(device_text, "--device");
    auto dtype = tost::model::ParseComputeDtype(dtype_text, "--dtype");
    auto placement = !spec.ok() ? absl::StatusOr<tost::model::Placement>(spec.status())
                     : !dtype.ok()
                         ? absl::StatusOr<tost::model::Placement>(dtype.status())
                         : tost::model::ResolvePlacement(*spec, *dtype, std::nullopt, std::nullopt,
                                                         tost::model::CudaDeviceCount(), "");
    if (!placement.ok()) {
      std::fprintf(stderr, "tost_generation_bench: %s\n",
                   std::string(placement.status().message()).c_str());
      return 2;
    }
    args.placement = *placement;
  }
  if (eager) {  // after --device, which sets the placement
    args.placement.decode_graphs = false;
    args.server_args.push_back("--cuda_graphs=false");
  }
  if (args.quick) {
    args.sessions = 8;
    args.tokens = 8;
    args.steps = 8;
  }
  // One intra-op thread, as tost_server by default (--intra_op_threads=N: more, in-process and in
  // P6's server).
  tost::model::SetTorchThreads(intra_op_threads);
  if (intra_op_threads != 1) {
    args.server_args.push_back("--intra_op_threads=" + std::to_string(intra_op_threads));
  }
  const fs::path repo = fs::temp_directory_path() / ("tost_gen_bench_" + std::to_string(getpid()));
  const auto config = BenchConfig(args.quick);
  WriteModel(repo, config);
  std::printf(
      "bench LM: %lld layers, C %lld, %lld heads, context %lld, %u threads, device %s, dtype "
      "%s%s\n",
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
      static_cast<long long>(config.n_head), static_cast<long long>(config.context_length),
      std::thread::hardware_concurrency(), args.placement.DeviceString().c_str(),
      tost::model::ComputeDtypeName(args.placement.dtype),
      args.placement.cuda ? ""
                          : (std::string(" (CPU products: ") +
                             tost::model::CpuProductsName(args.placement.CpuProductsUsed()) + ")")
                                .c_str());
  Figures figures;
  // One intra-op thread, as the server computes.
  figures.bandwidth_gbs =
      tost::bench::MeasureCopyBandwidthGBs(tost::model::TorchDevice(args.placement));
  std::printf("device copy bandwidth: %.1f GB/s (%s)\n", figures.bandwidth_gbs,
              args.placement.DeviceString().c_str());
  RunLeanComparison(repo, config, args);
  if (lean_table_only) {
    fs::remove_all(repo);
    return 0;
  }
  RunP4P5(repo, config, args, figures);
  RunP6InProcess(repo, config, args, figures);
  RunP6(repo, args, figures);
  if (!args.json.empty()) WriteJson(args.json, args, config, figures);
  fs::remove_all(repo);
  return 0;
}
