// ReadRegularFile: what model repositories are read with. Only regular files are read, never more
// than their limit, and nothing blocks.
#include "base/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/base/mode_zero.h"

namespace tost::model {
namespace {

namespace fs = std::filesystem;

class ReadRegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tost_read_regular_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& contents) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << contents;
    return p.string();
  }

  static void ExpectError(const absl::StatusOr<std::string>& r, absl::StatusCode code,
                          std::initializer_list<std::string> fragments) {
    ASSERT_FALSE(r.ok()) << "read although it should be refused";
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const auto& f : fragments) {
      EXPECT_NE(r.status().message().find(f), std::string::npos)
          << "missing \"" << f << "\" in: " << r.status();
    }
  }

  fs::path dir_;
};

TEST_F(ReadRegularFileTest, ReadsARegularFileAndALinkToOne) {
  const std::string p = Write("a.json", "{\"x\": 1}");
  EXPECT_EQ(*ReadRegularFile(p, 100, "config file"), "{\"x\": 1}");
  fs::create_symlink(p, dir_ / "link.json");
  EXPECT_EQ(*ReadRegularFile((dir_ / "link.json").string(), 100, "config file"), "{\"x\": 1}");
  EXPECT_EQ(*ReadRegularFile(Write("empty", ""), 0, "config file"), "");
}

TEST_F(ReadRegularFileTest, RefusesWhatIsNotARegularFile) {
  ExpectError(ReadRegularFile("/dev/zero", 1 << 20, "config file"),
              absl::StatusCode::kFailedPrecondition,
              {"/dev/zero", "config file", "regular file", "character device"});
  fs::create_symlink("/dev/zero", dir_ / "zero");
  ExpectError(ReadRegularFile((dir_ / "zero").string(), 1 << 20, "weights file"),
              absl::StatusCode::kFailedPrecondition, {"zero", "character device"});
  ExpectError(ReadRegularFile(dir_.string(), 1 << 20, "config file"),
              absl::StatusCode::kFailedPrecondition, {"a directory"});
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  ExpectError(ReadRegularFile(fifo.string(), 1 << 20, "config file"),
              absl::StatusCode::kFailedPrecondition, {"fifo", "FIFO"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(ReadRegularFileTest, LoopsMissingAndOverlongNamesAreErrors) {
  fs::create_symlink(dir_ / "loop", dir_ / "loop");
  ExpectError(ReadRegularFile((dir_ / "loop").string(), 100, "config file"),
              absl::StatusCode::kFailedPrecondition, {"loop", "symbolic links"});
  ExpectError(ReadRegularFile((dir_ / "missing").string(), 100, "config file"),
              absl::StatusCode::kNotFound, {"missing", "No such file"});
  const std::string long_name = (dir_ / std::string(300, 'n')).string();
  ExpectError(ReadRegularFile(long_name, 100, "config file"), absl::StatusCode::kFailedPrecondition,
              {"File name too long"});
}

TEST_F(ReadRegularFileTest, RefusesFilesOverTheLimitAndFilesThatLie) {
  const std::string p = Write("big", std::string(101, 'x'));
  ExpectError(ReadRegularFile(p, 100, "tokenizer file"), absl::StatusCode::kResourceExhausted,
              {"big", "tokenizer file", "holds 101 bytes", "limit of 100 bytes"});
  // /proc files say 0 bytes and hold more: never read in part.
  ExpectError(ReadRegularFile("/proc/self/status", 1 << 20, "config file"),
              absl::StatusCode::kDataLoss, {"/proc/self/status", "more than the 0 bytes"});
}

TEST_F(ReadRegularFileTest, PermissionDenied) {
  if (!tost::testing::ModeZeroDeniesThisProcess()) GTEST_SKIP() << tost::testing::kModeZeroSkip;
  const std::string p = Write("secret", "x");
  fs::permissions(p, fs::perms::none);
  ExpectError(ReadRegularFile(p, 100, "config file"), absl::StatusCode::kPermissionDenied,
              {"secret", "Permission denied"});
}

}  // namespace
}  // namespace tost::model
