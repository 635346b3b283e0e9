#include "service/runtime/torch_models.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "service/runtime/warmup.h"

namespace tost::service {
namespace {

// A model's load error as clients read it (ListModels, ModelInfo, KServe's ModelReady trailer,
// every call to the model): the loaders name files by their paths, and where this server keeps
// its repository is its own business, so the paths are made relative to the repository (the
// model's folder name first). The start-up log has the error whole.
absl::Status ClientLoadStatus(const absl::Status& status, std::string repo_dir) {
  if (status.ok()) return status;
  while (repo_dir.size() > 1 && repo_dir.back() == '/') repo_dir.pop_back();
  std::string message(status.message());
  if (!repo_dir.empty() && repo_dir != "/") {
    absl::StrReplaceAll({{absl::StrCat(repo_dir, "/"), ""}}, &message);
  }
  return absl::Status(status.code(), message);
}

}  // namespace

class LoadedRepository::Classifier final : public ClassifierModel {
 public:
  explicit Classifier(const model::VisionModel& model) : model_(model) {}

  const model::ModelConfig& config() const override { return model_.config(); }

  absl::StatusOr<std::vector<float>> Classify(absl::Span<const float> pixels, int64_t images,
                                              int64_t height, int64_t width) const override {
    return model_.Forward(pixels, images, height, width);
  }

  absl::StatusOr<Explained> ClassifyWithMembership(absl::Span<const float> pixels, int64_t images,
                                                   int64_t height, int64_t width) const override {
    TOST_ASSIGN_OR_RETURN(model::VisionModel::Explained e,
                          model_.ForwardWithMembership(pixels, images, height, width));
    return Explained{std::move(e.logits), std::move(e.membership), e.grid_h, e.grid_w};
  }

 private:
  const model::VisionModel& model_;
};

class LoadedRepository::Generator final : public GenerativeModel {
 public:
  explicit Generator(const model::LanguageModel& model) : model_(model) {}

  const model::ModelConfig& config() const override { return model_.config(); }
  const model::Tokenizer& tokenizer() const override { return model_.tokenizer(); }
  model::SequenceState NewSequence() const override { return model_.NewSequence(); }

  absl::StatusOr<std::unique_ptr<model::StatePool>> NewStatePool(int64_t rows) const override {
    return model_.NewStatePool(rows);
  }

  absl::Status PrepareDecode(model::StatePool& pool, bool batch_invariant) const override {
    return model_.PrepareDecode(pool, batch_invariant);
  }

  absl::StatusOr<std::vector<float>> Prefill(absl::Span<const int32_t> tokens,
                                             model::StatePool& pool, int64_t row, int64_t position,
                                             int64_t chunk_tokens) const override {
    return model_.Prefill(tokens, pool, row, position, chunk_tokens);
  }

  absl::StatusOr<std::vector<model::DrawnToken>> ScorePrompt(absl::Span<const int32_t> tokens,
                                                             int32_t top_n) const override {
    return model_.ScorePrompt(tokens, top_n);
  }

  absl::StatusOr<std::vector<model::DrawnToken>> Step(
      absl::Span<const int32_t> tokens, model::StatePool& pool, absl::Span<const int64_t> rows,
      absl::Span<const int64_t> positions, absl::Span<const model::TokenDraw> draws,
      bool batch_invariant, const std::function<void()>& before_draw) const override {
    return model_.StepAndDraw(tokens, pool, rows, positions, draws, batch_invariant, before_draw);
  }

 private:
  const model::LanguageModel& model_;
};

LoadedRepository::~LoadedRepository() = default;

absl::StatusOr<std::unique_ptr<LoadedRepository>> LoadedRepository::Load(
    const std::string& repo_dir, const model::ServingOptions& serving) {
  std::unique_ptr<LoadedRepository> repo(new LoadedRepository());
  repo->repo_dir_ = repo_dir;
  TOST_ASSIGN_OR_RETURN(repo->models_, model::LoadRepository(repo_dir, serving));
  WarmUpModels(repo->models_);  // before readiness: SERVING only once every model has run once
  const size_t n = repo->models_.size();
  repo->classifiers_.resize(n);
  repo->generators_.resize(n);
  repo->weights_sha256_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    model::LoadedModel& m = repo->models_[i];
    if (!m.status.ok()) continue;
    if (m.vision != nullptr) repo->classifiers_[i] = std::make_unique<Classifier>(*m.vision);
    if (m.language != nullptr) {
      absl::StatusOr<std::string> sha = Sha256OfFile(m.dir + "/model.safetensors");
      if (!sha.ok()) {
        m.status = model::WithUtf8Message(sha.status());
        m.language.reset();
        continue;
      }
      repo->weights_sha256_[i] = *std::move(sha);
      repo->generators_[i] = std::make_unique<Generator>(*m.language);
    }
  }
  return repo;
}

std::vector<ModelEntry> LoadedRepository::Entries() const {
  std::vector<ModelEntry> out;
  for (size_t i = 0; i < models_.size(); ++i) {
    const model::LoadedModel& m = models_[i];
    ModelEntry e;
    e.name = m.name;
    e.load_status = ClientLoadStatus(m.status, repo_dir_);
    e.config = m.config;
    e.classifier = classifiers_[i].get();
    e.generator = generators_[i].get();
    e.weights_sha256 = weights_sha256_[i];
    e.placement = m.placement;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace tost::service
