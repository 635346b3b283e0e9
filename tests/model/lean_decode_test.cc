// The lean CPU decode step (model/nets/lean_decoder.h) against LibTorch's step, on the shipped
// tost-austen at every CPU precision: the same logits within the products' rounding, the same
// statistics, the same greedy continuation, each row's result bit-identical whatever shares its
// step, and short prefill chunks through it against LibTorch's scan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/nets/language_model.h"
#include "model/nets/lean_row_limits.h"

namespace tost::model {
namespace {

std::string Austen() { return std::string(TOST_SOURCE_DIR) + "/models/tost-austen"; }

Placement CpuPlacement(ComputeDtype dtype, bool lean) {
  Placement p{false, 0, dtype};
  // Lean at every row count the tests step, whatever the dtype's own limit.
  p.cpu_lean_decode_max_rows = lean ? 64 : 0;
  return p;
}

// The row limits follow the measured crossings per class of CPU (lean_row_limits.cc): int8 lean to
// the 128-token prefill chunk everywhere; bf16 to 64 with the dot products or at AVX2, to 16 where
// oneDNN's products are faster: AVX-512 without BF16 and, above all, AMX tiles, which win past 16
// rows even against the dot products.
TEST(LeanRowLimits, FollowTheMeasuredCrossingsPerCpuClass) {
  const LeanCpuClass avx2{.avx2 = true};
  const LeanCpuClass avx512{};
  const LeanCpuClass avx512_dots{.dot_products = true};
  const LeanCpuClass amx{.dot_products = true, .amx_bf16 = true};
  for (const LeanCpuClass& cpu : {avx2, avx512, avx512_dots, amx}) {
    EXPECT_EQ(LeanMaxRows(ComputeDtype::kInt8, cpu), 128);
    EXPECT_EQ(LeanMaxRows(ComputeDtype::kFloat32, cpu), 64);
    EXPECT_EQ(LeanMaxRows(ComputeDtype::kFloat16, cpu), 64);
  }
  EXPECT_EQ(LeanMaxRows(ComputeDtype::kBFloat16, avx2), 64);
  EXPECT_EQ(LeanMaxRows(ComputeDtype::kBFloat16, avx512), 16);
  EXPECT_EQ(LeanMaxRows(ComputeDtype::kBFloat16, avx512_dots), 64);
  EXPECT_EQ(LeanMaxRows(ComputeDtype::kBFloat16, amx), 16);
}

size_t ArgMax(const float* v, size_t n) { return std::max_element(v, v + n) - v; }

// How far (relative to 1 + |value|) the lean step's statistics may be from LibTorch's: the
// products' rounding; at int8 the lean products also quantise their input rows to 8 bits where the
// CPU has VNNI (LibTorch's int8 products keep them in bfloat16).
double StateTolerance(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
      return 1e-4;
    case ComputeDtype::kInt8:
      return 8e-2;
    default:
      return 2e-2;
  }
}

class LeanDecodeTest : public ::testing::TestWithParam<ComputeDtype> {
 protected:
  void SetUp() override {
    config_ = *LoadModelConfig(Austen());
    auto lean = LanguageModel::Load(Austen(), config_, CpuPlacement(GetParam(), true));
    auto torch = LanguageModel::Load(Austen(), config_, CpuPlacement(GetParam(), false));
    ASSERT_TRUE(lean.ok() && torch.ok()) << lean.status() << torch.status();
    lean_ = *std::move(lean);
    torch_ = *std::move(torch);
  }

  // Prefills row r of a fresh pool of each model with its own prompt.
  std::vector<int64_t> PrefillRows(StatePool& a, StatePool& b, int64_t rows) {
    std::vector<int64_t> positions;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int32_t> prompt = lean_->tokenizer().Encode(
          std::string("It is a truth universally acknowledged, ") + char('a' + r % 26));
      EXPECT_TRUE(lean_->Prefill(prompt, a, r, 0).ok());
      EXPECT_TRUE(torch_->Prefill(prompt, b, r, 0).ok());
      positions.push_back(static_cast<int64_t>(prompt.size()));
    }
    return positions;
  }

  ModelConfig config_;
  std::unique_ptr<LanguageModel> lean_, torch_;
};

TEST_P(LeanDecodeTest, AgreesWithTheLibTorchStepAtEveryRowCount) {
  const size_t vocab = static_cast<size_t>(config_.language.vocab_size);
  // The LibTorch step rounds its products in the weights' precision at bf16 and fp16 (oneDNN and
  // the fp16 kernel write reduced-precision outputs); the lean step keeps float32 sums.
  const double tolerance = GetParam() == ComputeDtype::kFloat32 ? 2e-4 : 0.05;
  for (int64_t rows : {1, 2, 3, 5, 16}) {
    auto pa = lean_->NewStatePool(rows);
    auto pb = torch_->NewStatePool(rows);
    ASSERT_TRUE(pa.ok() && pb.ok());
    const std::vector<int64_t> positions = PrefillRows(**pa, **pb, rows);
    std::vector<int32_t> tokens;
    std::vector<int64_t> row_ids;
    for (int64_t r = 0; r < rows; ++r) {
      tokens.push_back(static_cast<int32_t>(17 + 31 * r));
      row_ids.push_back(r);
    }
    const auto la = lean_->Step(tokens, **pa, row_ids, positions);
    const auto lb = torch_->Step(tokens, **pb, row_ids, positions);
    ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = la->data() + r * vocab;
      const float* b = lb->data() + r * vocab;
      double worst = 0, scale = 0;
      for (size_t v = 0; v < vocab; ++v) {
        worst = std::max(worst, static_cast<double>(std::abs(a[v] - b[v])));
        scale = std::max(scale, static_cast<double>(std::abs(b[v])));
      }
      EXPECT_LT(worst, tolerance * scale) << rows << " rows, row " << r;
      if (GetParam() == ComputeDtype::kFloat32) {
        EXPECT_EQ(ArgMax(a, vocab), ArgMax(b, vocab)) << rows << " rows, row " << r;
      }
      // The statistics both steps wrote.
      std::vector<float> sa((*pa)->floats_per_row()), sb((*pb)->floats_per_row());
      ASSERT_TRUE((*pa)->Load(r, absl::MakeSpan(sa)).ok());
      ASSERT_TRUE((*pb)->Load(r, absl::MakeSpan(sb)).ok());
      for (size_t i = 0; i < sa.size(); ++i) {
        ASSERT_NEAR(sa[i], sb[i], StateTolerance(GetParam()) * (1 + std::abs(sb[i])))
            << rows << " rows, row " << r << ", state value " << i;
      }
    }
  }
}

TEST_P(LeanDecodeTest, ARowIsBitIdenticalAloneAndInABatch) {
  const int64_t rows = 5;
  const size_t vocab = static_cast<size_t>(config_.language.vocab_size);
  auto batch = lean_->NewStatePool(rows);
  auto alone = lean_->NewStatePool(rows);
  ASSERT_TRUE(batch.ok() && alone.ok());
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int32_t> prompt =
        lean_->tokenizer().Encode(std::string("Elizabeth ") + char('a' + r));
    ASSERT_TRUE(lean_->Prefill(prompt, **batch, r, 0).ok());
    ASSERT_TRUE(lean_->Prefill(prompt, **alone, r, 0).ok());
    positions.push_back(static_cast<int64_t>(prompt.size()));
  }
  const std::vector<int32_t> tokens = {5, 60, 700, 1500, 9};
  const std::vector<int64_t> row_ids = {0, 1, 2, 3, 4};
  const auto together = lean_->Step(tokens, **batch, row_ids, positions);
  ASSERT_TRUE(together.ok()) << together.status();
  for (int64_t r = 0; r < rows; ++r) {
    const auto one = lean_->Step({tokens[r]}, **alone, {r}, {positions[r]});
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_TRUE(std::equal(one->begin(), one->end(), together->begin() + r * vocab)) << "row " << r;
    std::vector<float> sa((*batch)->floats_per_row()), sb((*alone)->floats_per_row());
    ASSERT_TRUE((*batch)->Load(r, absl::MakeSpan(sa)).ok());
    ASSERT_TRUE((*alone)->Load(r, absl::MakeSpan(sb)).ok());
    EXPECT_EQ(sa, sb) << "row " << r;
  }
}

TEST_P(LeanDecodeTest, SequenceStateStepsContinueGreedilyLikeLibTorch) {
  // The SequenceState form (Gather/Scatter) through both steps: 24 greedy tokens.
  const std::vector<int32_t> prompt = lean_->tokenizer().Encode("Mr. Bennet was so odd a mixture");
  SequenceState a = lean_->NewSequence(), b = torch_->NewSequence();
  auto la = lean_->Prefill(prompt, a);
  auto lb = torch_->Prefill(prompt, b);
  ASSERT_TRUE(la.ok() && lb.ok());
  const size_t vocab = static_cast<size_t>(config_.language.vocab_size);
  int same = 0;
  const int steps = 24;
  for (int i = 0; i < steps; ++i) {
    const int32_t ta = static_cast<int32_t>(ArgMax(la->data(), vocab));
    const int32_t tb = static_cast<int32_t>(ArgMax(lb->data(), vocab));
    same += ta == tb;
    SequenceState* sa[] = {&a};
    SequenceState* sb[] = {&b};
    // Both continue from the same token, so one differing choice does not derail the rest.
    la = lean_->Step({tb}, sa);
    lb = torch_->Step({tb}, sb);
    ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
  }
  EXPECT_GE(same, GetParam() == ComputeDtype::kFloat32 ? steps : steps - 2);
  EXPECT_EQ(a.position, b.position);
}

TEST_P(LeanDecodeTest, ShortPrefillChunksAgreeWithLibTorchsScan) {
  // Chunks of 8 tokens: each goes through the lean step (rows sharing one state row, in order),
  // against LibTorch's chunked causal scan.
  const std::vector<int32_t> prompt = lean_->tokenizer().Encode(
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
      "must be in want of a wife.");
  ASSERT_GE(prompt.size(), 17u);  // three chunks at least, the last one partial or whole
  SequenceState a = lean_->NewSequence(), b = torch_->NewSequence();
  const auto la = lean_->Prefill(prompt, a, 8);
  const auto lb = torch_->Prefill(prompt, b, 8);
  ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
  const size_t vocab = static_cast<size_t>(config_.language.vocab_size);
  const bool fp32 = GetParam() == ComputeDtype::kFloat32;
  double worst = 0, scale = 0;
  for (size_t v = 0; v < vocab; ++v) {
    worst = std::max(worst, static_cast<double>(std::abs((*la)[v] - (*lb)[v])));
    scale = std::max(scale, static_cast<double>(std::abs((*lb)[v])));
  }
  EXPECT_LT(worst, (fp32 ? 2e-4 : 0.05) * scale);
  if (fp32) {
    EXPECT_EQ(ArgMax(la->data(), vocab), ArgMax(lb->data(), vocab));
  }
  ASSERT_EQ(a.position, b.position);
  for (size_t i = 0; i < a.stats.size(); ++i) {
    ASSERT_NEAR(a.stats[i], b.stats[i], StateTolerance(GetParam()) * (1 + std::abs(b.stats[i])))
        << "state value " << i;
  }
  // The path depends only on a chunk's length: the same prompt cut the same way gives the same
  // statistics bit for bit, through a pool row as through a SequenceState.
  auto pool = lean_->NewStatePool(2);
  ASSERT_TRUE(pool.ok());
  const auto lp = lean_->Prefill(prompt, **pool, 1, 0, 8);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_EQ(*lp, *la);
  std::vector<float> row((*pool)->floats_per_row());
  ASSERT_TRUE((*pool)->Load(1, absl::MakeSpan(row)).ok());
  EXPECT_EQ(row, a.stats);
}

INSTANTIATE_TEST_SUITE_P(Precisions, LeanDecodeTest,
                         ::testing::Values(ComputeDtype::kFloat32, ComputeDtype::kBFloat16,
                                           ComputeDtype::kFloat16, ComputeDtype::kInt8),
                         [](const ::testing::TestParamInfo<ComputeDtype>& info) {
                           return std::string(ComputeDtypeName(info.param));
                         });

}  // namespace
}  // namespace tost::model
