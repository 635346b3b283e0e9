// The compiled constraints of one model vocabulary, least recently used first out, each compile
// bounded: a request waits at most max_compile_ms for its grammar (a compile that runs longer goes
// on in the background, and its result still enters the cache, so a retry may hit); with a
// compile worker, a compile past the worker's kill_ms or memory is stopped, and its constraint is
// refused from then on; compiles hold slots, shared between callers so that one caller's slow
// compiles cannot take them all. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "service/structured/compile_worker.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {

struct GrammarCacheOptions {
  // Compiled constraints kept (least recently used evicted first), at most max_entries of them
  // holding at most max_bytes in all: XGrammar's CompiledGrammar::MemorySizeBytes (the grammar
  // and its token masks, which grow with the grammar and the vocabulary) and the key (the
  // constraint's text or choices). A constraint whose compiled form takes more than
  // max_bytes / 8 is refused (CompileConstraint) rather than kept.
  int64_t max_entries = 256;
  int64_t max_bytes = int64_t{256} << 20;
  // How long Get waits for a compile slot and the compile together before refusing with
  // RESOURCE_EXHAUSTED (a compile started goes on in the background). 0 returns only a compile
  // that is done by the time Get looks.
  int64_t max_compile_ms = 2000;
  // Compiles running at once, and of those, the most one caller's Gets may have started: a
  // compile holds its slot until it ends (with a worker, within worker->kill_ms and the in-process
  // compile after it). A Get that would start a compile waits (within max_compile_ms) for a slot
  // free to its caller, else is refused with RESOURCE_EXHAUSTED; a hit, or joining a compile
  // already running for the same constraint, takes no slot. With max_compiles_per_caller below
  // max_compiles, one caller's slow compiles leave the others slots.
  int64_t max_compiles = 4;
  int64_t max_compiles_per_caller = 2;
  // Set: each compile runs first in a worker process that is killed past its kill_ms or memory
  // (past_bound: the constraint is refused from then on, with INVALID_ARGUMENT), and only one that
  // compiled there is compiled in-process, in a time and memory the worker proved (
  // compile_worker.h says why twice). Unset: in-process only, and a compile cannot be stopped.
  std::optional<CompileWorkerOptions> worker;
};

// INVALID_ARGUMENT naming the field: max_entries or max_bytes negative, max_compile_ms negative,
// max_compiles below 1, max_compiles_per_caller outside 1..max_compiles, or a worker whose options
// ValidateCompileWorkerOptions refuses or whose kill_ms is not past max_compile_ms.
absl::Status ValidateGrammarCacheOptions(const GrammarCacheOptions& options);

// Constraints whose worker compile ran past a bound, kept to refuse them again without a compile:
// at most this many, holding at most kMaxRefusalBytes of keys (least recently refused out).
inline constexpr int64_t kMaxRefusals = 64;
inline constexpr int64_t kMaxRefusalBytes = int64_t{4} << 20;

struct GrammarCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;             // Gets that found no compiled constraint (valid ones only)
  int64_t compiles = 0;           // compiles that finished with a compiled constraint
  int64_t compile_errors = 0;     // compiles the compiler refused (INVALID_ARGUMENT)
  int64_t timeouts = 0;           // Gets refused because the compile ran past max_compile_ms
  int64_t slot_refusals = 0;      // Gets refused because no compile slot freed for their caller
  int64_t stopped = 0;            // worker compiles stopped past their time or memory bound
  int64_t worker_failures = 0;    // worker compiles that failed otherwise (not started, crashed)
  int64_t refusals_repeated = 0;  // Gets refused as a stopped compile's constraint, uncompiled
  int64_t evictions = 0;
  int64_t compile_micros_total = 0;  // wall time of finished compiles, background ones included
  int64_t worker_max_rss_bytes = 0;  // the largest peak resident memory of a worker compile
  int64_t entries = 0;
  int64_t bytes = 0;  // what the entries hold (CompiledConstraint::bytes and the keys)
  int64_t compiles_running = 0;
};

class GrammarCache {
 public:
  // How a miss compiles; tests replace it to control when a compile finishes.
  using CompileFunction =
      std::function<absl::StatusOr<std::shared_ptr<const CompiledConstraint>>(const Constraint&)>;

  // `options` as ValidateGrammarCacheOptions accepts them.
  explicit GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary,
                        const GrammarCacheOptions& options = {});
  // `compile` replaces the in-process compile (after the worker's, when there is a worker).
  GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary, const GrammarCacheOptions& options,
               CompileFunction compile);
  // Stops the worker compiles still running and waits for every compile thread (an in-process
  // compile cannot be interrupted).
  ~GrammarCache();
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  // The compiled form of `constraint`, compiling it on a miss for `caller` (whose compiles share
  // max_compiles_per_caller slots). INVALID_ARGUMENT for a constraint that Validate or the
  // compiler refuses, or whose worker compile ran past a bound (then or before); RESOURCE_EXHAUSTED
  // when no slot freed for the caller, or the compile ran past, max_compile_ms.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Get(const Constraint& constraint,
                                                                std::string_view caller = "");

  GrammarCacheStats stats() const;

  // Blocks until no compile is running (tests, and orderly shutdown).
  void WaitForCompiles();

 private:
  // One compile in flight, shared by the thread running it and every Get waiting for it.
  struct Pending {
    bool done = false;
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> result;
  };
  struct Worker {
    std::thread thread;
    bool finished = false;  // its compile is recorded; joining it does not wait for the compile
  };
  struct Entry {
    std::string key;
    std::shared_ptr<const CompiledConstraint> compiled;
  };

  struct Refusal {
    std::string key;
    absl::Status status;
  };

  void RunCompile(std::shared_ptr<Pending> pending, Constraint constraint, std::string key,
                  std::string caller, std::list<Worker>::iterator worker);
  void InsertLocked(const std::string& key, std::shared_ptr<const CompiledConstraint> compiled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberRefusalLocked(const std::string& key, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `caller` may start a compile now: a slot is free, and fewer than
  // max_compiles_per_caller of the running ones are the caller's.
  bool SlotFreeLocked(const std::string& caller) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the threads whose compile has finished out of workers_, for joining without the lock.
  std::list<Worker> TakeFinishedWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<GrammarVocabulary> vocabulary_;
  const GrammarCacheOptions options_;
  const CompileFunction compile_;
  // Set by the destructor: the worker compiles still running are killed.
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;     // what the entries of lru_ hold
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::list<Worker> workers_ ABSL_GUARDED_BY(mu_);
  // Compiles running (their threads not yet finished), in all and by the caller that started them.
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int64_t> running_by_caller_ ABSL_GUARDED_BY(mu_);
  std::list<Refusal> refusals_ ABSL_GUARDED_BY(mu_);  // most recently refused first
  int64_t refusal_bytes_ ABSL_GUARDED_BY(mu_) = 0;    // the keys refusals_ holds
  absl::flat_hash_map<std::string, std::list<Refusal>::iterator> refusal_index_
      ABSL_GUARDED_BY(mu_);
  GrammarCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::structured
