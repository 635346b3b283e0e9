// Constrained generation as the engine sees it: a request's constraint (what its output must
// conform to), compiled once per model vocabulary into a per-sequence TokenConstraint that the
// scheduler asks for the allowed tokens before each draw and tells each drawn token.
//
// The grammar side is service/structured (XGrammar). This header names none of it, so the
// scheduler and its tests stay free of XGrammar, and a build without XGrammar (cmake/
// TostXGrammar.cmake leaves it out when its source is not configured) still serves everything
// else: its ConstraintCompiler refuses every constraint with FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/engine/constraint_progress.h"
#include "service/engine/model_interface.h"
#include "service/structured/constraint.h"

namespace tost::service {

// One sequence's progress through a compiled constraint. Not thread-safe: the scheduler's thread
// alone steps it once the job is submitted.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // 32-bit words of the bitmask FillAllowed writes: ceil(model logits width / 32).
  virtual int64_t bitmask_words() const = 0;
  // Bit i of word i/32 set: token i may come next (end-of-text only where the output may end).
  // Nothing set: the constraint admits no token here.
  virtual void FillAllowed(absl::Span<uint32_t> words) = 0;
  // Advances past `token`; an error when the constraint does not allow it.
  virtual absl::Status Accept(int32_t token) = 0;
  // Whether end-of-text was accepted: the output is complete.
  virtual bool Ended() const = 0;
  // Restarts from the beginning and accepts `output`, a sequence's output so far under this
  // constraint (ConstraintProgress::output): how a continued session or a resumed blob stands
  // where it was. On an error (Accept's, naming the position) it is back at the beginning.
  virtual absl::Status Replay(absl::Span<const int32_t> output) = 0;
  // What it was compiled from: a state carries it (ConstraintProgress) to be compiled again where
  // the sequence continues.
  virtual const structured::Constraint& spec() const = 0;
};

// What a model's compiled-constraint cache did since the server started (metrics).
struct ConstraintCacheStats {
  int64_t hits = 0;               // constraints found compiled
  int64_t compiles = 0;           // compiles that finished with a compiled constraint
  int64_t compile_errors = 0;     // compiles the compiler refused (INVALID_ARGUMENT)
  int64_t timeouts = 0;           // requests refused because their compile ran past max_compile_ms
  int64_t slot_refusals = 0;      // requests refused because no compile slot freed for their caller
  int64_t stopped = 0;            // compiles stopped past --constraint_compile_kill_ms or memory
  int64_t worker_failures = 0;    // compiles whose worker failed (not started, crashed)
  int64_t refusals_repeated = 0;  // requests refused as a stopped compile's constraint
  int64_t evictions = 0;
  int64_t compile_micros_total = 0;  // wall time of finished compiles
  int64_t worker_max_rss_bytes = 0;  // the largest peak memory of a compile worker
  int64_t entries = 0;
  int64_t bytes = 0;  // what the entries hold
  int64_t compiles_running = 0;
};

struct ConstraintCompilerOptions {
  // Compiled constraints kept per model (least recently used evicted first), at most max_entries
  // holding at most max_bytes; one whose compiled form takes more than max_bytes / 8 is refused
  // (INVALID_ARGUMENT) instead of kept.
  int64_t max_entries = 256;
  int64_t max_bytes = int64_t{256} << 20;
  // How long a request waits for a compile slot and its constraint's compile before it is refused
  // with RESOURCE_EXHAUSTED (the compile goes on in the background; a retry may hit the cache).
  int64_t max_compile_ms = 2000;
  // Compiles running at once per model, and the most of those one caller's requests may have
  // started (the caller: a request's owner, its API key's name or TLS identity, else
  // "anonymous", which all keyless callers share). Below max_compiles, one caller's slow
  // compiles leave slots to the others.
  int64_t max_compiles = 4;
  int64_t max_compiles_per_caller = 2;
  // The compile worker (tost_constraint_compiler, FindConstraintCompiler): each compile runs
  // first in a process killed past kill_ms (more than max_compile_ms) or memory_bytes of address
  // space, and such a constraint is refused with INVALID_ARGUMENT from then on. Empty: compiles
  // run in-process only, and one past its bound runs on to its end.
  std::string compiler_path;
  int64_t kill_ms = 10000;
  int64_t memory_bytes = int64_t{1} << 30;
};

// INVALID_ARGUMENT naming the option: the cache's bounds negative, max_compiles below 1,
// max_compiles_per_caller outside 1..max_compiles, and with a compiler_path, kill_ms outside
// (max_compile_ms, 600000] or memory_bytes below 64 MiB.
absl::Status ValidateConstraintCompilerOptions(const ConstraintCompilerOptions& options);

// Where the compile worker is: `configured` when set, else tost_constraint_compiler beside this
// process's executable; FAILED_PRECONDITION saying what was tried when it is not there or does
// not answer as this build's worker, and "" in a build without XGrammar (which compiles nothing).
absl::StatusOr<std::string> FindConstraintCompiler(const std::string& configured);

// The compiled constraints of one language model. Thread-safe; Compile runs on the caller's
// thread (the request's), never the scheduler's.
class ConstraintCompiler {
 public:
  ConstraintCompiler(const GenerativeModel& model, const ConstraintCompilerOptions& options = {});
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // A fresh TokenConstraint for `spec`, compiled (on a miss) in one of `caller`'s slots.
  // INVALID_ARGUMENT naming the field for a constraint of the wrong shape, with the compiler's
  // message for a schema, regex or grammar it refuses, or naming the bound a compile ran past;
  // RESOURCE_EXHAUSTED when no slot freed for the caller, or the compile took longer, than
  // max_compile_ms; FAILED_PRECONDITION, naming the model, when the model's tokenizer cannot
  // support constraints (or the server was built without XGrammar). The model's grammar
  // vocabulary is built on the first call.
  absl::StatusOr<std::unique_ptr<TokenConstraint>> Compile(const structured::Constraint& spec,
                                                           const std::string& caller);

  // All zero until the first constrained request builds the cache.
  ConstraintCacheStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tost::service
