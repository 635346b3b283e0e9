// A model repository written carelessly or with hostile intent: symbolic link loops, devices,
// FIFOs, unreadable folders, invalid UTF-8. Every one is a model that failed to load, with its path
// and the reason; none crashes, hangs or exhausts the server, and the good models beside them
// load. Uses the shipped models (models/) as the good ones: no fixtures needed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include <gtest/gtest.h>

#include "base/file_util.h"
#include "base/utf8.h"
#include "model/nets/model_repository.h"
#include "tests/base/mode_zero.h"

namespace tost::model {
namespace {

namespace fs = std::filesystem;

const fs::path kShipped = fs::path(TOST_SOURCE_DIR) / "models";

class HostileRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::temp_directory_path() / ("tost_hostile_" + std::to_string(::getpid()));
    Cleanup();
    fs::create_directories(repo_);
  }
  void TearDown() override { Cleanup(); }

  void Cleanup() {
    std::error_code ec;
    // A test may leave a folder of mode 000 behind.
    for (fs::recursive_directory_iterator it(repo_, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ignored;
      if (!it->is_symlink(ignored))
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ignored);
    }
    fs::remove_all(repo_, ec);
  }

  static void Write(const fs::path& p, const std::string& contents) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << contents;
  }

  // <repo>/<name>: the shipped model `from`'s files as links, config.json copied with its name
  // changed, so that each test may replace any one of them.
  fs::path LinkModel(const std::string& from, const std::string& name) {
    const fs::path dst = repo_ / name;
    fs::create_directories(dst);
    for (const auto& entry : fs::directory_iterator(kShipped / from)) {
      if (entry.path().filename() != "config.json")
        fs::create_symlink(entry.path(), dst / entry.path().filename());
    }
    std::string config = *ReadFileToString((kShipped / from / "config.json").string());
    const std::string old_name = "\"name\": \"" + from + "\"";
    const size_t at = config.find(old_name);
    EXPECT_NE(at, std::string::npos) << "shipped config has no " << old_name;
    if (at != std::string::npos) config.replace(at, old_name.size(), "\"name\": \"" + name + "\"");
    Write(dst / "config.json", config);
    return dst;
  }

  static void Replace(const fs::path& file, const fs::path& link_target) {
    fs::remove(file);
    fs::create_symlink(link_target, file);
  }

  static void ExpectError(const LoadedModel& m, std::initializer_list<std::string> fragments) {
    ASSERT_FALSE(m.status.ok()) << m.name << " loaded although it is broken";
    for (const auto& f : fragments) {
      EXPECT_NE(m.status.message().find(f), std::string::npos)
          << "missing \"" << f << "\" in: " << m.status;
    }
    EXPECT_FALSE(FirstInvalidUtf8(m.name).has_value()) << m.name;
    EXPECT_FALSE(FirstInvalidUtf8(std::string(m.status.message())).has_value()) << m.status;
  }

  // LoadRepository, failing the test instead of hanging when it does not return in time.
  static std::vector<LoadedModel> LoadWithin(const fs::path& repo, std::chrono::seconds limit) {
    auto loading = std::async(std::launch::async, [repo] { return LoadRepository(repo.string()); });
    if (loading.wait_for(limit) != std::future_status::ready) {
      ADD_FAILURE() << "LoadRepository did not return within " << limit.count() << " s";
      return {};
    }
    absl::StatusOr<std::vector<LoadedModel>> models = loading.get();
    EXPECT_TRUE(models.ok()) << models.status();
    return models.ok() ? *std::move(models) : std::vector<LoadedModel>{};
  }

  static const LoadedModel* Find(const std::vector<LoadedModel>& models, const std::string& name) {
    for (const auto& m : models) {
      if (m.name == name) return &m;
    }
    ADD_FAILURE() << "no model " << name << " in the repository's list";
    return nullptr;
  }

  fs::path repo_;
};

TEST_F(HostileRepositoryTest, SymlinkLoopsAreFailedModelsAndTheGoodOneLoads) {
  LinkModel("tost-digits", "good");
  fs::create_symlink(repo_ / "loop", repo_ / "loop");  // the model folder itself
  const fs::path cfgloop = LinkModel("tost-digits", "cfgloop");
  Replace(cfgloop / "config.json", cfgloop / "config.json");
  // A name too long for the file system (ENAMETOOLONG), where a folder should be.
  fs::create_symlink(repo_ / std::string(300, 'n'), repo_ / "toolong");
  // Dangling links: a model folder's, and a config.json's (the folder itself is real).
  fs::create_symlink(repo_ / "nowhere", repo_ / "dangling");
  const fs::path cfgdangling = LinkModel("tost-digits", "cfgdangling");
  Replace(cfgdangling / "config.json", cfgdangling / "nowhere.json");
  // A loop of two links, relative ones, as config.json.
  const fs::path cfgcycle = LinkModel("tost-digits", "cfgcycle");
  Replace(cfgcycle / "config.json", "other.json");
  fs::create_symlink("config.json", cfgcycle / "other.json");
  const std::vector<LoadedModel> models = LoadWithin(repo_, std::chrono::seconds(60));
  ASSERT_EQ(models.size(), 7u);
  const LoadedModel* good = Find(models, "good");
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->status.ok()) << good->status;
  EXPECT_NE(good->vision, nullptr);
  if (const LoadedModel* m = Find(models, "loop")) {
    ExpectError(*m, {(repo_ / "loop").string(), "symbolic links"});
  }
  if (const LoadedModel* m = Find(models, "cfgloop")) {
    ExpectError(*m, {"cfgloop/config.json", "symbolic links"});
  }
  if (const LoadedModel* m = Find(models, "toolong")) {
    ExpectError(*m, {"toolong", "File name too long"});
  }
  if (const LoadedModel* m = Find(models, "dangling")) {
    ExpectError(*m, {(repo_ / "dangling").string(), "No such file or directory"});
  }
  if (const LoadedModel* m = Find(models, "cfgdangling")) {
    ExpectError(*m, {"cfgdangling/config.json", "No such file or directory"});
  }
  if (const LoadedModel* m = Find(models, "cfgcycle")) {
    ExpectError(*m, {"cfgcycle/config.json", "symbolic links"});
  }
  // Nothing broken is served: only "good" has a model behind it.
  for (const LoadedModel& m : models) {
    if (m.name == "good") continue;
    EXPECT_EQ(m.vision, nullptr) << m.name;
    EXPECT_EQ(m.language, nullptr) << m.name;
  }
}

TEST_F(HostileRepositoryTest, FolderOfMode000) {
  if (!tost::testing::ModeZeroDeniesThisProcess()) GTEST_SKIP() << tost::testing::kModeZeroSkip;
  LinkModel("tost-digits", "good");
  const fs::path locked = LinkModel("tost-digits", "locked");
  fs::permissions(locked, fs::perms::none);
  const std::vector<LoadedModel> models = LoadWithin(repo_, std::chrono::seconds(60));
  if (const LoadedModel* m = Find(models, "locked")) {
    ExpectError(*m, {"locked", "Permission denied"});
  }
  if (const LoadedModel* m = Find(models, "good")) {
    EXPECT_TRUE(m->status.ok()) << m->status;
  }
}

TEST_F(HostileRepositoryTest, DevZeroIsNeverRead) {
  const fs::path config = repo_ / "zconfig";
  fs::create_directories(config);
  Replace(config / "config.json", "/dev/zero");
  ExpectError(LoadModelDirectory(config.string()),
              {"zconfig/config.json", "regular file", "character device"});

  const fs::path weights = LinkModel("tost-digits", "zweights");
  Replace(weights / "model.safetensors", "/dev/zero");
  ExpectError(LoadModelDirectory(weights.string()),
              {"zweights/model.safetensors", "weights file", "character device"});

  const fs::path tokenizer = LinkModel("tost-austen", "ztokenizer");
  Replace(tokenizer / "tokenizer.json", "/dev/zero");
  ExpectError(LoadModelDirectory(tokenizer.string()),
              {"ztokenizer/tokenizer.json", "tokenizer file", "character device"});
}

TEST_F(HostileRepositoryTest, FifoConfigFailsAtOnce) {
  LinkModel("tost-digits", "good");
  const fs::path dir = repo_ / "fifo";
  fs::create_directories(dir);
  const fs::path fifo = dir / "config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto loading = std::async(std::launch::async, [this] { return LoadRepository(repo_.string()); });
  if (loading.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    // Unblock the reader (a writer's open lets its open return; closing gives it end of file) so
    // the test ends.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    FAIL() << "loading a repository with a FIFO config.json blocked";
  }
  absl::StatusOr<std::vector<LoadedModel>> models = loading.get();
  ASSERT_TRUE(models.ok()) << models.status();
  if (const LoadedModel* m = Find(*models, "fifo")) {
    ExpectError(*m, {"fifo/config.json", "FIFO"});
  }
  if (const LoadedModel* m = Find(*models, "good")) {
    EXPECT_TRUE(m->status.ok()) << m->status;
  }
}

TEST_F(HostileRepositoryTest, OversizedConfigIsRefusedUnread) {
  const fs::path dir = LinkModel("tost-digits", "huge");
  fs::resize_file(dir / "config.json", kMaxConfigFileBytes + 1);  // sparse: costs no disk
  ExpectError(LoadModelDirectory(dir.string()),
              {"huge/config.json", "holds " + std::to_string(kMaxConfigFileBytes + 1) + " bytes",
               "limit of " + std::to_string(kMaxConfigFileBytes)});
}

TEST_F(HostileRepositoryTest, InvalidUtf8NeverReachesWhatIsReported) {
  LinkModel("tost-digits", "good");
  const fs::path name = LinkModel("tost-digits", "badname");
  std::string config = *ReadFileToString((name / "config.json").string());
  config.replace(config.find("\"badname\""), 9, "\"bad\xffname\"");
  Write(name / "config.json", config);
  // A folder whose own name is not UTF-8.
  LinkModel("tost-digits", "dir\xfe");
  const std::vector<LoadedModel> models = LoadWithin(repo_, std::chrono::seconds(60));
  ASSERT_EQ(models.size(), 3u);
  if (const LoadedModel* m = Find(models, "badname")) {
    ExpectError(*m, {"badname/config.json", "invalid UTF-8", "byte offset", "field \"name\""});
  }
  if (const LoadedModel* m = Find(models, "dir\\xfe")) {
    ExpectError(*m, {"not valid UTF-8"});
  }
  if (const LoadedModel* m = Find(models, "good")) {
    EXPECT_TRUE(m->status.ok()) << m->status;
  }
}

TEST_F(HostileRepositoryTest, ARepositoryThatCannotBeExaminedIsAnError) {
  fs::create_symlink(repo_ / "self", repo_ / "self");
  const absl::StatusOr<std::vector<LoadedModel>> loop = LoadRepository((repo_ / "self").string());
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kFailedPrecondition) << loop.status();
  EXPECT_NE(loop.status().message().find("symbolic links"), std::string::npos) << loop.status();
  const absl::StatusOr<std::vector<LoadedModel>> file =
      LoadRepository((kShipped / "tost-digits" / "config.json").string());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  EXPECT_NE(file.status().message().find("not a directory"), std::string::npos) << file.status();
}

}  // namespace
}  // namespace tost::model
