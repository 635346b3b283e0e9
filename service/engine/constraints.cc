#include "service/engine/constraints.h"

#include <utility>

#include "absl/strings/str_cat.h"

#if TOST_WITH_STRUCTURED
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/error_detail.h"
#include "base/status_macros.h"
#include "service/structured/constraint.h"
#include "service/structured/constraint_matcher.h"
#include "service/structured/grammar_cache.h"
#include "service/structured/grammar_vocabulary.h"
#endif

namespace tost::service {

#if TOST_WITH_STRUCTURED
namespace {

class MatcherConstraint final : public TokenConstraint {
 public:
  MatcherConstraint(structured::Constraint spec,
                    std::shared_ptr<const structured::CompiledConstraint> compiled)
      : spec_(std::move(spec)), matcher_(std::move(compiled)) {}
  int64_t bitmask_words() const override { return matcher_.bitmask_words(); }
  void FillAllowed(absl::Span<uint32_t> words) override { matcher_.FillAllowed(words); }
  absl::Status Accept(int32_t token) override { return matcher_.Accept(token); }
  bool Ended() const override { return matcher_.Ended(); }
  absl::Status Replay(absl::Span<const int32_t> output) override { return matcher_.Replay(output); }
  const structured::Constraint& spec() const override { return spec_; }

 private:
  const structured::Constraint spec_;
  structured::ConstraintMatcher matcher_;
};

structured::GrammarCacheOptions CacheOptions(const ConstraintCompilerOptions& options) {
  structured::GrammarCacheOptions cache;
  cache.max_entries = options.max_entries;
  cache.max_bytes = options.max_bytes;
  cache.max_compile_ms = options.max_compile_ms;
  cache.max_compiles = options.max_compiles;
  cache.max_compiles_per_caller = options.max_compiles_per_caller;
  if (!options.compiler_path.empty()) {
    cache.worker = structured::CompileWorkerOptions{.path = options.compiler_path,
                                                    .kill_ms = options.kill_ms,
                                                    .memory_bytes = options.memory_bytes};
  }
  return cache;
}

}  // namespace

absl::Status ValidateConstraintCompilerOptions(const ConstraintCompilerOptions& options) {
  return structured::ValidateGrammarCacheOptions(CacheOptions(options));
}

absl::StatusOr<std::string> FindConstraintCompiler(const std::string& configured) {
  return structured::FindCompileWorker(configured);
}

struct ConstraintCompiler::Impl {
  Impl(const GenerativeModel& model, const ConstraintCompilerOptions& options)
      : model(model), options(options) {}

  const GenerativeModel& model;
  const ConstraintCompilerOptions options;
  absl::Mutex mu;
  // Built on the first constrained request (the vocabulary's byte strings cost a pass over every
  // token, which a server that never sees a constraint need not pay at startup); the error of a
  // tokenizer that cannot support constraints is kept and returned to every request.
  bool built ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<std::shared_ptr<structured::GrammarCache>> cache ABSL_GUARDED_BY(mu) =
      absl::UnknownError("not built");

  absl::StatusOr<std::shared_ptr<structured::GrammarCache>> Cache() {
    absl::MutexLock lock(&mu);
    if (!built) {
      built = true;
      const model::ModelConfig& config = model.config();
      absl::StatusOr<std::shared_ptr<structured::GrammarVocabulary>> vocabulary =
          structured::GrammarVocabulary::Create(model.tokenizer(), config.language.vocab_size,
                                                config.name);
      if (!vocabulary.ok()) {
        // A tokenizer that cannot support constraints is the model's condition, whatever code
        // the vocabulary's checks chose.
        cache = WithServerDetail(
            absl::FailedPreconditionError(absl::StrCat(
                "model \"", config.name,
                "\" does not support constrained generation: ", vocabulary.status().message())),
            ServerDetail(vocabulary.status()));
      } else {
        cache = std::make_shared<structured::GrammarCache>(*std::move(vocabulary),
                                                           CacheOptions(options));
      }
    }
    return cache;
  }
};

ConstraintCompiler::ConstraintCompiler(const GenerativeModel& model,
                                       const ConstraintCompilerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

ConstraintCompiler::~ConstraintCompiler() = default;

absl::StatusOr<std::unique_ptr<TokenConstraint>> ConstraintCompiler::Compile(
    const structured::Constraint& spec, const std::string& caller) {
  // Shape first: a malformed request is refused before the model's vocabulary is built.
  TOST_RETURN_IF_ERROR(structured::Validate(spec));
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<structured::GrammarCache> cache, impl_->Cache());
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<const structured::CompiledConstraint> compiled,
                        cache->Get(spec, caller));
  return std::make_unique<MatcherConstraint>(spec, std::move(compiled));
}

ConstraintCacheStats ConstraintCompiler::stats() const {
  std::shared_ptr<structured::GrammarCache> cache;
  {
    absl::MutexLock lock(&impl_->mu);
    if (!impl_->built || !impl_->cache.ok()) return {};
    cache = *impl_->cache;
  }
  const structured::GrammarCacheStats s = cache->stats();
  return {.hits = s.hits,
          .compiles = s.compiles,
          .compile_errors = s.compile_errors,
          .timeouts = s.timeouts,
          .slot_refusals = s.slot_refusals,
          .stopped = s.stopped,
          .worker_failures = s.worker_failures,
          .refusals_repeated = s.refusals_repeated,
          .evictions = s.evictions,
          .compile_micros_total = s.compile_micros_total,
          .worker_max_rss_bytes = s.worker_max_rss_bytes,
          .entries = s.entries,
          .bytes = s.bytes,
          .compiles_running = s.compiles_running};
}

#else  // !TOST_WITH_STRUCTURED

struct ConstraintCompiler::Impl {
  std::string model_name;
};

ConstraintCompiler::ConstraintCompiler(const GenerativeModel& model,
                                       const ConstraintCompilerOptions& options)
    : impl_(new Impl{.model_name = model.config().name}) {}

ConstraintCompiler::~ConstraintCompiler() = default;

absl::StatusOr<std::unique_ptr<TokenConstraint>> ConstraintCompiler::Compile(
    const structured::Constraint& spec, const std::string& caller) {
  return absl::FailedPreconditionError(
      absl::StrCat("model \"", impl_->model_name,
                   "\" does not support constrained generation: this server was built without "
                   "XGrammar (TOST_XGRAMMAR_SOURCE_DIR was not configured)"));
}

ConstraintCacheStats ConstraintCompiler::stats() const { return {}; }

// Nothing compiles: the options are checked as they would be in a build with XGrammar, so a
// command line does not start one build and not the other.
absl::Status ValidateConstraintCompilerOptions(const ConstraintCompilerOptions& options) {
  if (options.max_entries < 0 || options.max_bytes < 0 || options.max_compile_ms < 0 ||
      options.max_compiles < 1 || options.max_compiles_per_caller < 1 ||
      options.max_compiles_per_caller > options.max_compiles) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint compiler options: expected non-negative cache bounds and wait, at least one "
        "compile slot and 1 to that many per caller, received max_compiles ",
        options.max_compiles, " and max_compiles_per_caller ", options.max_compiles_per_caller));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindConstraintCompiler(const std::string& configured) {
  return std::string();
}

#endif  // TOST_WITH_STRUCTURED

}  // namespace tost::service
