// The compile worker (service/structured/compile_worker.h) over the shipped tost-austen tokenizer:
// its protocol, the real tost_constraint_compiler compiling, refusing, killed at its deadline and
// past its memory, cancelled; and the grammar cache's slots shared between callers, a compile
// past its bound stopped while another caller's compiles on, and its constraint refused after.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/error_detail.h"
#include "model/config/config.h"
#include "model/text/tokenizer.h"
#include "service/structured/compile_worker.h"
#include "service/structured/compiled_constraint.h"
#include "service/structured/constraint.h"
#include "service/structured/grammar_cache.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::shared_ptr<GrammarVocabulary> Vocabulary() {
  static const std::shared_ptr<GrammarVocabulary> vocabulary = [] {
    const std::string dir = absl::StrCat(TOST_SOURCE_DIR, "/models/tost-austen");
    auto config = model::LoadModelConfig(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    auto tokenizer = model::LoadTokenizer(dir, config->language);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto created =
        GrammarVocabulary::Create(**tokenizer, (*tokenizer)->vocab_size(), "tost-austen");
    EXPECT_TRUE(created.ok()) << created.status();
    return *created;
  }();
  return vocabulary;
}

Constraint Schema(std::string schema) {
  return Constraint{Constraint::Kind::kJsonSchema, std::move(schema), {}};
}

// Within every shape bound (a pattern of 1000 is the most one may spell out), yet some 75 ms of
// compile per property on tost-austen's vocabulary: `properties` of them take seconds. `salt`
// makes distinct constraints of one cost.
Constraint SlowSchema(int properties, int salt = 0) {
  std::string schema = R"({"type":"object","properties":{)";
  std::string required;
  for (int i = 0; i < properties; ++i) {
    absl::StrAppend(&schema, i == 0 ? "" : ",", "\"p", i, "_", salt,
                    R"(":{"type":"string","pattern":"^[a-z]{1000}$"})");
    absl::StrAppend(&required, i == 0 ? "" : ",", "\"p", i, "_", salt, "\"");
  }
  absl::StrAppend(&schema, "},\"required\":[", required, "]}");
  return Schema(schema);
}

CompileWorkerOptions WorkerOptions(int64_t kill_ms = 10000) {
  return CompileWorkerOptions{.path = TOST_CONSTRAINT_COMPILER, .kill_ms = kill_ms};
}

int64_t MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// The processes whose parent is this one (the workers not yet reaped included), from /proc.
int ChildProcesses() {
  int children = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // gone since it was listed
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, the last ')' ends it.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    char state = 0;
    int parent = 0;
    if (rest >> state >> parent && parent == getpid()) ++children;
  }
  return children;
}

// --- the protocol ------------------------------------------------------------------------------

TEST(CompileWorkerProtocol, ARequestDecodesToWhatWasEncoded) {
  const Constraint choice{Constraint::Kind::kChoice, "", {"yes", std::string("n\0o", 3)}};
  const std::string bytes = EncodeWorkerRequest(*Vocabulary(), choice, 12345);
  absl::StatusOr<WorkerRequest> request = DecodeWorkerRequest(bytes);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->model_name, "tost-austen");
  EXPECT_EQ(request->model_vocab_size, Vocabulary()->model_vocab_size());
  EXPECT_EQ(request->eos_token_id, Vocabulary()->eos_token_id());
  EXPECT_EQ(request->tokens, Vocabulary()->tokens());
  EXPECT_EQ(request->constraint, choice);
  EXPECT_EQ(request->max_bytes, 12345);
  // tost-austen's 2048 tokens: what every compile sends its worker.
  EXPECT_LT(bytes.size(), 64u * 1024);

  // Every cut is refused, naming what is missing; so is a byte past the end.
  for (size_t cut : {size_t{0}, size_t{10}, size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    absl::StatusOr<WorkerRequest> short_request = DecodeWorkerRequest(bytes.substr(0, cut));
    EXPECT_EQ(short_request.status().code(), absl::StatusCode::kInvalidArgument) << cut;
    EXPECT_THAT(short_request.status().message(), HasSubstr("compile worker request: expected"));
  }
  EXPECT_THAT(DecodeWorkerRequest(bytes + "x").status().message(),
              HasSubstr("expected its end, received 1 more bytes"));
}

TEST(CompileWorkerProtocol, AnAnswerKeepsTheCodeMessageAndPayloads) {
  absl::Status refused = absl::InvalidArgumentError("the grammar compiler refused it");
  refused.SetPayload("type.example/detail", absl::Cord("XGrammar: the whole text"));
  absl::Status decoded;
  ASSERT_TRUE(DecodeWorkerAnswer(EncodeWorkerAnswer(refused), &decoded).ok());
  EXPECT_EQ(decoded, refused);
  EXPECT_EQ(decoded.GetPayload("type.example/detail"), absl::Cord("XGrammar: the whole text"));
  ASSERT_TRUE(DecodeWorkerAnswer(EncodeWorkerAnswer(absl::OkStatus()), &decoded).ok());
  EXPECT_TRUE(decoded.ok());
  const std::string answer = EncodeWorkerAnswer(refused);
  for (const std::string& bad :
       {std::string("garbage"), answer.substr(0, answer.size() - 1), answer + "x"}) {
    EXPECT_EQ(DecodeWorkerAnswer(bad, &decoded).code(), absl::StatusCode::kInvalidArgument);
  }
}

// --- the worker --------------------------------------------------------------------------------

TEST(CompileWorker, FindsTheWorkerAndRefusesWhatIsNotIt) {
  absl::StatusOr<std::string> found = FindCompileWorker(TOST_CONSTRAINT_COMPILER);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, TOST_CONSTRAINT_COMPILER);
  absl::StatusOr<std::string> missing = FindCompileWorker("/nonexistent/tost_constraint_compiler");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/tost_constraint_compiler"));
  // An executable that does not answer the handshake is not taken for the worker.
  absl::StatusOr<std::string> other = FindCompileWorker("/bin/true");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("expected it to answer --handshake"));
  // Beside this test's executable there is none: not found, saying where it looked.
  absl::StatusOr<std::string> beside = FindCompileWorker("");
  EXPECT_EQ(beside.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(beside.status().message(), HasSubstr("/tost_constraint_compiler"));
}

TEST(CompileWorker, CompilesAndRefusesAsTheServerWould) {
  const auto start = std::chrono::steady_clock::now();
  WorkerResult ok = CompileInWorker(
      WorkerOptions(), *Vocabulary(),
      Schema(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})"), 0);
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_FALSE(ok.past_bound);
  EXPECT_GT(ok.max_rss_bytes, 0);
  std::printf("a small schema's worker compile: %lld ms, peak RSS %lld KiB\n",
              static_cast<long long>(MillisSince(start)),
              static_cast<long long>(ok.max_rss_bytes >> 10));

  // The compiler's refusal, word for word what the in-process compile says.
  for (const Constraint& bad : {Schema(R"({"type":"string","minLength":5,"maxLength":2})"),
                                Constraint{Constraint::Kind::kRegex, "[a-", {}},
                                Constraint{Constraint::Kind::kGrammar, "root ::= ", {}}}) {
    WorkerResult refused = CompileInWorker(WorkerOptions(), *Vocabulary(), bad, 0);
    const absl::Status in_process = CompileConstraint(Vocabulary(), bad).status();
    EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << bad.text;
    EXPECT_EQ(refused.status, in_process) << bad.text;
    EXPECT_FALSE(refused.past_bound);
  }
  // So is the bound on the compiled form.
  const Constraint big{Constraint::Kind::kRegex, "[a-z]{1,5000}", {}};
  WorkerResult too_big = CompileInWorker(WorkerOptions(), *Vocabulary(), big, 1000);
  EXPECT_EQ(too_big.status, CompileConstraint(Vocabulary(), big, 1000).status());
  EXPECT_THAT(too_big.status.message(), HasSubstr("compiled, it takes"));
}

TEST(CompileWorker, ACompilePastItsDeadlineIsKilledThere) {
  const int children = ChildProcesses();
  const auto start = std::chrono::steady_clock::now();
  WorkerResult killed =
      CompileInWorker(WorkerOptions(/*kill_ms=*/1000), *Vocabulary(), SlowSchema(200), 0);
  const int64_t ms = MillisSince(start);
  EXPECT_EQ(killed.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(killed.status.message(),
              AllOf(HasSubstr("constraint json_schema for model tost-austen: its compile ran past "
                              "1000 ms (--constraint_compile_kill_ms) and was stopped"),
                    HasSubstr("as retrying gets the same answer")));
  EXPECT_TRUE(killed.past_bound);
  EXPECT_GE(ms, 1000);
  EXPECT_LT(ms, 1500) << "killed at its deadline, not when the compile would have ended";
  EXPECT_EQ(ChildProcesses(), children) << "the worker is reaped";
  std::printf("a worker killed at 1000 ms returned after %lld ms\n", static_cast<long long>(ms));
}

TEST(CompileWorker, ACompilePastItsMemoryEnds) {
  // 1000 optional properties, within every shape bound: some 32 MiB of address space at its peak
  // (4 s of compile), of which the worker's code and libraries are 10 MiB. Given 20 MiB, the worker
  // ends when an allocation fails, instead of the server.
  CompileWorkerOptions options = WorkerOptions();
  options.memory_bytes = int64_t{20} << 20;
  std::string schema = R"({"type":"object","properties":{)";
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&schema, i == 0 ? "" : ",", "\"p", i, R"(":{"type":"integer"})");
  }
  schema += "}}";
  WorkerResult ended = CompileInWorker(options, *Vocabulary(), Schema(schema), 0);
  EXPECT_EQ(ended.status.code(), absl::StatusCode::kInvalidArgument) << ended.status;
  EXPECT_THAT(ended.status.message(),
              HasSubstr("needed more than the 20 MiB a compile may use "
                        "(--constraint_compile_memory_mb) and was stopped"));
  EXPECT_TRUE(ended.past_bound);
  EXPECT_LE(ended.max_rss_bytes, options.memory_bytes);
}

TEST(CompileWorker, ACancelledCompileIsKilledAtOnce) {
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.store(true);
  });
  const auto start = std::chrono::steady_clock::now();
  WorkerResult cancelled =
      CompileInWorker(WorkerOptions(), *Vocabulary(), SlowSchema(200), 0, &cancel);
  const int64_t ms = MillisSince(start);
  canceller.join();
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(cancelled.past_bound);
  EXPECT_LT(ms, 1000);
}

TEST(CompileWorker, AWorkerThatCannotStartIsUnavailable) {
  CompileWorkerOptions options = WorkerOptions();
  options.path = "/nonexistent/tost_constraint_compiler";
  WorkerResult result = CompileInWorker(options, *Vocabulary(), Schema(R"({"type":"integer"})"), 0);
  EXPECT_EQ(result.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status.message(),
              HasSubstr("starting a constraint compile worker: No such file or directory"));
  // The server's path is for its log only.
  EXPECT_THAT(result.status.message(), Not(HasSubstr("/nonexistent")));
  EXPECT_THAT(ServerDetail(result.status), HasSubstr("/nonexistent/tost_constraint_compiler"));
}

TEST(CompileWorker, OptionsAreValidated) {
  EXPECT_TRUE(ValidateCompileWorkerOptions(WorkerOptions()).ok());
  CompileWorkerOptions options = WorkerOptions();
  options.path.clear();
  EXPECT_THAT(ValidateCompileWorkerOptions(options).message(), HasSubstr("compile worker path"));
  options = WorkerOptions(0);
  EXPECT_THAT(ValidateCompileWorkerOptions(options).message(),
              HasSubstr("kill_ms: expected 1 to 600000, received 0"));
  options = WorkerOptions();
  options.memory_bytes = 1 << 20;
  EXPECT_THAT(ValidateCompileWorkerOptions(options).message(),
              HasSubstr("memory_bytes: expected at least 16 MiB"));

  GrammarCacheOptions cache;
  cache.max_compiles = 2;
  cache.max_compiles_per_caller = 3;
  EXPECT_THAT(ValidateGrammarCacheOptions(cache).message(),
              HasSubstr("max_compiles_per_caller: expected 1 to max_compiles (2), received 3"));
  cache = GrammarCacheOptions{};
  cache.worker = WorkerOptions(/*kill_ms=*/2000);
  cache.max_compile_ms = 2000;
  EXPECT_THAT(ValidateGrammarCacheOptions(cache).message(),
              HasSubstr("kill_ms: expected more than max_compile_ms (2000), received 2000"));
  cache.worker->kill_ms = 2001;
  EXPECT_TRUE(ValidateGrammarCacheOptions(cache).ok());
}

// --- the cache's slots and its worker ------------------------------------------------------------

// Two slow compiles of one caller fill its slots; another caller's constraint compiles beside
// them, at once; the slow ones are refused after max_compile_ms, killed at kill_ms, and refused
// from then on without a compile.
TEST(GrammarCacheWorker, OneCallersSlowCompilesLeaveTheOthersCompiling) {
  // Waits and deadlines with room for a loaded machine: Bob's compile takes some 10 ms alone.
  GrammarCacheOptions options;
  options.max_compile_ms = 1000;
  options.max_compiles = 4;
  options.max_compiles_per_caller = 2;
  options.worker = WorkerOptions(/*kill_ms=*/2500);
  GrammarCache cache(Vocabulary(), options);
  const int children = ChildProcesses();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> slow;
  std::vector<absl::Status> slow_status(2);
  for (int i = 0; i < 2; ++i) {
    slow.emplace_back([&, i] { slow_status[i] = cache.Get(SlowSchema(200, i), "alice").status(); });
  }
  while (cache.stats().compiles_running < 2) std::this_thread::yield();
  // Alice's third compile finds her two slots taken and none freeing within max_compile_ms.
  absl::Status third = cache.Get(SlowSchema(200, 2), "alice").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(),
              HasSubstr("expected one of this caller's 2 compiles running to end (at most that "
                        "many per caller, --constraint_compile_slots_per_caller)"));
  // Bob's compiles meanwhile.
  const auto bob_start = std::chrono::steady_clock::now();
  auto bob = cache.Get(Schema(R"({"type":"object","properties":{"n":{"type":"integer"}}})"), "bob");
  EXPECT_TRUE(bob.ok()) << bob.status();
  EXPECT_LT(MillisSince(bob_start), 1000);
  for (std::thread& thread : slow) thread.join();
  for (const absl::Status& status : slow_status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(status.message(), HasSubstr("took longer than 1000 ms"));
  }
  // Killed at 2.5 s: the compiles end, and nothing of them is left running.
  cache.WaitForCompiles();
  const int64_t ms = MillisSince(start);
  EXPECT_GE(ms, 2500);
  EXPECT_LT(ms, 4000) << "the slow compiles (some 15 s each) were stopped at their kill_ms";
  EXPECT_EQ(ChildProcesses(), children);
  GrammarCacheStats stats = cache.stats();
  EXPECT_EQ(stats.stopped, 2);
  EXPECT_EQ(stats.compiles_running, 0);
  EXPECT_EQ(stats.slot_refusals, 1);
  // Refused at once from now on, with the kill's reason.
  const auto again_start = std::chrono::steady_clock::now();
  absl::Status again = cache.Get(SlowSchema(200, 0), "carol").status();
  EXPECT_LT(MillisSince(again_start), 100);
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(again.message(), HasSubstr("ran past 2500 ms (--constraint_compile_kill_ms)"));
  EXPECT_EQ(cache.stats().refusals_repeated, 1);
  EXPECT_EQ(cache.stats().stopped, 2);
}

// Every slot taken (by two callers): a third caller waits for one within max_compile_ms, and is
// refused naming the model's slots.
TEST(GrammarCacheWorker, AllSlotsTakenIsRefusedNamingThem) {
  GrammarCacheOptions options;
  options.max_compile_ms = 500;
  options.max_compiles = 2;
  options.max_compiles_per_caller = 1;
  // Alice's compile is killed well after Carol stopped waiting (at 1.5 s: after two waits).
  options.worker = WorkerOptions(/*kill_ms=*/3000);
  GrammarCache cache(Vocabulary(), options);
  EXPECT_EQ(cache.Get(SlowSchema(200, 0), "alice").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.Get(SlowSchema(200, 1), "bob").status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::Status carol = cache.Get(Schema(R"({"type":"integer"})"), "carol").status();
  EXPECT_EQ(carol.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(carol.message(),
              HasSubstr("expected one of the 2 compiles running (--constraint_compile_slots) to "
                        "end within 500 ms"));
  cache.WaitForCompiles();
  // The slots are free again once the killed compiles ended.
  EXPECT_TRUE(cache.Get(Schema(R"({"type":"integer"})"), "carol").ok());
}

// A Get whose slot frees within max_compile_ms compiles then, instead of being refused.
TEST(GrammarCacheWorker, AGetWaitsForItsCallersSlot) {
  GrammarCacheOptions options;
  options.max_compile_ms = 5000;
  options.max_compiles_per_caller = 1;
  options.worker = WorkerOptions(/*kill_ms=*/6000);
  GrammarCache cache(Vocabulary(), options);
  std::vector<std::thread> threads;
  std::vector<absl::Status> statuses(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      statuses[i] =
          cache.Get(Schema(absl::StrCat(R"({"type":"integer","maximum":)", i, "}")), "alice")
              .status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cache.stats().compiles, 3);
  EXPECT_EQ(cache.stats().slot_refusals, 0);
}

// The destructor does not wait out a worker compile: it is killed.
TEST(GrammarCacheWorker, DestroyingTheCacheStopsItsWorkers) {
  const int children = ChildProcesses();
  const auto start = std::chrono::steady_clock::now();
  {
    GrammarCacheOptions options;
    options.max_compile_ms = 100;
    options.worker = WorkerOptions(/*kill_ms=*/60000);
    GrammarCache cache(Vocabulary(), options);
    EXPECT_EQ(cache.Get(SlowSchema(200)).status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_LT(MillisSince(start), 1000);
  EXPECT_EQ(ChildProcesses(), children);
}

}  // namespace
}  // namespace tost::structured
