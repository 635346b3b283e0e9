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

}  // namespace

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
        structured::GrammarCacheOptions cache_options;
        cache_options.max_entries = options.max_entries;
        cache_options.max_bytes = options.max_bytes;
        cache_options.max_compile_ms = options.max_compile_ms;
        cache = std::make_shared<structured::GrammarCache>(*std::move(vocabulary), cache_options);
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
    const structured::Constraint& spec) {
  // Shape first: a malformed request is refused before the model's vocabulary is built.
  TOST_RETURN_IF_ERROR(structured::Validate(spec));
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<structured::GrammarCache> cache, impl_->Cache());
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<const structured::CompiledConstraint> compiled,
                        cache->Get(spec));
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
          .evictions = s.evictions,
          .compile_micros_total = s.compile_micros_total,
          .entries = s.entries,
          .bytes = s.bytes};
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
    const structured::Constraint& spec) {
  return absl::FailedPreconditionError(
      absl::StrCat("model \"", impl_->model_name,
                   "\" does not support constrained generation: this server was built without "
                   "XGrammar (TOST_XGRAMMAR_SOURCE_DIR was not configured)"));
}

ConstraintCacheStats ConstraintCompiler::stats() const { return {}; }

#endif  // TOST_WITH_STRUCTURED

}  // namespace tost::service
