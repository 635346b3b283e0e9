// A model repository with broken models: every failure is an error naming the file and tensor,
// never a crash, and the repository still serves the models that are fine.
#include <filesystem>
#include <fstream>

#include "base/file_util.h"
#include "model/nets/model_repository.h"
#include "tests/model/test_util.h"

namespace tost::model {
namespace {

namespace fs = std::filesystem;

class MalformedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::ParityDir().empty())
      GTEST_FAIL() << "TOST_PARITY_DIR is not set (run through ctest)";
    repo_ = fs::temp_directory_path() / ("tost_malformed_" + std::to_string(::getpid()));
    fs::remove_all(repo_);
    fs::create_directories(repo_);
  }
  void TearDown() override { fs::remove_all(repo_); }

  // Copies a fixture model to <repo>/<name>, renaming it in its config.
  fs::path CopyModel(const std::string& from, const std::string& name) {
    const fs::path dst = repo_ / name;
    fs::create_directories(dst);
    fs::copy_file(fs::path(testing::ParityDir()) / from / "model.safetensors",
                  dst / "model.safetensors");
    std::string config =
        *ReadFileToString((fs::path(testing::ParityDir()) / from / "config.json").string());
    const std::string old_name = "\"name\": \"" + from + "\"";
    const size_t at = config.find(old_name);
    EXPECT_NE(at, std::string::npos) << "fixture config has no " << old_name;
    if (at != std::string::npos) config.replace(at, old_name.size(), "\"name\": \"" + name + "\"");
    Write(dst / "config.json", config);
    return dst;
  }

  static void Write(const fs::path& p, const std::string& contents) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << contents;
  }

  // Rewrites a model's safetensors through `edit`, which may drop, add or alter tensors.
  static void Rewrite(const fs::path& dir,
                      const std::function<void(std::vector<StTensorToWrite>&)>& edit) {
    auto file = SafetensorsFile::Open((dir / "model.safetensors").string());
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<StTensorToWrite> tensors;
    for (const auto& [name, t] : file->tensors())
      tensors.push_back({name, t.dtype, t.shape, t.bytes});
    edit(tensors);
    Write(dir / "model.safetensors", SerializeSafetensors(tensors));
  }

  static void ExpectError(const LoadedModel& m, std::initializer_list<std::string> fragments) {
    ASSERT_FALSE(m.status.ok()) << m.name << " loaded although it is broken";
    for (const auto& f : fragments) {
      EXPECT_NE(m.status.message().find(f), std::string::npos)
          << "missing \"" << f << "\" in: " << m.status;
    }
  }

  fs::path repo_;
};

TEST_F(MalformedModelTest, TruncatedFileNamesFileAndTensor) {
  const fs::path dir = CopyModel("vision_small", "cut");
  const auto size = fs::file_size(dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", size - 100);
  ExpectError(LoadModelDirectory(dir.string()), {"cut/model.safetensors", "truncated"});
}

TEST_F(MalformedModelTest, MissingExtraMisshapenAndMistypedTensors) {
  const fs::path missing = CopyModel("vision_small", "missing");
  Rewrite(missing, [](auto& t) {
    std::erase_if(t, [](auto& x) { return x.name == "blocks.1.attn.temp"; });
  });
  ExpectError(LoadModelDirectory(missing.string()),
              {"missing/model.safetensors", "blocks.1.attn.temp", "missing"});

  const fs::path extra = CopyModel("lm_small", "extra");
  static const float one = 1.f;
  Rewrite(extra, [](auto& t) {
    t.push_back({"transformer.h.0.attn.qkv.weight",
                 StDtype::kF32,
                 {1},
                 {reinterpret_cast<const char*>(&one), 4}});
  });
  ExpectError(LoadModelDirectory(extra.string()),
              {"extra/model.safetensors", "transformer.h.0.attn.qkv.weight", "unexpected"});

  const fs::path shape = CopyModel("lm_small", "shape");
  Rewrite(shape, [](auto& t) {
    for (auto& x : t) {
      if (x.name == "transformer.wpe.weight") x.shape = {x.shape[1], x.shape[0]};
    }
  });
  ExpectError(LoadModelDirectory(shape.string()),
              {"shape/model.safetensors", "transformer.wpe.weight", "expected ["});

  const fs::path dtype = CopyModel("lm_small", "dtype");
  Rewrite(dtype, [](auto& t) {
    for (auto& x : t) {
      if (x.name == "transformer.ln_f.weight") x.dtype = StDtype::kI32;
    }
  });
  ExpectError(LoadModelDirectory(dtype.string()),
              {"dtype/model.safetensors", "transformer.ln_f.weight", "dtype I32"});
}

TEST_F(MalformedModelTest, NonFiniteWeightsAreRefused) {
  const fs::path dir = CopyModel("lm_small", "nan");
  static std::vector<float> nan_gamma;
  Rewrite(dir, [](auto& t) {
    for (auto& x : t) {
      if (x.name == "transformer.h.0.gamma1") {
        nan_gamma.assign(x.bytes.size() / 4, std::numeric_limits<float>::quiet_NaN());
        x.bytes = {reinterpret_cast<const char*>(nan_gamma.data()), x.bytes.size()};
      }
    }
  });
  ExpectError(LoadModelDirectory(dir.string()), {"transformer.h.0.gamma1", "NaN"});
}

TEST_F(MalformedModelTest, ConfigProblems) {
  const fs::path renamed = CopyModel("lm_small", "renamed");
  fs::rename(renamed, repo_ / "other");
  ExpectError(LoadModelDirectory((repo_ / "other").string()),
              {"\"renamed\"", "\"other\"", "must match"});

  const fs::path nofile = CopyModel("lm_small", "nofile");
  fs::remove(nofile / "model.safetensors");
  ExpectError(LoadModelDirectory(nofile.string()), {"nofile/model.safetensors"});

  const fs::path badjson = CopyModel("lm_small", "badjson");
  Write(badjson / "config.json", "{\"name\": ");
  ExpectError(LoadModelDirectory(badjson.string()), {"badjson/config.json", "not valid JSON"});
}

TEST_F(MalformedModelTest, BpeTokenizerFileProblemsNameTheFile) {
  // lm_small has 257 ids: as a BPE model that is 256 bytes, no merges and end-of-text 256.
  const auto make = [&](const std::string& name, const std::string& tokenizer_json) {
    const fs::path dir = CopyModel("lm_small", name);
    std::string config = *ReadFileToString((dir / "config.json").string());
    const std::string byte = "\"type\": \"byte\"";
    const size_t at = config.find(byte);
    EXPECT_NE(at, std::string::npos);
    config.replace(at, byte.size(), "\"type\": \"bpe\"");
    Write(dir / "config.json", config);
    if (!tokenizer_json.empty()) Write(dir / "tokenizer.json", tokenizer_json);
    return dir;
  };
  const std::string good =
      R"({"format":"tost-bpe-v1","max_piece_bytes":32,"merges":[],"special_tokens":{"<|endoftext|>":256}})";
  const LoadedModel ok = LoadModelDirectory(make("bpe_ok", good).string());
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_STREQ(ok.language->tokenizer().type(), "bpe");
  EXPECT_EQ(ok.language->tokenizer().Encode("ab"), (std::vector<int32_t>{97, 98}));

  ExpectError(LoadModelDirectory(make("bpe_missing", "").string()), {"bpe_missing/tokenizer.json"});
  ExpectError(
      LoadModelDirectory(make("bpe_vocab",
                              R"({"format":"tost-bpe-v1","max_piece_bytes":32,"merges":[[1,2]],)"
                              R"("special_tokens":{"<|endoftext|>":257}})")
                             .string()),
      {"bpe_vocab/tokenizer.json", "vocabulary of 258 ids", "vocab_size 257"});
  ExpectError(LoadModelDirectory(make("bpe_json", "{\"format\":").string()),
              {"bpe_json/tokenizer.json", "not valid JSON"});
}

TEST_F(MalformedModelTest, RepositoryServesTheGoodModelsBesideTheBrokenOnes) {
  CopyModel("vision_small", "good");
  const fs::path bad = CopyModel("lm_small", "bad");
  fs::resize_file(bad / "model.safetensors", 10);
  auto models = LoadRepository(repo_.string());
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 2u);
  EXPECT_EQ((*models)[0].name, "bad");
  EXPECT_FALSE((*models)[0].status.ok());
  EXPECT_EQ((*models)[1].name, "good");
  EXPECT_TRUE((*models)[1].status.ok()) << (*models)[1].status;
  EXPECT_EQ(LoadRepository((repo_ / "nope").string()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tost::model
