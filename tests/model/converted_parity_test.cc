// Official checkpoints converted by tools/convert_official.py, served by the C++ model, against the
// Python reference on the converted weights. The fixture (ctest `converted_fixtures`) builds
// randomly initialised checkpoints in the official key layouts (vision: tost_cab_tiny_12_p16 with
// its BatchNorm stem, num_batches_tracked included; LM: `_orig_mod.` keys, tied lm_head), converts
// them and stores the reference logits plus a negative control the C++ model must NOT match
// (vision: BatchNorm skipped, which a loader that dropped the running statistics or the fold
// would produce; LM: denom_bias ignored).
#include <filesystem>

#include "model/nets/model_repository.h"
#include "tests/model/test_util.h"

namespace tost::model {
namespace {

using testing::ParityDir;
using testing::RelativeMaxDiff;
using testing::TensorValues;

constexpr double kTolerance = 1e-4;  // max abs diff relative to the logits' scale, fp32

class ParityConvertedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ParityDir().empty()) GTEST_FAIL() << "TOST_PARITY_DIR is not set (run through ctest)";
  }
  static std::string CaseDir(const std::string& name) { return ParityDir() + "/converted/" + name; }

  LoadedModel Load(const std::string& name) {
    LoadedModel m = LoadModelDirectory(CaseDir(name));
    EXPECT_TRUE(m.status.ok()) << m.status;
    return m;
  }
  SafetensorsFile Fixture(const std::string& name) {
    auto f = SafetensorsFile::Open(CaseDir(name) + "/fixture.safetensors");
    EXPECT_TRUE(f.ok()) << f.status();
    return *std::move(f);
  }

  void Compare(const std::string& name, const std::vector<float>& got, const SafetensorsFile& fx,
               const std::string& negative) {
    const double right = RelativeMaxDiff(got, TensorValues<float>(fx, "logits"));
    const double wrong = RelativeMaxDiff(got, TensorValues<float>(fx, negative));
    EXPECT_LE(right, kTolerance) << name;
    EXPECT_GT(wrong, 100 * kTolerance)
        << name << ": the negative control (" << negative << ") would pass";
    std::printf("[converted] %s: relative max diff %.2e (%s: %.2e)\n", name.c_str(), right,
                negative.c_str(), wrong);
  }
};

TEST_F(ParityConvertedCheckpointTest, VisionTinyP16WithBatchNormStem) {
  const std::string name = "converted_vision_tiny_p16";
  LoadedModel m = Load(name);
  ASSERT_TRUE(m.status.ok());
  EXPECT_EQ(m.config.vision.embed_dim, 192);
  EXPECT_EQ(m.config.vision.depth, 12);
  EXPECT_EQ(m.config.vision.patch_size, 16);
  SafetensorsFile fx = Fixture(name);
  std::vector<int64_t> shape;
  const auto input = TensorValues<float>(fx, "input", &shape);
  ASSERT_EQ(shape.size(), 4u);
  auto logits = m.vision->Forward(input, shape[0], shape[2], shape[3]);
  ASSERT_TRUE(logits.ok()) << logits.status();
  Compare(name, *logits, fx, "logits_no_bn");
}

TEST_F(ParityConvertedCheckpointTest, LanguageModelFromCompiledCheckpoint) {
  for (const std::string name : {"converted_lm", "converted_lm_bias"}) {
    LoadedModel m = Load(name);
    ASSERT_TRUE(m.status.ok()) << name;
    SafetensorsFile fx = Fixture(name);
    std::vector<int64_t> shape;
    const auto tokens = TensorValues<int32_t>(fx, "tokens", &shape);
    ASSERT_EQ(shape.size(), 2u);
    auto logits = m.language->ForwardAll(tokens, shape[0], shape[1]);
    ASSERT_TRUE(logits.ok()) << logits.status();
    Compare(name, *logits, fx, "logits_no_denom_bias");

    // The streaming path reads the same converted tensors: chunked prefill of the first sequence
    // ends on the parallel form's last logits.
    const int64_t length = shape[1], vocab = m.config.language.vocab_size;
    SequenceState s = m.language->NewSequence();
    auto last =
        m.language->Prefill(absl::MakeConstSpan(tokens.data(), length), s, /*chunk_tokens=*/5);
    ASSERT_TRUE(last.ok()) << last.status();
    const auto expected = TensorValues<float>(fx, "logits");
    std::vector<float> ref(expected.begin() + (length - 1) * vocab,
                           expected.begin() + length * vocab);
    EXPECT_LE(RelativeMaxDiff(*last, ref), kTolerance) << name;
  }
}

}  // namespace
}  // namespace tost::model
