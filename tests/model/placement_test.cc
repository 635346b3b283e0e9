// Models placed by a Placement (model/config/device.h): the shipped models in bfloat16 and float16
// agree with float32 (the dtype path that serves on CUDA, exercised here on the CPU, where LibTorch
// runs both precisions), and a model whose config.json asks for a CUDA device the process does not
// see fails alone while the rest of the repository loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/nets/language_model.h"
#include "model/nets/model_repository.h"
#include "model/nets/vision_model.h"

namespace tost::model {
namespace {

namespace fs = std::filesystem;

std::string ShippedModel(const std::string& name) {
  return std::string(TOST_SOURCE_DIR) + "/models/" + name;
}

size_t ArgMax(const float* v, size_t n) { return std::max_element(v, v + n) - v; }

std::vector<float> Softmax(const float* v, size_t n) {
  const float m = *std::max_element(v, v + n);
  std::vector<float> p(v, v + n);
  float sum = 0;
  for (float& x : p) sum += (x = std::exp(x - m));
  for (float& x : p) x /= sum;
  return p;
}

class ReducedPrecisionTest : public ::testing::TestWithParam<ComputeDtype> {};

TEST_P(ReducedPrecisionTest, VisionAgreesWithFloat32) {
  const std::string dir = ShippedModel("tost-digits");
  const ModelConfig config = *LoadModelConfig(dir);
  const auto fp32 = VisionModel::Load(dir, config, Placement{});
  const auto reduced = VisionModel::Load(dir, config, Placement{false, 0, GetParam()});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ASSERT_TRUE(reduced.ok()) << reduced.status();
  const VisionConfig& c = config.vision;
  const int64_t images = 8, classes = c.num_classes;
  std::vector<float> pixels(images * c.in_chans * c.image_height * c.image_width);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.37f * i) * 1.5f;
  const auto a = (*fp32)->Forward(pixels, images, c.image_height, c.image_width);
  const auto b = (*reduced)->Forward(pixels, images, c.image_height, c.image_width);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t i = 0; i < images; ++i) {
    const float* la = a->data() + i * classes;
    const float* lb = b->data() + i * classes;
    EXPECT_EQ(ArgMax(la, classes), ArgMax(lb, classes)) << "image " << i;
    const std::vector<float> pa = Softmax(la, classes), pb = Softmax(lb, classes);
    for (int64_t k = 0; k < classes; ++k) EXPECT_NEAR(pa[k], pb[k], 0.05) << i << "," << k;
  }
}

TEST_P(ReducedPrecisionTest, LanguageModelAgreesWithFloat32) {
  const std::string dir = ShippedModel("tost-austen");
  const ModelConfig config = *LoadModelConfig(dir);
  const auto fp32 = LanguageModel::Load(dir, config, Placement{});
  const auto reduced = LanguageModel::Load(dir, config, Placement{false, 0, GetParam()});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  ASSERT_TRUE(reduced.ok()) << reduced.status();
  const std::vector<int32_t> prompt = (*fp32)->tokenizer().Encode(
      "It is a truth universally acknowledged, that a single man in possession of a good fortune");
  SequenceState sa = (*fp32)->NewSequence(), sb = (*reduced)->NewSequence();
  auto la = (*fp32)->Prefill(prompt, sa);
  auto lb = (*reduced)->Prefill(prompt, sb);
  ASSERT_TRUE(la.ok() && lb.ok());
  const size_t vocab = static_cast<size_t>(config.language.vocab_size);
  // Teacher-forced on float32's greedy sequence: the reduced-precision argmax agrees at most steps.
  int agree = 0;
  constexpr int kSteps = 32;
  for (int t = 0; t < kSteps; ++t) {
    const int32_t next = static_cast<int32_t>(ArgMax(la->data(), vocab));
    agree += ArgMax(lb->data(), vocab) == static_cast<size_t>(next);
    for (float v : *lb) ASSERT_TRUE(std::isfinite(v));
    SequenceState* a_states[] = {&sa};
    SequenceState* b_states[] = {&sb};
    const int32_t token[] = {next};
    la = (*fp32)->Step(token, a_states);
    lb = (*reduced)->Step(token, b_states);
    ASSERT_TRUE(la.ok() && lb.ok());
  }
  EXPECT_GE(agree, kSteps * 9 / 10) << "argmax agreement " << agree << "/" << kSteps;
  EXPECT_EQ(sa.position, sb.position);
}

INSTANTIATE_TEST_SUITE_P(DTypes, ReducedPrecisionTest,
                         ::testing::Values(ComputeDtype::kBFloat16, ComputeDtype::kFloat16),
                         [](const auto& info) { return ComputeDtypeName(info.param); });

TEST(Repository, AModelAskingForAnAbsentCudaDeviceFailsAloneWithTheReason) {
  const fs::path repo = fs::temp_directory_path() / "tost-placement-repo";
  fs::remove_all(repo);
  fs::create_directories(repo);
  fs::copy(ShippedModel("tost-digits"), repo / "tost-digits", fs::copy_options::recursive);
  fs::copy(ShippedModel("tost-austen"), repo / "tost-austen", fs::copy_options::recursive);
  // tost-digits asks for cuda:0 in its config.json.
  const fs::path config = repo / "tost-digits" / "config.json";
  std::string text;
  {
    std::ifstream in(config);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text.insert(text.find('{') + 1, R"("serving": {"device": "cuda:0"},)");
  std::ofstream(config) << text;

  ServingOptions serving;  // --device=auto on a machine without CUDA
  serving.cuda_device_count = 0;
  const auto models = LoadRepository(repo.string(), serving);
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 2u);
  const LoadedModel& lm = (*models)[0];
  const LoadedModel& digits = (*models)[1];
  EXPECT_TRUE(lm.status.ok()) << lm.status;
  EXPECT_EQ(lm.placement.DeviceString(), "cpu");
  EXPECT_EQ(digits.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(digits.status.message().find(
                "model \"tost-digits\" (config.json serving.device) asks for cuda:0 but this "
                "process sees 0 CUDA device(s)"),
            std::string::npos)
      << digits.status;
  fs::remove_all(repo);
}

}  // namespace
}  // namespace tost::model
