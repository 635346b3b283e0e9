#include "service/engine/constraint_masker.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace tost::service {
namespace {

// A constraint whose mask is a function of its id alone, recording the threads that filled it.
class Marker final : public TokenConstraint {
 public:
  explicit Marker(uint32_t id, std::set<std::thread::id>* threads, absl::Mutex* mu)
      : id_(id), threads_(threads), mu_(mu) {}
  int64_t bitmask_words() const override { return 3; }
  void FillAllowed(absl::Span<uint32_t> words) override {
    for (size_t w = 0; w < words.size(); ++w) words[w] = id_ * 7919u + static_cast<uint32_t>(w);
    absl::MutexLock lock(mu_);
    threads_->insert(std::this_thread::get_id());
  }
  absl::Status Accept(int32_t) override { return absl::OkStatus(); }
  bool Ended() const override { return false; }
  absl::Status Replay(absl::Span<const int32_t>) override { return absl::OkStatus(); }
  const structured::Constraint& spec() const override { return spec_; }

 private:
  const uint32_t id_;
  std::set<std::thread::id>* threads_;
  absl::Mutex* mu_;
  const structured::Constraint spec_;
};

// Every row's mask is filled exactly as its constraint says, by the workers and the finishing
// thread together or by the finishing thread alone, batch after batch.
TEST(ConstraintMasker, FillsEveryRowOnWorkersOrTheFinishingThread) {
  for (const int threads : {0, 1, 3}) {
    ConstraintMasker masker(threads, /*cpus=*/8);  // the workers run whatever this machine's CPUs
    absl::Mutex mu;
    std::set<std::thread::id> fillers;
    for (int batch = 0; batch < 20; ++batch) {
      const int rows = 1 + batch * 5;
      std::vector<std::unique_ptr<Marker>> constraints;
      std::vector<std::vector<uint32_t>> words(rows, std::vector<uint32_t>(3, 0));
      std::vector<ConstraintMasker::Task> tasks;
      for (int r = 0; r < rows; ++r) {
        constraints.push_back(std::make_unique<Marker>(r + 1, &fillers, &mu));
        tasks.push_back({constraints.back().get(), absl::MakeSpan(words[r])});
      }
      masker.Start(std::move(tasks));
      masker.Finish();
      masker.Finish();  // idempotent
      for (int r = 0; r < rows; ++r) {
        for (uint32_t w = 0; w < 3; ++w) {
          ASSERT_EQ(words[r][w], static_cast<uint32_t>(r + 1) * 7919u + w)
              << threads << " threads, batch " << batch << ", row " << r;
        }
      }
      EXPECT_GE(masker.wait_time(), absl::ZeroDuration());
      EXPECT_GE(masker.compute_time(), absl::ZeroDuration());
    }
    absl::MutexLock lock(&mu);
    if (threads == 0) {
      EXPECT_EQ(fillers, std::set<std::thread::id>{std::this_thread::get_id()});
    }
  }
}

// On one CPU no worker is started, whatever `threads` asks: every mask is the finishing thread's.
TEST(ConstraintMasker, OneCpuComputesOnTheFinishingThread) {
  ConstraintMasker masker(3, /*cpus=*/1);
  absl::Mutex mu;
  std::set<std::thread::id> fillers;
  std::vector<std::unique_ptr<Marker>> constraints;
  std::vector<std::vector<uint32_t>> words(16, std::vector<uint32_t>(3, 0));
  std::vector<ConstraintMasker::Task> tasks;
  for (int r = 0; r < 16; ++r) {
    constraints.push_back(std::make_unique<Marker>(r + 1, &fillers, &mu));
    tasks.push_back({constraints.back().get(), absl::MakeSpan(words[r])});
  }
  masker.Start(std::move(tasks));
  masker.Finish();
  for (int r = 0; r < 16; ++r)
    EXPECT_EQ(words[r][1], static_cast<uint32_t>(r + 1) * 7919u + 1) << r;
  absl::MutexLock lock(&mu);
  EXPECT_EQ(fillers, std::set<std::thread::id>{std::this_thread::get_id()});
}

// Destroyed with a batch started and not finished: the batch is finished first, no worker is left
// holding a row.
TEST(ConstraintMasker, DestructionFinishesAStartedBatch) {
  absl::Mutex mu;
  std::set<std::thread::id> fillers;
  std::vector<std::unique_ptr<Marker>> constraints;
  std::vector<std::vector<uint32_t>> words(64, std::vector<uint32_t>(3, 0));
  {
    ConstraintMasker masker(2);
    std::vector<ConstraintMasker::Task> tasks;
    for (int r = 0; r < 64; ++r) {
      constraints.push_back(std::make_unique<Marker>(r, &fillers, &mu));
      tasks.push_back({constraints.back().get(), absl::MakeSpan(words[r])});
    }
    masker.Start(std::move(tasks));
  }
  for (int r = 0; r < 64; ++r) EXPECT_EQ(words[r][2], static_cast<uint32_t>(r) * 7919u + 2) << r;
}

}  // namespace
}  // namespace tost::service
