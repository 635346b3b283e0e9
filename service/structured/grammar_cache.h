// The compiled constraints of one model vocabulary, least recently used first out, each compile
// bounded in time: a request waits at most max_compile_ms for its grammar, and a compile that runs
// longer goes on in the background (its result still enters the cache, so a retry may hit) while
// the request is refused. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {

struct GrammarCacheOptions {
  // Compiled constraints kept (least recently used evicted first), at most max_entries of them
  // holding at most max_bytes in all (XGrammar's CompiledGrammar::MemorySizeBytes: the grammar
  // and its token masks, which grow with the grammar and the vocabulary). A constraint whose
  // compiled form takes more than max_bytes / 8 is refused (CompileConstraint) rather than kept.
  int64_t max_entries = 256;
  int64_t max_bytes = int64_t{256} << 20;
  // How long Get waits for a compile before refusing with RESOURCE_EXHAUSTED (the compile goes
  // on in the background). 0 returns only a compile that is done by the time Get looks.
  int64_t max_compile_ms = 2000;
  // Compiles that ran past max_compile_ms and are still running; while this many are, a Get that
  // would start a compile is refused with RESOURCE_EXHAUSTED (a hit, or joining a compile already
  // running for the same constraint, is not), so slow constraints cannot pile up threads.
  int64_t max_background_compiles = 2;
};

struct GrammarCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;          // Gets that found no compiled constraint (valid ones only)
  int64_t compiles = 0;        // compiles that finished with a compiled constraint
  int64_t compile_errors = 0;  // compiles that failed (INVALID_ARGUMENT)
  int64_t timeouts = 0;        // Gets refused because the compile ran past max_compile_ms
  int64_t evictions = 0;
  int64_t compile_micros_total = 0;  // wall time of finished compiles, background ones included
  int64_t entries = 0;
  int64_t bytes = 0;  // what the entries hold (CompiledConstraint::bytes)
};

class GrammarCache {
 public:
  // How a miss compiles; tests replace it to control when a compile finishes.
  using CompileFunction =
      std::function<absl::StatusOr<std::shared_ptr<const CompiledConstraint>>(const Constraint&)>;

  explicit GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary,
                        const GrammarCacheOptions& options = {});
  GrammarCache(std::shared_ptr<GrammarVocabulary> vocabulary, const GrammarCacheOptions& options,
               CompileFunction compile);
  // Waits for every compile still running (a compile cannot be interrupted).
  ~GrammarCache();
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  // The compiled form of `constraint`, compiling it on a miss. INVALID_ARGUMENT for a constraint
  // that Validate or the compiler refuses; RESOURCE_EXHAUSTED when the compile ran past
  // max_compile_ms, or when max_background_compiles compiles are already running past theirs.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Get(const Constraint& constraint);

  GrammarCacheStats stats() const;

  // Blocks until no compile is running (tests, and orderly shutdown).
  void WaitForCompiles();

 private:
  // One compile in flight, shared by the thread running it and every Get waiting for it.
  struct Pending {
    bool done = false;
    bool abandoned = false;  // a waiter gave up on it: it counts as a background compile
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

  void RunCompile(std::shared_ptr<Pending> pending, Constraint constraint, std::string key,
                  std::list<Worker>::iterator worker);
  void InsertLocked(const std::string& key, std::shared_ptr<const CompiledConstraint> compiled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the threads whose compile has finished out of workers_, for joining without the lock.
  std::list<Worker> TakeFinishedWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<GrammarVocabulary> vocabulary_;
  const GrammarCacheOptions options_;
  const CompileFunction compile_;

  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;     // what the entries of lru_ hold
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::list<Worker> workers_ ABSL_GUARDED_BY(mu_);
  int64_t background_compiles_ ABSL_GUARDED_BY(mu_) = 0;
  GrammarCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::structured
