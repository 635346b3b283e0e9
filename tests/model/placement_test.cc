// Models placed by a Placement (model/config/device.h): the shipped models with bfloat16, float16
// and int8 weights on the CPU agree with float32 through each product path (this CPU's own and the
// widening fallback of CPUs without AVX-512), store their weights in half the bytes (a quarter for
// int8's dense layers), and carry sequence states across precisions; a model whose config.json asks
// for a CUDA device the process does not see fails alone while the rest of the repository loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>

#include "kernels/cpu/isa.h"
#include "model/nets/language_model.h"
#include "model/nets/linear_layer.h"
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

struct Reduced {
  ComputeDtype dtype;
  CpuProducts products;  // kFloat32: this CPU's path for the dtype
};

Placement CpuPlacement(ComputeDtype dtype, CpuProducts products = CpuProducts::kFloat32) {
  Placement p{false, 0, dtype};
  p.cpu_products = products;
  return p;
}

class ReducedPrecisionTest : public ::testing::TestWithParam<Reduced> {
 protected:
  Placement placement() const { return CpuPlacement(GetParam().dtype, GetParam().products); }
};

TEST_P(ReducedPrecisionTest, VisionAgreesWithFloat32) {
  const std::string dir = ShippedModel("tost-digits");
  const ModelConfig config = *LoadModelConfig(dir);
  const auto fp32 = VisionModel::Load(dir, config, Placement{});
  const auto reduced = VisionModel::Load(dir, config, placement());
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
  const auto reduced = LanguageModel::Load(dir, config, placement());
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

TEST_P(ReducedPrecisionTest, WeightsAreStoredInTheReducedBytes) {
  const std::string lm_dir = ShippedModel("tost-austen"), vision_dir = ShippedModel("tost-digits");
  const ModelConfig lm_config = *LoadModelConfig(lm_dir),
                    vision_config = *LoadModelConfig(vision_dir);
  const auto lm32 = LanguageModel::Load(lm_dir, lm_config, Placement{});
  const auto lm = LanguageModel::Load(lm_dir, lm_config, placement());
  const auto v32 = VisionModel::Load(vision_dir, vision_config, Placement{});
  const auto v = VisionModel::Load(vision_dir, vision_config, placement());
  ASSERT_TRUE(lm32.ok() && lm.ok() && v32.ok() && v.ok());
  const double v_ratio = static_cast<double>((*v)->ForwardMinBytes(0)) / (*v32)->ForwardMinBytes(0);
  if (GetParam().dtype == ComputeDtype::kInt8) {
    // What a decode step reads: the blocks' dense weights (c_attn and c_proj C → C, the MLP's
    // C → rC → C) at 1 byte and their float32 scales (one per output channel), the tied table at
    // bf16's 2 bytes (language_model.cc), the rest (norms, layer scales, temperatures) at 4.
    const LanguageConfig& c = lm_config.language;
    const int64_t dense = c.n_layer * (2 + 2 * c.mlp_ratio) * c.n_embd * c.n_embd;
    const int64_t scales = c.n_layer * (1 + 1 + c.mlp_ratio + 1) * c.n_embd * 4;
    const int64_t table = c.vocab_size * c.n_embd;
    const int64_t want = (*lm32)->DecodeStepBytes(0) - 3 * dense + scales - 2 * table;
    EXPECT_EQ((*lm)->DecodeStepBytes(0), want) << "of " << (*lm32)->DecodeStepBytes(0);
    // The classifier's stem, embeddings and norms stay float32: its dense layers are most of it.
    EXPECT_LT(v_ratio, 0.4) << (*v)->ForwardMinBytes(0) << " of " << (*v32)->ForwardMinBytes(0);
    return;
  }
  // What a decode step reads: every dense weight and the tied output projection at 2 bytes, the
  // norms, layer scales and TSSA temperatures (a few KB) at 4.
  const double lm_ratio =
      static_cast<double>((*lm)->DecodeStepBytes(0)) / (*lm32)->DecodeStepBytes(0);
  EXPECT_GT(lm_ratio, 0.49);
  EXPECT_LT(lm_ratio, 0.52) << (*lm)->DecodeStepBytes(0) << " of " << (*lm32)->DecodeStepBytes(0);
  // The classifier's stem, embeddings and norms stay float32: its dense layers are most of it.
  EXPECT_LT(v_ratio, 0.6) << (*v)->ForwardMinBytes(0) << " of " << (*v32)->ForwardMinBytes(0);
}

TEST_P(ReducedPrecisionTest, BatchedStepsAgreeWithFloat32AtEveryRowCount) {
  // Row counts cross the fp16 path's switch from its matrix-vector kernel to widened products.
  const std::string dir = ShippedModel("tost-austen");
  const ModelConfig config = *LoadModelConfig(dir);
  const auto fp32 = LanguageModel::Load(dir, config, Placement{});
  const auto reduced = LanguageModel::Load(dir, config, placement());
  ASSERT_TRUE(fp32.ok() && reduced.ok());
  const size_t vocab = static_cast<size_t>(config.language.vocab_size);
  for (int64_t rows : {1, 2, 3, 16}) {
    auto pa = (*fp32)->NewStatePool(rows);
    auto pb = (*reduced)->NewStatePool(rows);
    ASSERT_TRUE(pa.ok() && pb.ok());
    std::vector<int32_t> tokens;
    std::vector<int64_t> row_ids, positions;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int32_t> prompt =
          (*fp32)->tokenizer().Encode(std::string("Mr. Darcy said ") + char('a' + r));
      ASSERT_TRUE((*fp32)->Prefill(prompt, **pa, r, 0).ok());
      ASSERT_TRUE((*reduced)->Prefill(prompt, **pb, r, 0).ok());
      tokens.push_back(static_cast<int32_t>(r + 40));
      row_ids.push_back(r);
      positions.push_back(static_cast<int64_t>(prompt.size()));
    }
    const auto la = (*fp32)->Step(tokens, **pa, row_ids, positions);
    const auto lb = (*reduced)->Step(tokens, **pb, row_ids, positions);
    ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
    int agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = la->data() + r * vocab;
      const float* b = lb->data() + r * vocab;
      agree += ArgMax(a, vocab) == ArgMax(b, vocab);
      const std::vector<float> qa = Softmax(a, vocab), qb = Softmax(b, vocab);
      float worst = 0;
      for (size_t k = 0; k < vocab; ++k) worst = std::max(worst, std::abs(qa[k] - qb[k]));
      EXPECT_LT(worst, 0.03) << rows << " rows, row " << r;
    }
    EXPECT_GE(agree, rows * 3 / 4) << rows << " rows";
  }
}

// A state (what a session blob holds) made at one precision continues at another: statistics are
// float32 whatever the weights, so prefilling half a text at bf16/fp16 and the rest at fp32 (and
// the other way) gives the all-fp32 logits within reduced precision's error.
TEST_P(ReducedPrecisionTest, StatesCarryAcrossPrecisionsBothWays) {
  const std::string dir = ShippedModel("tost-austen");
  const ModelConfig config = *LoadModelConfig(dir);
  const auto fp32 = LanguageModel::Load(dir, config, Placement{});
  const auto reduced = LanguageModel::Load(dir, config, placement());
  ASSERT_TRUE(fp32.ok() && reduced.ok());
  const std::vector<int32_t> text = (*fp32)->tokenizer().Encode(
      "She was not sorry, however, to have the pleasure of walking with her sister in the "
      "shrubbery, and of telling her what had passed in the morning.");
  const size_t half = text.size() / 2;
  const absl::Span<const int32_t> first(text.data(), half),
      rest(text.data() + half, text.size() - half);
  SequenceState all = (*fp32)->NewSequence();
  const auto want = (*fp32)->Prefill(text, all);
  ASSERT_TRUE(want.ok());
  const size_t vocab = static_cast<size_t>(config.language.vocab_size);
  const std::vector<float> p_want = Softmax(want->data(), vocab);
  const LanguageModel* pairs[2][2] = {{fp32->get(), reduced->get()}, {reduced->get(), fp32->get()}};
  for (const auto& [a, b] : pairs) {
    SequenceState s = a->NewSequence();
    ASSERT_TRUE(a->Prefill(first, s).ok());
    // The state as a blob carries it: float32 statistics and a position, the same size for both.
    EXPECT_EQ(s.stats.size(), b->NewSequence().stats.size());
    const auto got = b->Prefill(rest, s);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(s.position, all.position);
    EXPECT_EQ(ArgMax(got->data(), vocab), ArgMax(want->data(), vocab));
    const std::vector<float> p = Softmax(got->data(), vocab);
    for (size_t k = 0; k < vocab; ++k) ASSERT_NEAR(p[k], p_want[k], 0.03) << k;
  }
}

// int8 is held to the same bounds: they are what greedy decoding and sampling see (the argmax,
// the distribution within 0.03-0.05). Its layers' products err by about 0.8 % of their largest
// output (Int8Linear below) against bf16's 0.2 %, but the errors are independent across channels
// and the tied output projection is bf16's, so the logits move little: tost-austen's held-out
// greedy agreement is 99.4 % at int8 against 99.6 % at bf16 (precision_quality).
INSTANTIATE_TEST_SUITE_P(DTypes, ReducedPrecisionTest,
                         ::testing::Values(Reduced{ComputeDtype::kBFloat16, CpuProducts::kFloat32},
                                           Reduced{ComputeDtype::kFloat16, CpuProducts::kFloat32},
                                           Reduced{ComputeDtype::kBFloat16, CpuProducts::kWiden},
                                           Reduced{ComputeDtype::kFloat16, CpuProducts::kWiden},
                                           Reduced{ComputeDtype::kInt8, CpuProducts::kFloat32}),
                         [](const auto& info) {
                           return std::string(ComputeDtypeName(info.param.dtype)) +
                                  (info.param.products == CpuProducts::kWiden ? "_widened"
                                                                              : "_this_cpu");
                         });

// One int8 layer at the bench LM's 384 → 1152, through both product paths (up to 8 rows the
// int8-weight product, more rows the bf16 widening): the weight is stored as int8 (a quarter of
// float32's bytes plus one float32 scale per output channel), and y agrees with float32's x·Wᵀ + b.
// Tolerance: each weight moves by up to half a step (absmax/254 of its row), uniformly, so by
// about step/√12 ≈ 0.75 % of a Gaussian row's σ (absmax ≈ 3.3σ at 384), and the activations and
// product are rounded to bf16 (2⁻⁹ relative); summed over 384 random-sign terms that is about
// 0.8 % of the outputs' scale (0.73-0.87 % of the largest output measured at 1-64 rows). 2 % of
// the largest output holds with margin and still catches a wrong scale or a transposed weight
// (errors of order 100 %).
TEST(Int8Linear, StoresInt8AndAgreesWithFloat32OnBothPaths) {
  at::manual_seed(7);
  const at::Tensor w = at::randn({1152, 384}).mul_(0.02), b = at::randn({1152}).mul_(0.1);
  Linear fp32(w, b), int8(w, b);
  fp32.Place(at::kCPU, at::kFloat);
  int8.Place(at::kCPU, at::kChar, CpuProducts::kInt8);
  EXPECT_EQ(int8.weight_dtype(), at::kChar);
  EXPECT_EQ(int8.nbytes(), 1152 * 384 + 1152 * 4 + 1152 * 4) << "int8 weight, scales, bias";
  EXPECT_EQ(fp32.nbytes(), (1152 * 384 + 1152) * 4);
  for (int64_t rows : {1, 2, 8, 9, 64}) {
    const at::Tensor x = at::randn({rows, 384});
    const at::Tensor want = fp32(x), got = int8(x);
    ASSERT_EQ(got.scalar_type(), at::kFloat);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double err = got.sub(want).abs().max().item<double>();
    EXPECT_LT(err, 0.02 * want.abs().max().item<double>()) << rows << " rows";
  }
  // A batch of sequences [B, T, C] keeps its shape.
  EXPECT_EQ(int8(at::randn({2, 3, 384})).sizes(), (std::vector<int64_t>{2, 3, 1152}));
}

// widen-to-fp32 (CPUs without AVX-512) keeps 16-bit weights in 16 bits at rest: the float32 weight
// exists only inside each product call, so the weights take half of fp32's memory.
TEST(WidenedLinear, KeepsSixteenBitWeightsInSixteenBits) {
  at::manual_seed(9);
  const at::Tensor w = at::randn({1152, 384}).mul_(0.02), b = at::randn({1152}).mul_(0.1);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    Linear widened(w, b);
    widened.Place(at::kCPU, dtype, CpuProducts::kWiden);
    EXPECT_EQ(widened.weight_dtype(), dtype);
    EXPECT_EQ(widened.nbytes(), 1152 * 384 * 2 + 1152 * 4) << "16-bit weight, float32 bias";
    const at::Tensor x = at::randn({3, 384});
    const at::Tensor want = at::linear(x, w.to(dtype).to(at::kFloat), b);
    EXPECT_TRUE(at::allclose(widened(x), want, 1e-5, 1e-6)) << dtype;
  }
}

// The start-up log's name for int8 (device.cc, from CPUID and ATEN_CPU_CAPABILITY) says the path
// the lean step's kernels take (kernels/cpu/isa.cc, from the same): VNNI quads, float32 tiles
// (AVX2, or AVX-512 without BF16/VNNI) or the widening product.
TEST(Int8Linear, StartUpNameIsThePathTheKernelsTake) {
  EXPECT_EQ(
      std::string(CpuProductsName(CpuProducts::kInt8)),
      "int8-weights/" + std::string(kernels::cpu::Int8ProductsName(kernels::cpu::ActiveCpuIsa())))
      << CpuPrecisionFlags();
}

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
