#include "service/structured/grammar_cache.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/thread_name.h"

namespace tost::structured {

absl::Status ValidateGrammarCacheOptions(const GrammarCacheOptions& options) {
  if (options.max_entries < 0 || options.max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar cache max_entries and max_bytes: expected at least 0, received ",
                     options.max_entries, " and ", options.max_bytes));
  }
  if (options.max_compile_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar cache max_compile_ms: expected at least 0, received ", options.max_compile_ms));
  }
  if (options.max_compiles < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar cache max_compiles: expected at least 1, received ", options.max_compiles));
  }
  if (options.max_compiles_per_caller < 1 ||
      options.max_compiles_per_caller > options.max_compiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar cache max_compiles_per_caller: expected 1 to max_compiles (",
                     options.max_compiles, "), received ", options.max_compiles_per_caller));
  }
  if (options.worker.has_value()) {
    if (absl::Status s = ValidateCompileWorkerOptions(*options.worker); !s.ok()) return s;
    // A compile is stopped only after the request stopped waiting for it: one killed while a
    // request still waits would answer a constraint the compile was still given time for.
    if (options.worker->kill_ms <= options.max_compile_ms) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar cache worker kill_ms: expected more than max_compile_ms (",
                       options.max_compile_ms, "), received ", options.worker->kill_ms));
    }
  }
  return absl::OkStatus();
}

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
  stopping_.store(true);
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

bool GrammarCache::SlotFreeLocked(const std::string& caller) const {
  if (running_ >= options_.max_compiles) return false;
  const auto it = running_by_caller_.find(caller);
  return it == running_by_caller_.end() || it->second < options_.max_compiles_per_caller;
}

void GrammarCache::InsertLocked(const std::string& key,
                                std::shared_ptr<const CompiledConstraint> compiled) {
  if (options_.max_entries <= 0) return;
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  // The key counts: a choice constraint's is up to a thousand choices of 4 KiB.
  bytes_ += compiled->bytes + static_cast<int64_t>(key.size());
  lru_.push_front(Entry{key, std::move(compiled)});
  index_[key] = lru_.begin();
  // The newest entry stays even alone over max_bytes (only a test's compile function makes one:
  // CompileConstraint refuses what exceeds an eighth of it).
  while (static_cast<int64_t>(lru_.size()) > options_.max_entries ||
         (bytes_ > options_.max_bytes && lru_.size() > 1)) {
    bytes_ -= lru_.back().compiled->bytes + static_cast<int64_t>(lru_.back().key.size());
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

void GrammarCache::RememberRefusalLocked(const std::string& key, const absl::Status& status) {
  if (refusal_index_.contains(key)) return;
  refusal_bytes_ += static_cast<int64_t>(key.size());
  refusals_.push_front(Refusal{key, status});
  refusal_index_[key] = refusals_.begin();
  while (static_cast<int64_t>(refusals_.size()) > kMaxRefusals ||
         (refusal_bytes_ > kMaxRefusalBytes && refusals_.size() > 1)) {
    refusal_bytes_ -= static_cast<int64_t>(refusals_.back().key.size());
    refusal_index_.erase(refusals_.back().key);
    refusals_.pop_back();
  }
}

void GrammarCache::RunCompile(std::shared_ptr<Pending> pending, Constraint constraint,
                              std::string key, std::string caller,
                              std::list<Worker>::iterator worker) {
  NameThisThread("grammar-compile");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result = absl::UnknownError("");
  WorkerResult proof;
  if (options_.worker.has_value()) {
    proof = CompileInWorker(*options_.worker, *vocabulary_, constraint, options_.max_bytes / 8,
                            &stopping_);
  }
  if (proof.status.ok()) {
    // Compiled within the worker's bounds (or there is no worker): this compile does the same
    // work, on one thread like the worker's.
    result = compile_(constraint);
  } else {
    result = proof.status;
  }
  const int64_t micros = absl::ToInt64Microseconds(absl::Now() - start);
  absl::MutexLock lock(&mu_);
  stats_.compile_micros_total += micros;
  stats_.worker_max_rss_bytes = std::max(stats_.worker_max_rss_bytes, proof.max_rss_bytes);
  if (result.ok()) {
    ++stats_.compiles;
    InsertLocked(key, *result);
  } else if (proof.past_bound) {
    ++stats_.stopped;
    RememberRefusalLocked(key, result.status());
  } else if (result.status().code() == absl::StatusCode::kInvalidArgument) {
    ++stats_.compile_errors;
  } else {
    ++stats_.worker_failures;
  }
  pending->result = std::move(result);
  pending->done = true;
  in_flight_.erase(key);
  --running_;
  if (auto it = running_by_caller_.find(caller); it != running_by_caller_.end()) {
    if (--it->second <= 0) running_by_caller_.erase(it);
  }
  worker->finished = true;
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> GrammarCache::Get(
    const Constraint& constraint, std::string_view caller_view) {
  if (absl::Status valid = Validate(constraint); !valid.ok()) return valid;
  std::string key = ContentKey(constraint);
  const std::string caller(caller_view);
  const char* kind = KindName(constraint.kind);
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(options_.max_compile_ms < 0 ? 0 : options_.max_compile_ms);
  std::list<Worker> finished;
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result;
  {
    absl::MutexLock lock(&mu_);
    finished = TakeFinishedWorkersLocked();
    bool counted_miss = false;
    std::shared_ptr<Pending> pending;
    // Until the key is found compiled, refused, in flight, or a compile of it is started (a
    // slot may take a while to free, and another Get may start the same compile meanwhile).
    while (true) {
      if (auto it = index_.find(key); it != index_.end()) {
        ++stats_.hits;
        lru_.splice(lru_.begin(), lru_, it->second);
        result = it->second->compiled;
        break;
      }
      if (auto it = refusal_index_.find(key); it != refusal_index_.end()) {
        ++stats_.refusals_repeated;
        result = it->second->status;
        break;
      }
      if (!counted_miss) {
        ++stats_.misses;
        counted_miss = true;
      }
      if (auto in_flight = in_flight_.find(key); in_flight != in_flight_.end()) {
        pending = in_flight->second;
        break;
      }
      if (SlotFreeLocked(caller)) {
        pending = std::make_shared<Pending>();
        in_flight_[key] = pending;
        ++running_;
        ++running_by_caller_[caller];
        workers_.emplace_back();
        auto worker = std::prev(workers_.end());
        // The thread records its result under mu_, which this Get holds until it waits.
        worker->thread =
            std::thread(&GrammarCache::RunCompile, this, pending, constraint, key, caller, worker);
        break;
      }
      // Woken when anything that decides this Get changes: a compile ended (a slot freed, the key
      // compiled or refused) or one of the key started.
      struct Wait {
        GrammarCache* cache;
        const std::string* key;
        const std::string* caller;
      } wait{this, &key, &caller};
      const bool changed = mu_.AwaitWithDeadline(
          absl::Condition(
              +[](Wait* w) {
                w->cache->mu_.AssertHeld();
                return w->cache->SlotFreeLocked(*w->caller) || w->cache->index_.contains(*w->key) ||
                       w->cache->in_flight_.contains(*w->key) ||
                       w->cache->refusal_index_.contains(*w->key);
              },
              &wait),
          deadline);
      if (!changed) {
        ++stats_.slot_refusals;
        const auto mine = running_by_caller_.find(caller);
        const int64_t caller_running = mine == running_by_caller_.end() ? 0 : mine->second;
        result = absl::ResourceExhaustedError(
            caller_running >= options_.max_compiles_per_caller
                ? absl::StrCat("compiling the ", kind, " constraint for model ",
                               vocabulary_->model_name(), ": expected one of this caller's ",
                               caller_running,
                               " compiles running to end (at most that many per caller, "
                               "--constraint_compile_slots_per_caller) within ",
                               options_.max_compile_ms,
                               " ms (--constraint_compile_timeout_ms), but none did; try again "
                               "later")
                : absl::StrCat("compiling the ", kind, " constraint for model ",
                               vocabulary_->model_name(), ": expected one of the ", running_,
                               " compiles running (--constraint_compile_slots) to end within ",
                               options_.max_compile_ms,
                               " ms (--constraint_compile_timeout_ms), but none did; try again "
                               "later"));
        break;
      }
    }
    if (pending != nullptr) {
      if (mu_.AwaitWithDeadline(absl::Condition(&pending->done), deadline)) {
        result = pending->result;
      } else {
        ++stats_.timeouts;
        result = absl::ResourceExhaustedError(absl::StrCat(
            "compiling the ", kind, " constraint for model ", vocabulary_->model_name(),
            " took longer than ", options_.max_compile_ms,
            " ms (--constraint_compile_timeout_ms); it goes on in the background, and a retry "
            "may find it compiled",
            options_.worker.has_value()
                ? absl::StrCat(" (it is stopped at ", options_.worker->kill_ms,
                               " ms, --constraint_compile_kill_ms)")
                : ""));
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
  stats.compiles_running = running_;
  return stats;
}

}  // namespace tost::structured
