// Constraint compiles in a worker process (tost_constraint_compiler, compile_worker_main.cc), so
// that a compile past its bound stops. XGrammar's compile cannot be interrupted and a thread cannot
// be killed; a process can. The worker is spawned with posix_spawn (fork and exec in one: forking
// a server that runs LibTorch and gRPC threads is unsafe beyond exec), is sent the model's
// vocabulary and the constraint over a socket, and compiles under an address-space limit
// (RLIMIT_AS) and a CPU-time limit (RLIMIT_CPU, which also ends a worker whose server is gone).
// The thread that spawned it kills it (SIGKILL) at its wall-clock deadline and reaps it, whatever
// happened.
//
// The worker answers whether the constraint compiled within those bounds (or the compiler's
// error); the server then compiles it itself, knowing the compile ends, and in how much memory.
// XGrammar 0.2.8 can serialize a compiled grammar (CompiledGrammar::SerializeJSON), but its JSON
// repeats the grammar's whole automaton in every rule's: on tost-austen, a schema of 800 optional
// properties compiles in 1.8 s to 2.4 MB and serializes to 225 MB, which took 16 s and 1.9 GB to
// read back. Reading a worker's grammar can cost the server more, in time and in memory, than
// compiling it again.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/structured/constraint.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {

// The worker's executable name; the server looks for it beside its own (FindCompileWorker).
inline constexpr char kCompileWorkerName[] = "tost_constraint_compiler";

struct CompileWorkerOptions {
  // The tost_constraint_compiler executable.
  std::string path;
  // Wall time from the worker's start (sending it the vocabulary included) to its SIGKILL. Its CPU
  // time is limited to this, rounded up to whole seconds, plus one second.
  int64_t kill_ms = 10000;
  // The worker's address space (RLIMIT_AS): past it an allocation fails and the worker ends. It
  // holds the worker's code and libraries (some 10 MiB before a compile) and the vocabulary
  // besides the compile; within Validate's shape bounds the compiles measured on tost-austen took
  // at most 32 MiB (1000 optional properties).
  int64_t memory_bytes = int64_t{256} << 20;
};
inline constexpr int64_t kMinCompileWorkerMemoryBytes = int64_t{16} << 20;

// INVALID_ARGUMENT naming the field for an empty path, kill_ms outside 1..600000, or memory_bytes
// below kMinCompileWorkerMemoryBytes.
absl::Status ValidateCompileWorkerOptions(const CompileWorkerOptions& options);

struct WorkerResult {
  // OK: the constraint compiled within the bounds. INVALID_ARGUMENT: the compiler refused it (its
  // message), or the compile ran past a bound (past_bound: its time or its memory). UNAVAILABLE:
  // no worker could be started. CANCELLED: `cancel` was set, and the worker killed. INTERNAL: the
  // worker failed otherwise (ended by a signal it was not sent, or answered outside the protocol).
  absl::Status status;
  bool past_bound = false;
  int64_t max_rss_bytes = 0;  // the worker's peak resident memory
};

// Compiles `constraint` against `vocabulary` (refusing a compiled form over `max_bytes`, 0: no
// bound, as CompileConstraint does) in a fresh worker, on the calling thread, for at most
// options.kill_ms. `cancel`, when given, is looked at every 50 ms: once true, the worker is killed.
WorkerResult CompileInWorker(const CompileWorkerOptions& options,
                             const GrammarVocabulary& vocabulary, const Constraint& constraint,
                             int64_t max_bytes, const std::atomic<bool>* cancel = nullptr);

// `configured` when set, else kCompileWorkerName beside this process's executable; OK when it
// runs and answers as this build's worker (its --handshake), else FAILED_PRECONDITION saying what
// was tried and why it failed.
absl::StatusOr<std::string> FindCompileWorker(const std::string& configured);

// --- the worker's protocol (compile_worker_main.cc reads and writes it) -------------------------

// What `tost_constraint_compiler --handshake` prints: the protocol's version.
inline constexpr char kCompileWorkerHandshake[] = "tost_constraint_compiler protocol 1\n";

// One compile as the worker reads it from its stdin (to end of file).
struct WorkerRequest {
  std::string model_name;
  int64_t model_vocab_size = 0;
  int32_t eos_token_id = 0;
  std::vector<std::string> tokens;
  Constraint constraint;
  int64_t max_bytes = 0;
};

std::string EncodeWorkerRequest(const GrammarVocabulary& vocabulary, const Constraint& constraint,
                                int64_t max_bytes);
// INVALID_ARGUMENT naming the field that is cut short or out of range.
absl::StatusOr<WorkerRequest> DecodeWorkerRequest(std::string_view bytes);

// The worker's answer on its stdout: the compile's status (its code and message).
std::string EncodeWorkerAnswer(const absl::Status& status);
// Sets `answer` to the status the worker answered; INVALID_ARGUMENT when `bytes` is not an
// answer (a status of a status, which absl::StatusOr cannot hold apart).
absl::Status DecodeWorkerAnswer(std::string_view bytes, absl::Status* answer);

// The worker's exit code when an allocation failed (its new-handler's): past memory_bytes.
inline constexpr int kWorkerExitOutOfMemory = 3;

}  // namespace tost::structured
