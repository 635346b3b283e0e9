// C++ model vs the Python reference oracle (tools/tost_reference.py) on randomised weights: every
// parameter and buffer is moved away from its init so that no path (γ, temp, denom_bias, BatchNorm
// statistics, the TSSA gate) hides. Each case also carries the oracle's output for a deliberately
// wrong TSSA (softmax over tokens); the same check must reject it, which shows the test can fail.
#include <filesystem>

#include "absl/strings/str_cat.h"

#include "model/nets/model_repository.h"
#include "model/sampling/sampler.h"
#include "tests/model/test_util.h"

namespace tost::model {
namespace {

using testing::ParityDir;
using testing::RelativeMaxDiff;
using testing::TensorValues;

constexpr double kTolerance = 1e-4;  // max abs diff relative to the logits' scale, fp32

class ParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ParityDir().empty()) GTEST_FAIL() << "TOST_PARITY_DIR is not set (run through ctest)";
  }
  LoadedModel Load(const std::string& name) {
    LoadedModel m = LoadModelDirectory(ParityDir() + "/" + name);
    EXPECT_TRUE(m.status.ok()) << m.status;
    return m;
  }
  // The small LM fixture placed as `placement` says (the CPU paths that stand in for CUDA's).
  std::unique_ptr<LanguageModel> LoadSmallLm(const Placement& placement = {}) {
    const std::string dir = ParityDir() + "/lm_small";
    auto config = LoadModelConfig(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    auto lm = LanguageModel::Load(dir, *config, placement);
    EXPECT_TRUE(lm.ok()) << lm.status();
    return lm.ok() ? *std::move(lm) : nullptr;
  }
  SafetensorsFile Fixture(const std::string& name) {
    auto f = SafetensorsFile::Open(ParityDir() + "/" + name + "/fixture.safetensors");
    EXPECT_TRUE(f.ok()) << f.status();
    return *std::move(f);
  }

  void CheckVision(const std::string& name) {
    LoadedModel m = Load(name);
    ASSERT_TRUE(m.status.ok());
    SafetensorsFile fx = Fixture(name);
    std::vector<int64_t> shape;
    const auto input = TensorValues<float>(fx, "input", &shape);
    ASSERT_EQ(shape.size(), 4u);
    auto logits = m.vision->Forward(input, shape[0], shape[2], shape[3]);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const double right = RelativeMaxDiff(*logits, TensorValues<float>(fx, "logits"));
    const double wrong = RelativeMaxDiff(*logits, TensorValues<float>(fx, "logits_wrong_tssa"));
    EXPECT_LE(right, kTolerance) << name;
    EXPECT_GT(wrong, 100 * kTolerance) << name << ": a wrong TSSA would pass this test";
    std::printf("[parity] %s: relative max diff %.2e (wrong TSSA: %.2e)\n", name.c_str(), right,
                wrong);
  }

  void CheckLanguage(const std::string& name) {
    LoadedModel m = Load(name);
    ASSERT_TRUE(m.status.ok());
    SafetensorsFile fx = Fixture(name);
    std::vector<int64_t> shape;
    const auto tokens = TensorValues<int32_t>(fx, "tokens", &shape);
    ASSERT_EQ(shape.size(), 2u);
    const int64_t batch = shape[0], length = shape[1], vocab = m.config.language.vocab_size;
    auto logits = m.language->ForwardAll(tokens, batch, length);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const auto expected = TensorValues<float>(fx, "logits");
    const double right = RelativeMaxDiff(*logits, expected);
    const double wrong = RelativeMaxDiff(*logits, TensorValues<float>(fx, "logits_wrong_tssa"));
    EXPECT_LE(right, kTolerance) << name;
    EXPECT_GT(wrong, 100 * kTolerance) << name << ": a wrong TSSA would pass this test";
    std::printf("[parity] %s: relative max diff %.2e (wrong TSSA: %.2e)\n", name.c_str(), right,
                wrong);

    // Streaming: one token at a time for both sequences in one batched Step must give the same
    // logits as the parallel form at every position.
    std::vector<SequenceState> states(batch, m.language->NewSequence());
    std::vector<SequenceState*> ptrs;
    for (auto& s : states) ptrs.push_back(&s);
    double worst = 0;
    for (int64_t t = 0; t < length; ++t) {
      std::vector<int32_t> step_tokens;
      for (int64_t b = 0; b < batch; ++b) step_tokens.push_back(tokens[b * length + t]);
      auto step = m.language->Step(step_tokens, ptrs);
      ASSERT_TRUE(step.ok()) << step.status();
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<float> row(step->begin() + b * vocab, step->begin() + (b + 1) * vocab);
        std::vector<float> ref(expected.begin() + (b * length + t) * vocab,
                               expected.begin() + (b * length + t + 1) * vocab);
        worst = std::max(worst, RelativeMaxDiff(row, ref));
      }
    }
    EXPECT_LE(worst, kTolerance) << name << ": streaming steps drift from the parallel form";
    std::printf("[parity] %s: streaming over %lld tokens, worst relative diff %.2e\n", name.c_str(),
                static_cast<long long>(length), worst);

    // Chunked prefill (odd chunk size) ends on the parallel form's last logits.
    SequenceState s = m.language->NewSequence();
    auto last =
        m.language->Prefill(absl::MakeConstSpan(tokens.data(), length), s, /*chunk_tokens=*/7);
    ASSERT_TRUE(last.ok()) << last.status();
    std::vector<float> ref(expected.begin() + (length - 1) * vocab,
                           expected.begin() + length * vocab);
    EXPECT_LE(RelativeMaxDiff(*last, ref), kTolerance);
    EXPECT_EQ(s.position, length);
  }
};

TEST_F(ParityTest, VisionTinyOfficialSizeAt224) { CheckVision("vision_tiny224"); }
TEST_F(ParityTest, VisionSmallNonSquare) { CheckVision("vision_small"); }
TEST_F(ParityTest, LanguageModelNoBiasStreamingAndChunked) { CheckLanguage("lm_small"); }
TEST_F(ParityTest, LanguageModelWithBias) { CheckLanguage("lm_bias"); }

TEST_F(ParityTest, ContextLengthIsEnforced) {
  LoadedModel m = Load("lm_small");
  ASSERT_TRUE(m.status.ok());
  const int64_t ctx = m.config.language.context_length;
  SequenceState s = m.language->NewSequence();
  std::vector<int32_t> tokens(ctx + 1, 65);
  auto r = m.language->Prefill(tokens, s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("context length"), std::string::npos) << r.status();
  EXPECT_EQ(s.position, 0) << "a refused prefill must leave the state untouched";
  tokens.resize(ctx);
  ASSERT_TRUE(m.language->Prefill(tokens, s).ok());
  SequenceState* ptrs[] = {&s};
  const int32_t next = 66;
  EXPECT_EQ(m.language->Step(absl::MakeConstSpan(&next, 1), ptrs).status().code(),
            absl::StatusCode::kOutOfRange);
}

// Prompt scoring on the model's device must give what ScoreTokens reads from the whole logits:
// in one block, and in blocks of a few positions (the bound that keeps a long prompt's logits off
// the device's memory), with the alternatives in the same order.
TEST_F(ParityTest, ScoringAPromptOnTheDeviceMatchesScoringItsWholeLogits) {
  const std::unique_ptr<LanguageModel> lm = LoadSmallLm();
  ASSERT_TRUE(lm != nullptr);
  const int64_t ctx = lm->config().language.context_length;
  const int64_t defined = lm->tokenizer().vocab_size();
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < std::min<int64_t>(ctx, 37); ++i) {
    tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % defined));
  }
  const auto length = static_cast<int64_t>(tokens.size());
  auto logits = lm->ForwardAll(tokens, 1, length);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const std::vector<DrawnToken> want = ScoreTokens(*logits, defined, tokens, 5);
  ASSERT_EQ(want.size(), tokens.size() - 1);
  for (const int64_t block_bytes : {LanguageModel::kDefaultScoreBlockBytes, defined * 8 * 5}) {
    auto got = lm->ScorePrompt(tokens, 5, block_bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("token ", i + 1, ", block of ", block_bytes, " bytes"));
      EXPECT_EQ((*got)[i].id, want[i].id);
      EXPECT_EQ((*got)[i].nonfinite_id, -1);
      EXPECT_NEAR((*got)[i].logprob, want[i].logprob, 1e-5);
      ASSERT_EQ((*got)[i].top_logprobs.size(), 5u);
      for (size_t j = 0; j < 5; ++j) {
        EXPECT_EQ((*got)[i].top_logprobs[j].first, want[i].top_logprobs[j].first);
        EXPECT_NEAR((*got)[i].top_logprobs[j].second, want[i].top_logprobs[j].second, 1e-5);
      }
    }
  }
  EXPECT_EQ(lm->ScorePrompt(absl::MakeConstSpan(tokens.data(), 1), 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(ctx + 1, 65);
  EXPECT_EQ(lm->ScorePrompt(too_long, 0).status().code(), absl::StatusCode::kOutOfRange);
}

// The serving path keeps statistics in pool rows on the model's device; it must compute exactly
// what the SequenceState path computes (bit for bit), touch no other row, and refuse bad rows
// before changing anything.
TEST_F(ParityTest, StatePoolRowsMatchSequenceStatesBitForBit) {
  LoadedModel m = Load("lm_small");
  ASSERT_TRUE(m.status.ok());
  const LanguageModel& lm = *m.language;
  auto pool = lm.NewStatePool(5);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int64_t width = (*pool)->floats_per_row();
  ASSERT_EQ(width, static_cast<int64_t>(lm.NewSequence().stats.size()));

  const std::vector<int32_t> prompt_a = {72, 101, 108, 108, 111, 44, 32, 119, 111};
  const std::vector<int32_t> prompt_b = {84, 104, 101};
  const std::vector<int64_t> rows = {3, 1};
  std::vector<SequenceState> states(2, lm.NewSequence());
  std::vector<int64_t> positions(2, 0);
  for (int i = 0; i < 2; ++i) {
    const auto& prompt = i == 0 ? prompt_a : prompt_b;
    auto want = lm.Prefill(prompt, states[i], /*chunk_tokens=*/4);
    auto got = lm.Prefill(prompt, **pool, rows[i], 0, /*chunk_tokens=*/4);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ(*want, *got);
    positions[i] = static_cast<int64_t>(prompt.size());
  }
  SequenceState* ptrs[] = {&states[0], &states[1]};
  for (int t = 0; t < 6; ++t) {
    const bool invariant = t % 2 == 1;
    const std::vector<int32_t> tokens = {static_cast<int32_t>(97 + t),
                                         static_cast<int32_t>(65 + t)};
    auto want = lm.Step(tokens, ptrs, invariant);
    auto got = lm.Step(tokens, **pool, rows, positions, invariant);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ(*want, *got) << "step " << t;
    for (auto& p : positions) ++p;
  }
  for (int i = 0; i < 2; ++i) {
    std::vector<float> row(width);
    ASSERT_TRUE((*pool)->Load(rows[i], absl::MakeSpan(row)).ok());
    EXPECT_EQ(row, states[i].stats) << "row " << rows[i];
  }
  for (int64_t untouched : {0, 2, 4}) {
    std::vector<float> row(width, 1.f);
    ASSERT_TRUE((*pool)->Load(untouched, absl::MakeSpan(row)).ok());
    EXPECT_EQ(row, std::vector<float>(width, 0.f)) << "row " << untouched << " was written";
  }

  // Refusals change nothing.
  std::vector<float> before(width);
  ASSERT_TRUE((*pool)->Load(3, absl::MakeSpan(before)).ok());
  const std::vector<int32_t> two = {1, 2};
  EXPECT_EQ(lm.Step(two, **pool, std::vector<int64_t>{3, 3}, positions).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lm.Step(two, **pool, std::vector<int64_t>{3, 5}, positions).status().code(),
            absl::StatusCode::kInvalidArgument);
  const int64_t ctx = m.config.language.context_length;
  EXPECT_EQ(lm.Step(two, **pool, rows, std::vector<int64_t>{ctx, 0}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(lm.Prefill(two, **pool, 7, 0).status().code(), absl::StatusCode::kOutOfRange);
  HostStatePool foreign(5, width);
  EXPECT_EQ(lm.Step(two, foreign, rows, positions).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> after(width);
  ASSERT_TRUE((*pool)->Load(3, absl::MakeSpan(after)).ok());
  EXPECT_EQ(before, after);
  EXPECT_EQ((*pool)->Store(5, after).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*pool)->Store(0, absl::MakeConstSpan(after).subspan(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

// The CUDA decode path pads every step to a bucket with scratch rows (decode_buckets.h). Forced on
// the CPU, with batch-invariant rows, it must give exactly the unpadded results at every batch
// size (crossing buckets 1, 2, 4, 6 of a 6-row pool) and never write a real row it was not given.
TEST_F(ParityTest, PaddedDecodeStepsMatchUnpaddedOnesBitForBit) {
  Placement padded_placement;
  padded_placement.pad_decode_steps = true;
  const std::unique_ptr<LanguageModel> plain = LoadSmallLm();
  const std::unique_ptr<LanguageModel> padded = LoadSmallLm(padded_placement);
  ASSERT_TRUE(plain != nullptr && padded != nullptr);
  auto plain_pool = plain->NewStatePool(6);
  auto padded_pool = padded->NewStatePool(6);
  ASSERT_TRUE(plain_pool.ok() && padded_pool.ok());
  EXPECT_EQ((*padded_pool)->decode_mode(), "eager");  // no graphs on the CPU
  // Readying the pool for decode captures nothing on the CPU, and a pool of another model is
  // refused.
  EXPECT_TRUE(padded->PrepareDecode(**padded_pool, /*batch_invariant=*/true).ok());
  EXPECT_EQ((*padded_pool)->decode_mode(), "eager");
  EXPECT_EQ(plain->PrepareDecode(**padded_pool, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*padded_pool)->rows(), 6);
  const int64_t width = (*plain_pool)->floats_per_row();
  std::vector<int64_t> positions(6, 0);
  for (int64_t r = 0; r < 6; ++r) {  // distinct prompts, so rows differ
    const std::vector<int32_t> prompt = {static_cast<int32_t>(40 + r), 50, 60};
    ASSERT_TRUE(plain->Prefill(prompt, **plain_pool, r, 0).ok());
    ASSERT_TRUE(padded->Prefill(prompt, **padded_pool, r, 0).ok());
    positions[r] = 3;
  }
  for (int64_t batch : {1, 3, 2, 5, 6, 4}) {
    // The last `batch` rows, in reverse order: padding must not depend on which rows step.
    std::vector<int64_t> rows, pos;
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < batch; ++i) {
      rows.push_back(5 - i);
      pos.push_back(positions[5 - i]);
      tokens.push_back(static_cast<int32_t>(70 + i + batch));
    }
    auto want = plain->Step(tokens, **plain_pool, rows, pos, /*batch_invariant=*/true);
    auto got = padded->Step(tokens, **padded_pool, rows, pos, /*batch_invariant=*/true);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ(*want, *got) << "batch " << batch;
    for (int64_t r : rows) ++positions[r];
  }
  for (int64_t r = 0; r < 6; ++r) {
    std::vector<float> a(width), b(width);
    ASSERT_TRUE((*plain_pool)->Load(r, absl::MakeSpan(a)).ok());
    ASSERT_TRUE((*padded_pool)->Load(r, absl::MakeSpan(b)).ok());
    EXPECT_EQ(a, b) << "row " << r;
  }
}

// A GPU model draws each step's tokens where its logits are (device_sampler.h). Forced on the
// CPU, that path must draw exactly what the host draw gives, step after step, for greedy rows,
// sampled rows with every cut, penalties and alternatives, constrained rows beside unconstrained
// ones, in one batch.
TEST_F(ParityTest, DrawingOnTheDeviceGivesTheHostDrawsTokens) {
  Placement on_device;
  on_device.draw_on_device = true;
  const std::unique_ptr<LanguageModel> host = LoadSmallLm();
  const std::unique_ptr<LanguageModel> device = LoadSmallLm(on_device);
  ASSERT_TRUE(host != nullptr && device != nullptr);
  auto host_pool = host->NewStatePool(4);
  auto device_pool = device->NewStatePool(4);
  ASSERT_TRUE(host_pool.ok() && device_pool.ok());
  std::vector<SamplingParams> params(4);
  params[0].temperature = 0;
  params[1].seed = 3;
  params[1].top_k = 20;
  params[1].top_p = 0.8f;
  params[2].seed = 4;
  params[2].temperature = 1.5f;
  params[2].min_p = 0.02f;
  params[2].repetition_penalty = 1.4f;
  params[3].seed = 5;
  params[3].temperature = 0.6f;
  std::vector<int32_t> tokens = {40, 41, 42, 43};
  const std::vector<int64_t> rows = {0, 1, 2, 3};
  std::vector<int64_t> positions(4, 0);
  std::vector<std::vector<int32_t>> recent(4);
  // Constrained generation's masks (TokenDraw::allowed) on rows 1 and 3: even ids, and ids 40-70.
  const int64_t vocab = host->config().language.vocab_size;
  std::vector<std::vector<uint32_t>> allowed(4);
  allowed[1].assign(static_cast<size_t>((vocab + 31) / 32), 0x55555555u);
  allowed[3].assign(static_cast<size_t>((vocab + 31) / 32), 0u);
  for (int32_t id = 40; id <= 70; ++id) allowed[3][id / 32] |= 1u << (id % 32);
  const auto allows = [&](size_t b, int32_t id) {
    return allowed[b].empty() || ((allowed[b][id / 32] >> (id % 32)) & 1u) != 0;
  };
  for (int step = 0; step < 24; ++step) {
    std::vector<TokenDraw> draws;
    for (size_t b = 0; b < 4; ++b) {
      draws.push_back(
          {params[b], static_cast<uint64_t>(positions[b] + 1), recent[b], static_cast<int32_t>(b)});
      draws.back().allowed = allowed[b];
    }
    auto want = host->StepAndDraw(tokens, **host_pool, rows, positions, draws);
    auto got = device->StepAndDraw(tokens, **device_pool, rows, positions, draws);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    for (size_t b = 0; b < 4; ++b) {
      ASSERT_EQ((*want)[b].id, (*got)[b].id) << "step " << step << " row " << b;
      EXPECT_TRUE(allows(b, (*got)[b].id)) << "step " << step << " row " << b;
      ASSERT_EQ((*want)[b].top_logprobs.size(), b);
      ASSERT_EQ((*got)[b].top_logprobs.size(), b);
      for (size_t j = 0; j < b; ++j) {
        EXPECT_EQ((*want)[b].top_logprobs[j].first, (*got)[b].top_logprobs[j].first);
        EXPECT_NEAR((*want)[b].top_logprobs[j].second, (*got)[b].top_logprobs[j].second, 1e-5f);
      }
      tokens[b] = (*want)[b].id;
      recent[b].push_back(tokens[b]);
      ++positions[b];
    }
  }
  const std::vector<TokenDraw> too_few(3);
  EXPECT_EQ(device->StepAndDraw(tokens, **device_pool, rows, positions, too_few).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ParityTest, StateSizeIsIndependentOfLength) {
  LoadedModel m = Load("lm_small");
  ASSERT_TRUE(m.status.ok());
  const auto& c = m.config.language;
  SequenceState s = m.language->NewSequence();
  const size_t before = s.ByteSize();
  std::vector<int32_t> tokens(200, 101);
  ASSERT_TRUE(m.language->Prefill(tokens, s).ok());
  EXPECT_EQ(s.ByteSize(), before);
  EXPECT_EQ(s.stats.size(), static_cast<size_t>(c.n_layer * (2 * c.n_embd + c.n_head)));
}

}  // namespace
}  // namespace tost::model
