// The served language model's quality at each weight precision on the CPU, against fp32: held-out
// bits/byte (docs/training.md's evaluation: cross-entropy of every validation target, end-of-text
// targets excluded, over the bytes the targets stand for) and teacher-forced greedy agreement
// (the fraction of positions whose argmax equals fp32's on the same prefix), through the parallel
// causal form (ForwardAll, the prefill path) over every window and through decode steps (Step)
// over the first --decode_windows windows.
//
// Input: the file tools/bench/precision_quality.py writes (int32 windows, count, length; int32
// tokens [windows, length]; uint8 mask [windows, length - 1], 1 where a target counts). Prints one
// JSON object per dtype, fp32 first, one a line. The driver script is the command to run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "model/config/config.h"
#include "model/config/device.h"
#include "model/nets/language_model.h"
#include "model/nets/torch_threads.h"

ABSL_FLAG(std::string, model_dir, "models/tost-austen", "Language model directory");
ABSL_FLAG(std::string, windows, "", "Validation windows (tools/bench/precision_quality.py)");
ABSL_FLAG(std::string, dtypes, "bf16,fp16", "Precisions compared with fp32 on the CPU");
ABSL_FLAG(int, decode_windows, 8, "Windows also run through decode steps, token by token");
ABSL_FLAG(int, intra_op_threads, 1, "LibTorch intra-op threads");

namespace {

using tost::model::ComputeDtype;
using tost::model::LanguageModel;

struct Windows {
  int32_t count = 0, length = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

bool ReadWindows(const std::string& path, Windows& w) {
  std::ifstream in(path, std::ios::binary);
  int32_t header[2];
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) return false;
  w.count = header[0], w.length = header[1];
  if (w.count <= 0 || w.length < 2) return false;
  w.tokens.resize(static_cast<size_t>(w.count) * w.length);
  w.mask.resize(static_cast<size_t>(w.count) * (w.length - 1));
  in.read(reinterpret_cast<char*>(w.tokens.data()), w.tokens.size() * sizeof(int32_t));
  in.read(reinterpret_cast<char*>(w.mask.data()), w.mask.size());
  return static_cast<bool>(in);
}

int32_t ArgMax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

double NatsOf(const float* logits, int64_t n, int32_t target) {
  const float m = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t k = 0; k < n; ++k) sum += std::exp(static_cast<double>(logits[k] - m));
  return std::log(sum) + m - logits[target];
}

// Per counted target of the parallel form: argmax and cross-entropy (nats).
struct Scored {
  std::vector<int32_t> argmax;
  double nats = 0, bytes = 0;
};

Scored ScoreAll(const LanguageModel& model, const Windows& w, const std::vector<double>& bytes_of) {
  const int64_t vocab = model.config().language.vocab_size, len = w.length - 1;
  Scored s;
  constexpr int64_t kBatch = 4;
  for (int64_t first = 0; first < w.count; first += kBatch) {
    const int64_t n = std::min<int64_t>(kBatch, w.count - first);
    std::vector<int32_t> inputs;
    for (int64_t i = first; i < first + n; ++i) {
      const int32_t* row = w.tokens.data() + i * w.length;
      inputs.insert(inputs.end(), row, row + len);
    }
    const auto logits = model.ForwardAll(inputs, n, len);
    if (!logits.ok()) {
      std::fprintf(stderr, "precision_quality: %s\n",
                   std::string(logits.status().message()).c_str());
      std::exit(1);
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < len; ++t) {
        const float* l = logits->data() + (i * len + t) * vocab;
        const int32_t target = w.tokens[(first + i) * w.length + t + 1];
        const bool counted = w.mask[(first + i) * len + t] != 0 && bytes_of[target] > 0;
        s.argmax.push_back(counted ? ArgMax(l, vocab) : -1);
        if (!counted) continue;
        s.nats += NatsOf(l, vocab, target);
        s.bytes += bytes_of[target];
      }
    }
  }
  return s;
}

// The argmax after each token of the first `windows` windows, fed one decode step at a time.
std::vector<int32_t> DecodeArgmax(const LanguageModel& model, const Windows& w, int windows) {
  const int64_t vocab = model.config().language.vocab_size;
  std::vector<int32_t> out;
  for (int i = 0; i < std::min(windows, w.count); ++i) {
    const int32_t* row = w.tokens.data() + static_cast<int64_t>(i) * w.length;
    tost::model::SequenceState s = model.NewSequence();
    auto logits = model.Prefill(absl::MakeConstSpan(row, 1), s);
    for (int32_t t = 1; logits.ok(); ++t) {
      out.push_back(ArgMax(logits->data(), vocab));
      if (t == w.length - 1) break;
      tost::model::SequenceState* states[] = {&s};
      logits = model.Step(absl::MakeConstSpan(row + t, 1), states);
    }
    if (!logits.ok()) {
      std::fprintf(stderr, "precision_quality: %s\n",
                   std::string(logits.status().message()).c_str());
      std::exit(1);
    }
  }
  return out;
}

double Agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] < 0) continue;
    ++total;
    same += a[i] == b[i];
  }
  return total > 0 ? static_cast<double>(same) / total : 0;
}

int Main() {
  tost::model::SetTorchThreads(absl::GetFlag(FLAGS_intra_op_threads));
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  Windows w;
  if (!ReadWindows(absl::GetFlag(FLAGS_windows), w)) {
    std::fprintf(stderr, "precision_quality: cannot read --windows=%s\n",
                 absl::GetFlag(FLAGS_windows).c_str());
    return 2;
  }
  const auto config = tost::model::LoadModelConfig(dir);
  if (!config.ok()) {
    std::fprintf(stderr, "precision_quality: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  std::vector<std::pair<std::string, ComputeDtype>> dtypes = {{"fp32", ComputeDtype::kFloat32}};
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    const auto d = tost::model::ParseComputeDtype(name, "--dtypes");
    if (!d.ok()) {
      std::fprintf(stderr, "precision_quality: %s\n", std::string(d.status().message()).c_str());
      return 2;
    }
    dtypes.emplace_back(std::string(name), *d);
  }
  Scored fp32_all;
  std::vector<int32_t> fp32_decode;
  for (const auto& [name, dtype] : dtypes) {
    const auto placement =
        tost::model::ResolvePlacement({tost::model::DeviceSpec::Kind::kCpu, 0}, dtype, std::nullopt,
                                      std::nullopt, 0, config->name);
    auto model = LanguageModel::Load(dir, *config, *placement);
    if (!model.ok()) {
      std::fprintf(stderr, "precision_quality: %s\n",
                   std::string(model.status().message()).c_str());
      return 1;
    }
    std::vector<double> bytes_of(config->language.vocab_size, 0);
    for (int32_t id = 0; id < config->language.vocab_size; ++id)
      bytes_of[id] = static_cast<double>((*model)->tokenizer().TokenBytes(id).size());
    if (config->language.eos_token_id >= 0) bytes_of[config->language.eos_token_id] = 0;
    const Scored all = ScoreAll(**model, w, bytes_of);
    const std::vector<int32_t> decode =
        DecodeArgmax(**model, w, absl::GetFlag(FLAGS_decode_windows));
    if (name == "fp32") fp32_all = all, fp32_decode = decode;
    const double bpb = all.nats / all.bytes / std::log(2.0);
    nlohmann::json r = {
        {"dtype", name},
        {"cpu_products", tost::model::CpuProductsName(placement->CpuProductsUsed())},
        {"bits_per_byte", bpb},
        {"targets", static_cast<int64_t>(std::count_if(all.argmax.begin(), all.argmax.end(),
                                                       [](int32_t a) { return a >= 0; }))},
        {"greedy_agreement_prefill", Agreement(fp32_all.argmax, all.argmax)},
        {"greedy_agreement_decode", Agreement(fp32_decode, decode)},
        {"decode_positions", static_cast<int64_t>(decode.size())}};
    if (name != "fp32") {
      const double fp32_bpb = fp32_all.nats / fp32_all.bytes / std::log(2.0);
      r["bits_per_byte_vs_fp32"] = bpb / fp32_bpb - 1;
    }
    std::printf("%s\n", r.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Held-out bits/byte and teacher-forced greedy agreement with fp32 of a language model at "
      "each CPU weight precision. Run through tools/bench/precision_quality.py.");
  absl::ParseCommandLine(argc, argv);
  return Main();
}
