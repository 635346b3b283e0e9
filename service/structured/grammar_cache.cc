#include "service/structured/grammar_cache.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/thread_name.h"

namespace tost::structured {

GrammarCache::GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary,
                           const GrammarCacheOptions& options)
    : GrammarCache(vocabulary, options,
                   [vocabulary, max_bytes = options.max_bytes / 8](const Constraint& constraint) {
                     return CompileConstraint(vocabulary, constraint, max_bytes);
                   }) {}

GrammarCache::GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary,
                           const GrammarCacheOptions& options, CompileFunction compile)
    : vocabulary_(std::move(vocabulary)), options_(options), compile_(std::move(compile)) {}

GrammarCache::~GrammarCache() {
  std::list<Worker> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  // Joined without the lock: a running compile takes it to record its result.
  for (Worker& worker : workers) worker.thread.join();
}

void GrammarCache::WaitForCompiles() {
  std::list<Worker> finished;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_map<std::string, std::shared_ptr<Pending>>* in_flight) {
          return in_flight->empty();
        },
        &in_flight_));
    finished = TakeFinishedWorkersLocked();
  }
  for (Worker& worker : finished) worker.thread.join();
}

std::list<GrammarCache::Worker> GrammarCache::TakeFinishedWorkersLocked() {
  std::list<Worker> finished;
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->finished) finished.splice(finished.end(), workers_, it);
    it = next;
  }
  return finished;
}

void GrammarCache::InsertLocked(const std::string& key,
                                std::shared_ptr<const CompiledConstraint> compiled) {
  if (options_.max_entries <= 0) return;
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  bytes_ += compiled->bytes;
  lru_.push_front(Entry{key, std::move(compiled)});
  index_[key] = lru_.begin();
  // The newest entry stays even alone over max_bytes (only a test's compile function makes one:
  // CompileConstraint refuses what exceeds an eighth of it).
  while (static_cast<int64_t>(lru_.size()) > options_.max_entries ||
         (bytes_ > options_.max_bytes && lru_.size() > 1)) {
    bytes_ -= lru_.back().compiled->bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

void GrammarCache::RunCompile(std::shared_ptr<Pending> pending, Constraint constraint,
                              std::string key, std::list<Worker>::iterator worker) {
  NameThisThread("grammar-compile");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result = compile_(constraint);
  const int64_t micros = absl::ToInt64Microseconds(absl::Now() - start);
  absl::MutexLock lock(&mu_);
  stats_.compile_micros_total += micros;
  if (result.ok()) {
    ++stats_.compiles;
    InsertLocked(key, *result);
  } else {
    ++stats_.compile_errors;
  }
  pending->result = std::move(result);
  pending->done = true;
  if (pending->abandoned) --background_compiles_;
  in_flight_.erase(key);
  worker->finished = true;
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> GrammarCache::Get(
    const Constraint& constraint) {
  if (absl::Status valid = Validate(constraint); !valid.ok()) return valid;
  std::string key = ContentKey(constraint);
  const char* kind = KindName(constraint.kind);
  std::list<Worker> finished;
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result;
  {
    absl::MutexLock lock(&mu_);
    finished = TakeFinishedWorkersLocked();
    if (auto it = index_.find(key); it != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second);
      result = it->second->compiled;
    } else {
      std::shared_ptr<Pending> pending;
      if (auto in_flight = in_flight_.find(key); in_flight != in_flight_.end()) {
        ++stats_.misses;
        pending = in_flight->second;
      } else if (background_compiles_ >= options_.max_background_compiles) {
        // Not a miss: nothing was looked for beyond the cache, and nothing will be compiled.
        result = absl::ResourceExhaustedError(absl::StrCat(
            "compiling the ", kind, " constraint for model ", vocabulary_->model_name(),
            ": expected fewer than ", options_.max_background_compiles,
            " compiles running past --constraint_compile_timeout_ms (", options_.max_compile_ms,
            " ms), found ", background_compiles_, " still running; try again later"));
      } else {
        ++stats_.misses;
        pending = std::make_shared<Pending>();
        in_flight_[key] = pending;
        workers_.emplace_back();
        auto worker = std::prev(workers_.end());
        // The thread records its result under mu_, which this Get holds until it waits.
        worker->thread =
            std::thread(&GrammarCache::RunCompile, this, pending, constraint, key, worker);
      }
      if (pending != nullptr) {
        const absl::Time deadline =
            absl::Now() +
            absl::Milliseconds(options_.max_compile_ms < 0 ? 0 : options_.max_compile_ms);
        if (mu_.AwaitWithDeadline(absl::Condition(&pending->done), deadline)) {
          result = pending->result;
        } else {
          ++stats_.timeouts;
          if (!pending->abandoned) {
            pending->abandoned = true;
            ++background_compiles_;
          }
          result = absl::ResourceExhaustedError(absl::StrCat(
              "compiling the ", kind, " constraint for model ", vocabulary_->model_name(),
              " took longer than ", options_.max_compile_ms,
              " ms (--constraint_compile_timeout_ms); it goes on in the background, and a retry "
              "may find it compiled"));
        }
      }
    }
  }
  for (Worker& worker : finished) worker.thread.join();
  return result;
}

GrammarCacheStats GrammarCache::stats() const {
  absl::MutexLock lock(&mu_);
  GrammarCacheStats stats = stats_;
  stats.entries = static_cast<int64_t>(lru_.size());
  stats.bytes = bytes_;
  return stats;
}

}  // namespace tost::structured
