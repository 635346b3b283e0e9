// --device/--dtype and config.json "serving": parsing and resolution against the CUDA devices the
// process sees (model/config/device.h). Torch-free.
#include "model/config/device.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/config/config.h"
#include "model/config/decode_buckets.h"

namespace tost::model {
namespace {

using Kind = DeviceSpec::Kind;

TEST(DeviceSpec, ParsesEveryForm) {
  EXPECT_EQ(ParseDeviceSpec("auto", "--device")->kind, Kind::kAuto);
  EXPECT_EQ(ParseDeviceSpec("cpu", "--device")->kind, Kind::kCpu);
  const DeviceSpec cuda = *ParseDeviceSpec("cuda", "--device");
  EXPECT_EQ(cuda.kind, Kind::kCuda);
  EXPECT_EQ(cuda.index, 0);
  const DeviceSpec cuda3 = *ParseDeviceSpec("cuda:3", "--device");
  EXPECT_EQ(cuda3.kind, Kind::kCuda);
  EXPECT_EQ(cuda3.index, 3);
  EXPECT_EQ(cuda3.ToString(), "cuda:3");
}

TEST(DeviceSpec, RefusesWhatIsNotADeviceNamingTheField) {
  for (const std::string bad :
       {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda:0:1", "cuda:99999999999", " cpu"}) {
    const auto spec = ParseDeviceSpec(bad, "serving.device");
    ASSERT_FALSE(spec.ok()) << "\"" << bad << "\"";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find("serving.device: expected auto, cpu, cuda or cuda:N"),
              std::string::npos)
        << spec.status();
  }
  const auto long_text = ParseDeviceSpec(std::string(5000, 'x'), "--device");
  EXPECT_LT(long_text.status().message().size(), 200u) << "a long value is quoted short";
}

TEST(ComputeDtype, ParsesShortAndLongNames) {
  EXPECT_EQ(*ParseComputeDtype("fp32", "--dtype"), ComputeDtype::kFloat32);
  EXPECT_EQ(*ParseComputeDtype("bfloat16", "--dtype"), ComputeDtype::kBFloat16);
  EXPECT_EQ(*ParseComputeDtype("fp16", "--dtype"), ComputeDtype::kFloat16);
  EXPECT_EQ(*ParseComputeDtype("int8", "serving.dtype"), ComputeDtype::kInt8);
  const auto bad = ParseComputeDtype("int4", "--dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--dtype: expected fp32, bf16, fp16 or int8, got \"int4\""),
            std::string::npos)
      << bad.status();
}

TEST(Placement, Int8IsRefusedOnCudaNamingTheModelTheFieldAndTheAllowedDtypes) {
  const auto server =
      ResolvePlacement({}, ComputeDtype::kInt8, std::nullopt, std::nullopt, 1, "lm");
  ASSERT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find(
                "model \"lm\" (--dtype): int8 is served on the CPU only, but the model's device "
                "is cuda:0; expected fp32, bf16 or fp16 on CUDA (or --device=cpu for int8)"),
            std::string::npos)
      << server.status();
  const auto flags = ResolvePlacement({}, ComputeDtype::kInt8, std::nullopt, std::nullopt, 1, "");
  EXPECT_NE(flags.status().message().find(
                "--dtype: int8 is served on the CPU only, but the server's device is cuda:0"),
            std::string::npos)
      << flags.status();
  const auto model = ResolvePlacement({Kind::kCuda, 0}, ComputeDtype::kFloat32, std::nullopt,
                                      ComputeDtype::kInt8, 1, "lm");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("model \"lm\" (config.json serving.dtype): int8"),
            std::string::npos)
      << model.status();
  EXPECT_NE(model.status().message().find("(or serving.device \"cpu\" for int8)"),
            std::string::npos)
      << model.status();
  // The same model on the CPU (auto without a GPU, or a per-model device) takes int8.
  const Placement cpu =
      *ResolvePlacement({}, ComputeDtype::kInt8, std::nullopt, std::nullopt, 0, "lm");
  EXPECT_EQ(cpu.dtype, ComputeDtype::kInt8);
  EXPECT_EQ(cpu.CpuProductsUsed(), CpuProducts::kInt8);
  EXPECT_TRUE(ResolvePlacement({Kind::kCuda, 0}, ComputeDtype::kInt8, DeviceSpec{Kind::kCpu, 0},
                               std::nullopt, 1, "lm")
                  .ok());
}

TEST(Placement, AutoTakesTheFirstCudaDeviceWhenThereIsOne) {
  const Placement gpu =
      *ResolvePlacement({}, ComputeDtype::kBFloat16, std::nullopt, std::nullopt, 2, "m");
  EXPECT_TRUE(gpu.cuda);
  EXPECT_EQ(gpu.index, 0);
  EXPECT_EQ(gpu.dtype, ComputeDtype::kBFloat16);
  EXPECT_EQ(gpu.DeviceString(), "cuda:0");
  const Placement cpu =
      *ResolvePlacement({}, ComputeDtype::kBFloat16, std::nullopt, std::nullopt, 0, "m");
  EXPECT_FALSE(cpu.cuda);
  EXPECT_EQ(cpu.dtype, ComputeDtype::kBFloat16) << "the CPU stores the weights in bf16 too";
  EXPECT_EQ(cpu.cpu_products, CpuProductsFor(ComputeDtype::kBFloat16));
  EXPECT_EQ(cpu.DeviceString(), "cpu");
}

TEST(Placement, CudaWhereThereIsNoneIsRefusedSayingWhatWasAskedAndWhatThereIs) {
  const DeviceSpec cuda{Kind::kCuda, 0};
  const auto server =
      ResolvePlacement(cuda, ComputeDtype::kFloat32, std::nullopt, std::nullopt, 0, "");
  ASSERT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find("--device asks for cuda:0 but this process sees 0"),
            std::string::npos)
      << server.status();
  const auto model = ResolvePlacement({}, ComputeDtype::kFloat32, DeviceSpec{Kind::kCuda, 2},
                                      std::nullopt, 2, "lm");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      model.status().message().find(
          "model \"lm\" (config.json serving.device) asks for cuda:2 but this process sees 2"),
      std::string::npos)
      << model.status();
  EXPECT_NE(model.status().message().find("cuda:0 to cuda:1"), std::string::npos);
}

TEST(Placement, AModelOverridesTheServersDeviceAndDtype) {
  const Placement p = *ResolvePlacement({Kind::kCpu, 0}, ComputeDtype::kFloat32,
                                        DeviceSpec{Kind::kCuda, 1}, ComputeDtype::kFloat16, 2, "m");
  EXPECT_TRUE(p.cuda);
  EXPECT_EQ(p.index, 1);
  EXPECT_EQ(p.dtype, ComputeDtype::kFloat16);
  const Placement q = *ResolvePlacement({Kind::kCuda, 0}, ComputeDtype::kBFloat16,
                                        DeviceSpec{Kind::kCpu, 0}, std::nullopt, 1, "m");
  EXPECT_FALSE(q.cuda);
  EXPECT_EQ(q.dtype, ComputeDtype::kBFloat16) << "the server's dtype holds on the CPU";
}

TEST(Placement, EveryDtypeTakesEffectOnTheCpuWithThePathThisCpuMakesFastest) {
  for (ComputeDtype d : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16, ComputeDtype::kFloat16,
                         ComputeDtype::kInt8}) {
    const Placement p =
        *ResolvePlacement({Kind::kCpu, 0}, ComputeDtype::kFloat32, std::nullopt, d, 0, "m");
    EXPECT_EQ(p.dtype, d);
    EXPECT_EQ(p.cpu_products, CpuProductsFor(d));
    EXPECT_EQ(p.CpuProductsUsed(), CpuProductsFor(d));
  }
  EXPECT_EQ(CpuProductsFor(ComputeDtype::kFloat32), CpuProducts::kFloat32);
  EXPECT_EQ(CpuProductsFor(ComputeDtype::kFloat16), CpuProducts::kHalfGemv);
  EXPECT_EQ(CpuProductsFor(ComputeDtype::kInt8), CpuProducts::kInt8);
  // bf16 goes through oneDNN where there is AVX-512, else it widens to fp32 per product.
  const bool avx512 = CpuPrecisionFlags().find("no-avx512 ") == std::string::npos;
  EXPECT_EQ(CpuProductsFor(ComputeDtype::kBFloat16),
            avx512 ? CpuProducts::kOneDnnBf16 : CpuProducts::kWiden)
      << CpuPrecisionFlags();
  // A hand-built Placement at a reduced dtype takes this CPU's path; a test may force another.
  Placement hand{false, 0, ComputeDtype::kFloat16};
  EXPECT_EQ(hand.CpuProductsUsed(), CpuProducts::kHalfGemv);
  hand.cpu_products = CpuProducts::kWiden;
  EXPECT_EQ(hand.CpuProductsUsed(), CpuProducts::kWiden);
  EXPECT_STREQ(CpuProductsName(CpuProducts::kOneDnnBf16), "onednn-bf16");
}

std::string LanguageConfigJson(const std::string& serving) {
  return R"({"name": "lm", "architecture": "tost_lm",
             "lm": {"n_layer": 1, "n_head": 2, "n_embd": 8, "context_length": 16,
                    "vocab_size": 257},
             "tokenizer": {"type": "byte", "eos_token_id": 256})" +
         serving + "}";
}

TEST(ModelConfigServing, ParsesDeviceAndDtype) {
  const auto cfg = ParseModelConfig(
      LanguageConfigJson(R"(, "serving": {"device": "cuda:1", "dtype": "bf16"})"), "c.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(cfg->serving_device.has_value());
  EXPECT_EQ(cfg->serving_device->index, 1);
  EXPECT_EQ(cfg->serving_dtype, ComputeDtype::kBFloat16);
  const auto plain = ParseModelConfig(LanguageConfigJson(""), "c.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->serving_device.has_value());
  EXPECT_FALSE(plain->serving_dtype.has_value());
}

TEST(ModelConfigServing, AllowedDtypesRefuseOthersNamingModelDtypeAndList) {
  const auto cfg = ParseModelConfig(
      LanguageConfigJson(R"(, "serving": {"dtypes": ["fp32", "bfloat16"]})"), "c.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->serving_dtypes,
            (std::vector<ComputeDtype>{ComputeDtype::kFloat32, ComputeDtype::kBFloat16}));
  EXPECT_TRUE(ResolvePlacement({}, ComputeDtype::kBFloat16, std::nullopt, std::nullopt, 0, "lm",
                               cfg->serving_dtypes)
                  .ok());
  const auto refused = ResolvePlacement({}, ComputeDtype::kInt8, std::nullopt, std::nullopt, 0,
                                        "lm", cfg->serving_dtypes);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "model \"lm\" (--dtype): int8 is not among the precisions this model allows "
            "(config.json serving.dtypes: fp32, bf16); serve it at one of those (serving.dtype "
            "sets it for this model alone)");
  // Without the list every precision is allowed.
  EXPECT_TRUE(ResolvePlacement({}, ComputeDtype::kInt8, std::nullopt, std::nullopt, 0, "lm").ok());
}

TEST(ModelConfigServing, RefusesMalformedServingNamingFileAndKey) {
  for (const auto& [serving, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "serving": "cuda")", "\"serving\" must be an object"},
           {R"(, "serving": {"device": "tpu"})", "serving.device: expected auto, cpu"},
           {R"(, "serving": {"dtype": "fp8"})", "serving.dtype: expected fp32, bf16, fp16 or int8"},
           {R"(, "serving": {"device": 0})", "serving.device must be a string"},
           {R"(, "serving": {"devices": "cpu"})", "unknown key \"devices\""},
           {R"(, "serving": {"dtypes": "fp32"})", "serving.dtypes must be a list of 1 to 4"},
           {R"(, "serving": {"dtypes": []})", "serving.dtypes must be a list of 1 to 4"},
           {R"(, "serving": {"dtypes": ["fp32", 8]})", "serving.dtypes[1] must be a string"},
           {R"(, "serving": {"dtypes": ["fp32", "fp4"]})",
            "serving.dtypes[1]: expected fp32, bf16, fp16 or int8, got \"fp4\""},
           {R"(, "serving": {"dtypes": ["fp32", "float32"]})",
            "serving.dtypes[1]: \"fp32\" is listed twice"},
           {R"(, "serving": {"dtype": "int8", "dtypes": ["fp32", "bf16"]})",
            "serving.dtype \"int8\" is not among serving.dtypes [\"fp32\",\"bf16\"]"}}) {
    const auto cfg = ParseModelConfig(LanguageConfigJson(serving), "m/config.json");
    ASSERT_FALSE(cfg.ok()) << serving;
    EXPECT_NE(cfg.status().message().find("m/config.json: "), std::string::npos) << cfg.status();
    EXPECT_NE(cfg.status().message().find(expected), std::string::npos) << cfg.status();
  }
}

}  // namespace
}  // namespace tost::model

namespace tost::model {
namespace {

TEST(DecodeBuckets, PowersOfTwoThenMultiplesOfEightEndingAtTheLargestBatch) {
  EXPECT_EQ(DecodeBuckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(DecodeBuckets(3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(DecodeBuckets(8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(DecodeBuckets(20), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DecodeBuckets(64), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_TRUE(DecodeBuckets(0).empty());
}

TEST(DecodeBuckets, EveryBatchRunsAtTheSmallestBucketThatHoldsIt) {
  const std::vector<int64_t> buckets = DecodeBuckets(64);
  for (int64_t b = 1; b <= 64; ++b) {
    const int64_t bucket = DecodeBucketFor(buckets, b);
    ASSERT_GE(bucket, b);
    EXPECT_TRUE(bucket - b < 8 || bucket <= 8) << b << " pads to " << bucket;
    // No smaller bucket would hold it.
    for (int64_t smaller : buckets) EXPECT_TRUE(smaller >= bucket || smaller < b);
  }
  EXPECT_EQ(DecodeBucketFor(buckets, 0), -1);
  EXPECT_EQ(DecodeBucketFor(buckets, 65), -1);
  EXPECT_EQ(DecodeBucketFor(buckets, 3), 4);
  EXPECT_EQ(DecodeBucketFor(buckets, 33), 40);
}

}  // namespace
}  // namespace tost::model
