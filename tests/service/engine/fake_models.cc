#include "tests/service/engine/fake_models.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/split_mix.h"

namespace tost::service::testing {
namespace {

// Statistics stay below this prime, so every value and every intermediate product of Feed is an
// integer a float holds exactly.
constexpr int64_t kModulus = 65521;

}  // namespace

FakeLanguageModel::FakeLanguageModel(FakeLanguageOptions options)
    : options_(std::move(options)), tokenizer_(options_.vocab_size, options_.eos_token_id) {
  config_.name = options_.name;
  config_.architecture = model::Architecture::kLanguage;
  config_.language.n_layer = options_.n_layer;
  config_.language.n_head = options_.n_head;
  config_.language.n_embd = options_.n_embd;
  config_.language.context_length = options_.context_length;
  config_.language.vocab_size = options_.vocab_size;
  config_.language.eos_token_id = options_.eos_token_id;
  config_.language.tokenizer = "byte";
}

model::SequenceState FakeLanguageModel::NewSequence() const {
  model::SequenceState s;
  s.stats.assign(config_.language.n_layer * config_.language.state_floats_per_layer(), 0.f);
  return s;
}

void FakeLanguageModel::Feed(int32_t token, model::SequenceState& state) const {
  for (size_t i = 0; i < state.stats.size(); ++i) {
    const int64_t s = static_cast<int64_t>(state.stats[i]);
    const int64_t mixed = s * (31 + 2 * static_cast<int64_t>(i)) +
                          (int64_t{token} + 1) * (static_cast<int64_t>(i) + 1) + state.position + 1;
    state.stats[i] = static_cast<float>(mixed % kModulus);
  }
  ++state.position;
}

void FakeLanguageModel::Cut(model::SequenceState& state) const {
  if (!options_.cut_sensitive || state.stats.empty()) return;
  state.stats[0] = static_cast<float>((static_cast<int64_t>(state.stats[0]) * 7 + 3) % kModulus);
}

std::vector<float> FakeLanguageModel::Logits(const model::SequenceState& state) const {
  uint64_t h = base::SplitMix64(static_cast<uint64_t>(state.position));
  for (float s : state.stats)
    h = base::SplitMix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(s)));
  std::vector<float> logits(options_.vocab_size, -20.f);
  for (int64_t v = 32; v < 127 && v < options_.vocab_size; ++v) {
    logits[v] =
        static_cast<float>(base::SplitMix64(h ^ (static_cast<uint64_t>(v) << 40)) % 1024) / 128;
  }
  if (options_.eos_at_position >= 0 && state.position >= options_.eos_at_position &&
      options_.eos_token_id < options_.vocab_size) {
    logits[options_.eos_token_id] = 50.f;
  }
  return logits;
}

absl::Status FakeLanguageModel::CheckTokens(absl::Span<const int32_t> tokens) const {
  if (tokens.empty()) return absl::InvalidArgumentError("fake LM: no tokens to feed");
  for (int32_t t : tokens) {
    if (t < 0 || t >= options_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("fake LM: token ", t, " outside the vocab"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> FakeLanguageModel::Prefill(absl::Span<const int32_t> tokens,
                                                              model::SequenceState& state,
                                                              int64_t chunk_tokens) const {
  {
    absl::MutexLock lock(&mu_);
    prefill_sizes_.push_back(static_cast<int64_t>(tokens.size()));
    if (!prefill_failure_.ok()) return prefill_failure_;
  }
  if (absl::Status s = CheckTokens(tokens); !s.ok()) return s;
  if (chunk_tokens < 1) return absl::InvalidArgumentError("fake LM: chunk_tokens < 1");
  if (state.stats.size() != NewSequence().stats.size()) {
    return absl::InvalidArgumentError("fake LM: state of another model");
  }
  if (state.position + static_cast<int64_t>(tokens.size()) > options_.context_length) {
    return absl::OutOfRangeError(absl::StrCat("fake LM: position ", state.position, " + ",
                                              tokens.size(), " tokens exceeds the context of ",
                                              options_.context_length));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    Feed(tokens[i], state);
    if ((i + 1) % static_cast<size_t>(chunk_tokens) == 0 || i + 1 == tokens.size()) Cut(state);
  }
  return Logits(state);
}

absl::StatusOr<std::vector<float>> FakeLanguageModel::Step(
    absl::Span<const int32_t> tokens, absl::Span<model::SequenceState* const> states,
    bool batch_invariant) const {
  {
    absl::MutexLock lock(&mu_);
    step_batch_sizes_.push_back(static_cast<int32_t>(tokens.size()));
    if (!step_failure_.ok()) return step_failure_;
  }
  if (absl::Status s = CheckTokens(tokens); !s.ok()) return s;
  if (tokens.size() != states.size()) {
    return absl::InvalidArgumentError("fake LM: one token per state expected");
  }
  // Checked for every row first: a refused step leaves every state untouched, like the real one.
  for (const model::SequenceState* s : states) {
    if (s->stats.size() != NewSequence().stats.size()) {
      return absl::InvalidArgumentError("fake LM: state of another model");
    }
    if (s->position + 1 > options_.context_length) {
      return absl::OutOfRangeError(absl::StrCat("fake LM: position ", s->position,
                                                " is at the context length ",
                                                options_.context_length));
    }
  }
  std::vector<float> out;
  out.reserve(tokens.size() * options_.vocab_size);
  for (size_t b = 0; b < tokens.size(); ++b) {
    Feed(tokens[b], *states[b]);
    Cut(*states[b]);
    const std::vector<float> row = Logits(*states[b]);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

void FakeLanguageModel::FailPrefillWith(absl::Status status) {
  absl::MutexLock lock(&mu_);
  prefill_failure_ = std::move(status);
}

void FakeLanguageModel::OnEachPrefill(std::function<void(int64_t tokens)> hook) {
  absl::MutexLock lock(&mu_);
  prefill_hook_ = std::move(hook);
}

void FakeLanguageModel::FailStepsWith(absl::Status status) {
  absl::MutexLock lock(&mu_);
  step_failure_ = std::move(status);
}

std::vector<int32_t> FakeLanguageModel::step_batch_sizes() const {
  absl::MutexLock lock(&mu_);
  return step_batch_sizes_;
}

std::vector<int64_t> FakeLanguageModel::prefill_sizes() const {
  absl::MutexLock lock(&mu_);
  return prefill_sizes_;
}

int64_t FakeLanguageModel::step_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(step_batch_sizes_.size());
}

FakeClassifierModel::FakeClassifierModel(FakeVisionOptions options) : options_(std::move(options)) {
  config_.name = options_.name;
  config_.architecture = model::Architecture::kVision;
  model::VisionConfig& v = config_.vision;
  v.embed_dim = 8;
  v.depth = options_.depth;
  v.num_heads = options_.num_heads;
  v.patch_size = options_.patch_size;
  v.in_chans = options_.in_chans;
  v.num_classes = options_.num_classes;
  v.image_height = options_.image_height;
  v.image_width = options_.image_width;
  for (int64_t c = 0; c < options_.num_classes; ++c) v.labels.push_back(absl::StrCat("class", c));
  v.mean.assign(options_.in_chans, 0.5f);
  v.std.assign(options_.in_chans, 0.25f);
}

int64_t FakeClassifierModel::image_floats() const {
  return options_.in_chans * options_.image_height * options_.image_width;
}

std::vector<float> FakeClassifierModel::ExpectedLogits(absl::Span<const float> image) const {
  std::vector<float> logits(options_.num_classes, 0.f);
  for (int64_t c = 0; c < options_.num_classes; ++c) {
    for (size_t p = 0; p < image.size(); ++p) {
      logits[c] += static_cast<float>(static_cast<int64_t>(p) * (c + 3) % 7 - 3) * image[p];
    }
  }
  return logits;
}

absl::StatusOr<std::vector<float>> FakeClassifierModel::Run(absl::Span<const float> pixels,
                                                            int64_t images, int64_t height,
                                                            int64_t width) const {
  {
    absl::MutexLock lock(&mu_);
    batch_sizes_.push_back(images);
    if (held_) {
      ++waiting_;
      auto released = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !held_; };
      mu_.Await(absl::Condition(&released));
      --waiting_;
    }
    if (!failure_.ok()) return failure_;
  }
  if (height != options_.image_height || width != options_.image_width || images < 1 ||
      static_cast<int64_t>(pixels.size()) != images * image_floats()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake classifier: ", pixels.size(), " floats for ", images, " images of ",
                     height, "x", width, "; expected ", image_floats(), " per image at ",
                     options_.image_height, "x", options_.image_width));
  }
  std::vector<float> out;
  out.reserve(images * options_.num_classes);
  for (int64_t i = 0; i < images; ++i) {
    const std::vector<float> row =
        ExpectedLogits(pixels.subspan(i * image_floats(), image_floats()));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

absl::StatusOr<std::vector<float>> FakeClassifierModel::Classify(absl::Span<const float> pixels,
                                                                 int64_t images, int64_t height,
                                                                 int64_t width) const {
  return Run(pixels, images, height, width);
}

absl::StatusOr<ClassifierModel::Explained> FakeClassifierModel::ClassifyWithMembership(
    absl::Span<const float> pixels, int64_t images, int64_t height, int64_t width) const {
  absl::StatusOr<std::vector<float>> logits = Run(pixels, images, height, width);
  if (!logits.ok()) return logits.status();
  Explained e;
  e.logits = *std::move(logits);
  e.grid_h = height / options_.patch_size;
  e.grid_w = width / options_.patch_size;
  e.membership.assign(images * options_.depth * options_.num_heads * e.grid_h * e.grid_w,
                      1.f / static_cast<float>(options_.num_heads));
  return e;
}

void FakeClassifierModel::Hold() {
  absl::MutexLock lock(&mu_);
  held_ = true;
}

void FakeClassifierModel::Release() {
  absl::MutexLock lock(&mu_);
  held_ = false;
}

void FakeClassifierModel::AwaitCallsHeld(int n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return waiting_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

void FakeClassifierModel::FailWith(absl::Status status) {
  absl::MutexLock lock(&mu_);
  failure_ = std::move(status);
}

std::vector<int64_t> FakeClassifierModel::batch_sizes() const {
  absl::MutexLock lock(&mu_);
  return batch_sizes_;
}

// Host rows, with the Store/Load copies counted; the model computes on the rows directly.
class FakeLanguageModel::Pool final : public model::StatePool {
 public:
  Pool(const FakeLanguageModel& owner, int64_t rows, int64_t width)
      : owner_(owner), rows_(rows, width) {}
  int64_t rows() const override { return rows_.rows(); }
  int64_t floats_per_row() const override { return rows_.floats_per_row(); }
  absl::Status Store(int64_t row, absl::Span<const float> stats) override {
    {
      absl::MutexLock lock(&owner_.mu_);
      ++owner_.pool_stores_;
    }
    return rows_.Store(row, stats);
  }
  absl::Status Load(int64_t row, absl::Span<float> stats) const override {
    {
      absl::MutexLock lock(&owner_.mu_);
      ++owner_.pool_loads_;
      if (!owner_.pool_load_failure_.ok()) return owner_.pool_load_failure_;
    }
    return rows_.Load(row, stats);
  }
  // The row as a state at `position`, and back: the model's own access, not a copy to count.
  absl::StatusOr<model::SequenceState> Read(int64_t row, int64_t position) {
    if (row < 0 || row >= rows()) return absl::OutOfRangeError("fake LM: no such pool row");
    model::SequenceState s;
    s.position = position;
    const absl::Span<float> r = rows_.row(row);
    s.stats.assign(r.begin(), r.end());
    return s;
  }
  void Write(int64_t row, const model::SequenceState& s) {
    std::copy(s.stats.begin(), s.stats.end(), rows_.row(row).begin());
  }
  std::string decode_mode() const override { return owner_.decode_mode(); }

 private:
  const FakeLanguageModel& owner_;
  model::HostStatePool rows_;
};

absl::StatusOr<std::unique_ptr<model::StatePool>> FakeLanguageModel::NewStatePool(
    int64_t rows) const {
  if (rows < 1) return absl::InvalidArgumentError("fake LM: a pool needs at least one row");
  return std::make_unique<Pool>(*this, rows, static_cast<int64_t>(NewSequence().stats.size()));
}

absl::Status FakeLanguageModel::PrepareDecode(model::StatePool& pool, bool batch_invariant) const {
  if (dynamic_cast<Pool*>(&pool) == nullptr) {
    return absl::InvalidArgumentError("fake LM: a pool of another model");
  }
  absl::MutexLock lock(&mu_);
  prepare_decode_calls_.push_back(batch_invariant);
  return prepare_decode_failure_;
}

absl::StatusOr<std::vector<float>> FakeLanguageModel::Prefill(absl::Span<const int32_t> tokens,
                                                              model::StatePool& pool, int64_t row,
                                                              int64_t position,
                                                              int64_t chunk_tokens) const {
  auto* own = dynamic_cast<Pool*>(&pool);
  if (own == nullptr) return absl::InvalidArgumentError("fake LM: a pool of another model");
  auto state = own->Read(row, position);
  if (!state.ok()) return state.status();
  auto logits = Prefill(tokens, *state, chunk_tokens);
  if (logits.ok()) own->Write(row, *state);
  std::function<void(int64_t)> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = prefill_hook_;
  }
  if (hook) hook(static_cast<int64_t>(tokens.size()));
  return logits;
}

absl::StatusOr<std::vector<model::DrawnToken>> FakeLanguageModel::Step(
    absl::Span<const int32_t> tokens, model::StatePool& pool, absl::Span<const int64_t> rows,
    absl::Span<const int64_t> positions, absl::Span<const model::TokenDraw> draws,
    bool batch_invariant, const std::function<void()>& before_draw) const {
  auto* own = dynamic_cast<Pool*>(&pool);
  if (own == nullptr) return absl::InvalidArgumentError("fake LM: a pool of another model");
  if (rows.size() != tokens.size() || positions.size() != tokens.size() ||
      draws.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        "fake LM: one row, one position and one draw per token expected");
  }
  std::vector<model::SequenceState> states;
  std::vector<model::SequenceState*> ptrs;
  states.reserve(rows.size());
  for (size_t b = 0; b < rows.size(); ++b) {
    auto s = own->Read(rows[b], positions[b]);
    if (!s.ok()) return s.status();
    states.push_back(*std::move(s));
    ptrs.push_back(&states.back());
  }
  auto logits = Step(tokens, ptrs, batch_invariant);
  if (!logits.ok()) return logits.status();
  for (size_t b = 0; b < rows.size(); ++b) own->Write(rows[b], states[b]);
  if (before_draw) before_draw();
  return model::DrawTokens(*logits, tokenizer_.vocab_size(), draws);
}

int64_t FakeLanguageModel::pool_stores() const {
  absl::MutexLock lock(&mu_);
  return pool_stores_;
}

int64_t FakeLanguageModel::pool_loads() const {
  absl::MutexLock lock(&mu_);
  return pool_loads_;
}

void FakeLanguageModel::FailPoolLoadsWith(absl::Status status) {
  absl::MutexLock lock(&mu_);
  pool_load_failure_ = std::move(status);
}

void FakeLanguageModel::SetDecodeMode(std::string mode) {
  absl::MutexLock lock(&mu_);
  decode_mode_ = std::move(mode);
}

std::string FakeLanguageModel::decode_mode() const {
  absl::MutexLock lock(&mu_);
  return decode_mode_;
}

std::vector<bool> FakeLanguageModel::prepare_decode_calls() const {
  absl::MutexLock lock(&mu_);
  return prepare_decode_calls_;
}

void FakeLanguageModel::FailPrepareDecodeWith(absl::Status status) {
  absl::MutexLock lock(&mu_);
  prepare_decode_failure_ = std::move(status);
}

}  // namespace tost::service::testing
