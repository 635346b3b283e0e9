#include "service/engine/generation_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "model/text/tokenizer.h"
#include "service/engine/text_stream.h"
#include "service/generation/generation_limits.h"

namespace tost::service {
namespace {

// gRPC's deadline timer runs on its own clock, converted to wall time for the call's deadline: a
// cancel that the deadline caused may be seen a little before that instant by this clock.
constexpr absl::Duration kDeadlineCancelSlack = absl::Milliseconds(20);

// A decode mode (model::StatePool::decode_mode) that says graphs were on and were turned off:
// "eager: " and why. Plain "eager" means they never were (CPU, or turned off by a flag).
bool GraphsTurnedOff(std::string_view decode_mode) { return decode_mode.starts_with("eager: "); }

}  // namespace

// A counter the scheduler's idle loop waits on: every reason to look at the jobs again rings it.
struct GenerationJob::Doorbell {
  absl::Mutex mu;
  int64_t rings ABSL_GUARDED_BY(mu) = 0;

  void Ring() {
    absl::MutexLock lock(&mu);
    ++rings;
  }
  int64_t Count() {
    absl::MutexLock lock(&mu);
    return rings;
  }
  // Waits until rung after `seen` was read, or for `timeout`.
  void WaitPast(int64_t seen, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto rung = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return rings != seen; };
    mu.AwaitWithTimeout(absl::Condition(&rung), timeout);
  }
};

// The link from job handles back to their scheduler. A handle can outlive its scheduler (a
// stream still delivering its drained final event), so the link is shared and the scheduler's
// destructor clears it; holding `mu` keeps the scheduler alive while a Cancel uses it.
struct GenerationJob::Owner {
  absl::Mutex mu;
  GenerationScheduler* scheduler ABSL_GUARDED_BY(mu) = nullptr;
};

std::optional<GenerationEvent> GenerationJob::Next(absl::Duration timeout) {
  bool took_token = false;
  std::optional<GenerationEvent> e;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (events_.empty()) return std::nullopt;
    e = std::move(events_.front());
    events_.pop_front();
    if (e->kind == GenerationEvent::Kind::kToken) {
      --buffered_tokens_;
      took_token = true;
    }
  }
  if (took_token) doorbell_->Ring();
  return e;
}

void GenerationJob::SetListener(absl::AnyInvocable<void()> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

int32_t GenerationJob::buffered_tokens() const {
  absl::MutexLock lock(&mu_);
  return buffered_tokens_;
}

void GenerationJob::WakeListener() {
  absl::MutexLock lock(&listener_mu_);
  if (listener_) listener_();
}

void GenerationJob::Append(GenerationEvent e) {
  absl::MutexLock lock(&mu_);
  if (e.kind == GenerationEvent::Kind::kToken) ++buffered_tokens_;
  events_.push_back(std::move(e));
}

void GenerationJob::Publish(GenerationEvent e) {
  Append(std::move(e));
  absl::MutexLock lock(&listener_mu_);
  if (listener_) listener_();
}

struct GenerationScheduler::Job {
  Job(std::shared_ptr<GenerationJob::Doorbell> doorbell,
      std::shared_ptr<GenerationJob::Owner> owner)
      : handle(new GenerationJob(std::move(doorbell), std::move(owner))) {}

  std::shared_ptr<GenerationJob> handle;
  GenerationRequest request;  // request.state is the live state
  // The state as the call found it: what a job that ends before its whole prompt is fed gives
  // back, so an interrupted call leaves its session or blob exactly as before (never a half-fed
  // prompt that continuing would silently skip).
  GenerationState before;
  std::vector<int32_t> to_prefill;  // fed by prefill chunks; the last prompt token stays pending
  size_t prefilled = 0;
  int32_t prompt_tokens = 0;
  int32_t generated = 0;
  std::unique_ptr<TextStream> text;
  bool finished = false;
  GenerationTimeline timeline;  // timeline.submitted: also the observer's time to first token
  absl::Time last_token;        // for its inter-token latency
  // Since when the consumer has left max_buffered_tokens untaken; InfiniteFuture: not paused.
  absl::Time paused_since = absl::InfiniteFuture();

  GenerationState& state() { return request.state; }
  bool decoding() const { return prefilled == to_prefill.size(); }

  // The prefix cache. `history` holds every token the sequence has consumed since position 0 and
  // then its pending one (the prompt, then each drawn token), kept only while the job may insert
  // (it started at position 0); `cache_scope` is set then too.
  std::vector<int32_t> history;
  std::optional<PrefixCacheScope> cache_scope;
  bool cache_lookup = false;  // a fresh state: start from the longest cached prefix
  // Every cut of the statistics so far fell on a multiple of prefill_chunk_tokens from position
  // 0 (no decode step has fed a token yet): the states it reaches at those multiples are what a
  // cold prefill computes.
  bool on_grid = false;
  int32_t cached_tokens = 0;
  // The prompt position whose state is stored for its prompt_cache_key group (0: none).
  int64_t checkpoint = 0;

  // Its row of the scheduler's state pool while active (-1: none). While it holds one, the row
  // is the truth and request.state.sequence.stats is stale; position stays current.
  int64_t row = -1;
  // The row could not be copied back: what this call did to the statistics is lost, so it ends
  // as if it had not run (`before`).
  bool row_lost = false;

  // request.constraint's bitmask of the tokens the next draw allows (filled before each step).
  std::vector<uint32_t> allowed;

  // Its tenant's count of generations, given back when it finishes.
  TenantLedger::Lease lease;
  int64_t seq = 0;  // arrival order
  const std::string& tenant() const { return request.owner; }
  int32_t priority() const { return request.priority; }
};

void GenerationJob::Cancel() {
  if (cancelled_.exchange(true, std::memory_order_relaxed)) return;
  doorbell_->Ring();
  // A queued job leaves the queue now rather than at the next step: the scheduler's thread may be
  // inside a long prefill or decode step, and until it looks again the place would stay taken and
  // new requests be refused for streams that no longer exist.
  std::unique_ptr<GenerationScheduler::Job> job;
  {
    absl::MutexLock lock(&owner_->mu);
    if (owner_->scheduler != nullptr) job = owner_->scheduler->TakeQueued(this);
  }
  // Outside every lock: publishing calls the listener, which may take the consumer's own locks.
  if (job != nullptr) GenerationScheduler::Finish(*job, FinishReason::kCancelled);
}

absl::Status ValidateGenerationSchedulerOptions(const GenerationSchedulerOptions& o) {
  if (o.max_active_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_active_jobs must be >= 1, got ", o.max_active_jobs));
  }
  if (o.max_queued_jobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_jobs must be >= 0, got ", o.max_queued_jobs));
  }
  if (o.prefill_chunk_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk_tokens must be >= 1, got ", o.prefill_chunk_tokens));
  }
  if (o.prefill_yield_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_yield_tokens must be >= 0, got ", o.prefill_yield_tokens));
  }
  if (o.prefill_yield_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("prefill_yield_window must be >= 0, got ",
                                                   absl::FormatDuration(o.prefill_yield_window)));
  }
  if (o.mask_threads < 0 || o.mask_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask_threads must be in [0, 256], got ", o.mask_threads));
  }
  if (o.max_buffered_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_buffered_tokens must be >= 1, got ", o.max_buffered_tokens));
  }
  if (o.stream_stall_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("stream_stall_timeout must be >= 0, got ",
                                                   absl::FormatDuration(o.stream_stall_timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GenerationScheduler>> GenerationScheduler::Create(
    const GenerativeModel& model, GenerationSchedulerOptions options, Clock* clock,
    PrefixCacheBinding prefix_cache) {
  TOST_RETURN_IF_ERROR(ValidateGenerationSchedulerOptions(options));
  if (clock == nullptr) return absl::InvalidArgumentError("GenerationScheduler needs a clock");
  TOST_ASSIGN_OR_RETURN(std::unique_ptr<model::StatePool> pool,
                        model.NewStatePool(options.max_active_jobs));
  const auto width = static_cast<int64_t>(model.NewSequence().stats.size());
  if (pool->rows() != options.max_active_jobs || pool->floats_per_row() != width) {
    return absl::InternalError(absl::StrCat(
        "model ", model.config().name, ": state pool of ", pool->rows(), " rows of ",
        pool->floats_per_row(), " floats, expected ", options.max_active_jobs, " of ", width));
  }
  // Before the scheduler exists (and so before readiness): a GPU model's decode graphs are
  // captured here rather than on a request's first step of each batch size.
  TOST_RETURN_IF_ERROR(model.PrepareDecode(*pool, options.batch_invariant));
  return std::unique_ptr<GenerationScheduler>(
      new GenerationScheduler(model, options, clock, std::move(pool), std::move(prefix_cache)));
}

GenerationScheduler::GenerationScheduler(const GenerativeModel& model,
                                         GenerationSchedulerOptions options, Clock* clock,
                                         std::unique_ptr<model::StatePool> pool,
                                         PrefixCacheBinding prefix_cache)
    : model_(model),
      options_(options),
      clock_(clock),
      prefix_cache_(std::move(prefix_cache)),
      doorbell_(std::make_shared<GenerationJob::Doorbell>()),
      owner_(std::make_shared<GenerationJob::Owner>()),
      pool_(std::move(pool)),
      masker_(options.mask_threads) {
  // Lowest rows first: a lightly loaded server touches the same few rows.
  for (int64_t r = pool_->rows() - 1; r >= 0; --r) free_rows_.push_back(r);
  stats_.decode_batch_histogram.assign(options_.max_active_jobs + 1, 0);
  stats_.state_pool_bytes = pool_->bytes();
  stats_.decode_mode = pool_->decode_mode();
  if (GraphsTurnedOff(stats_.decode_mode) && options_.observer != nullptr) {
    options_.observer->OnDecodeGraphsOff(model_.config().name, stats_.decode_mode);
  }
  absl::MutexLock lock(&owner_->mu);
  owner_->scheduler = this;
}

GenerationScheduler::~GenerationScheduler() {
  Shutdown();
  // Waits for a Cancel that is using this scheduler; later ones find no scheduler (and, after
  // Shutdown, there is no queued job left to take).
  absl::MutexLock lock(&owner_->mu);
  owner_->scheduler = nullptr;
}

GenerationState GenerationScheduler::NewState(const model::SamplingParams& sampling) const {
  GenerationState s;
  s.model = model_.config().name;
  s.sequence = model_.NewSequence();
  s.sampling = sampling;
  return s;
}

absl::Status GenerationScheduler::CheckState(const GenerationState& st) const {
  const model::LanguageConfig& c = model_.config().language;
  const std::string& name = model_.config().name;
  if (st.model != name || st.sequence.stats.size() != model_.NewSequence().stats.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation state belongs to model \"", st.model, "\" with ", st.sequence.stats.size(),
        " state floats; model \"", name, "\" needs ", model_.NewSequence().stats.size()));
  }
  TOST_RETURN_IF_ERROR(model::ValidateSamplingParams(st.sampling));
  if (st.stop_strings.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most ", kMaxStopStrings, " strings, got ", st.stop_strings.size()));
  }
  for (const std::string& stop : st.stop_strings) {
    if (stop.empty() || stop.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop strings must hold 1 to ", kMaxStopStringBytes, " bytes, got ", stop.size()));
    }
  }
  if (st.constraint.has_value()) {
    // Its output is at most every token the sequence holds (the pending one included).
    const std::vector<int32_t>& output = st.constraint->output;
    const int64_t tokens = st.sequence.position + (st.pending_token >= 0 ? 1 : 0);
    if (static_cast<int64_t>(output.size()) > tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "generation state is inconsistent: its constraint has accepted ", output.size(),
          " token(s) of output, more than the ", tokens, " its sequence holds"));
    }
    for (int32_t id : output) {
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("generation state is inconsistent: its constraint's output holds id ", id,
                         ", outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  }
  if (st.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: at most ", kMaxStopTokenIds,
                                                   " ids, got ", st.stop_token_ids.size()));
  }
  for (int32_t id : st.stop_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids: id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

GenerationScheduler::Reservation& GenerationScheduler::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Reservation dropped(std::move(*this));
    scheduler_ = std::exchange(other.scheduler_, nullptr);
    lease_ = std::move(other.lease_);
  }
  return *this;
}

GenerationScheduler::Reservation::~Reservation() {
  if (scheduler_ == nullptr) return;
  absl::MutexLock lock(&scheduler_->mu_);
  --scheduler_->reserved_;
  scheduler_->stats_.reserved = scheduler_->reserved_;
}

absl::Status GenerationScheduler::Refuse(GenerationRefusal reason) {
  const std::string& name = model_.config().name;
  if (options_.observer != nullptr) options_.observer->OnRefused(name, reason);
  if (reason == GenerationRefusal::kDraining) {
    return absl::UnavailableError(
        absl::StrCat("model ", name, " is draining: retry on another replica"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "model ", name, ": all ", options_.max_active_jobs, " active generations and ",
      options_.max_queued_jobs, " queue places are taken; retry after a short backoff"));
}

absl::StatusOr<GenerationScheduler::Reservation> GenerationScheduler::Reserve(
    std::string_view tenant) {
  std::optional<GenerationRefusal> refusal;
  std::unique_ptr<Job> displaced;  // finished outside the lock: its listener may call back in
  absl::StatusOr<TenantLedger::Lease> lease = TenantLedger::Lease();
  {
    absl::MutexLock lock(&mu_);
    if (!admitting_ || stopping_) {
      refusal = GenerationRefusal::kDraining;
    } else if (options_.tenants != nullptr &&
               !(lease = options_.tenants->StartGeneration(tenant)).ok()) {
      // The scheduler's lock is taken before the ledger's, never the reverse.
    } else if (active_count_ + parked_count_ + static_cast<int32_t>(queued_.size()) + reserved_ >=
                   options_.max_active_jobs + options_.max_queued_jobs &&
               (displaced = DisplaceQueued(tenant)) == nullptr) {
      refusal = GenerationRefusal::kQueueFull;
    } else {
      ++reserved_;
      stats_.reserved = reserved_;
    }
  }
  if (displaced != nullptr) {
    Finish(*displaced, FinishReason::kCancelled,
           absl::ResourceExhaustedError(absl::StrCat(
               "model ", model_.config().name,
               ": every active and queue place is taken, and this tenant held more than its "
               "weighted share of the queue: its newest queued generation gave its place to "
               "another tenant's; retry after a short backoff")));
  }
  if (refusal.has_value()) return Refuse(*refusal);  // the lease, if taken, goes back
  if (!lease.ok()) return lease.status();
  return Reservation(this, *std::move(lease));
}

std::unique_ptr<GenerationScheduler::Job> GenerationScheduler::DisplaceQueued(
    std::string_view tenant) {
  // Queue places are shared by weight too: when none is left, the tenant holding the most of
  // them per weight gives its newest queued job up, if it holds more per weight than `tenant`
  // would with one more. A tenant with a single request is so never kept out by another's many.
  std::map<std::string_view, int64_t> queued;
  for (const auto& job : queued_) ++queued[job->tenant()];
  std::string_view most;
  double most_per_weight = 0;
  for (const auto& [name, n] : queued) {
    const double per_weight = static_cast<double>(n) / WeightOf(std::string(name));
    if (per_weight > most_per_weight) {
      most = name;
      most_per_weight = per_weight;
    }
  }
  const double own = static_cast<double>(queued[tenant] + 1) / WeightOf(std::string(tenant));
  if (most_per_weight == 0 || most == tenant || most_per_weight <= own) return nullptr;
  auto newest = queued_.end();
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    if ((*it)->tenant() == most && (newest == queued_.end() || (*it)->seq > (*newest)->seq)) {
      newest = it;
    }
  }
  std::unique_ptr<Job> job = std::move(*newest);
  queued_.erase(newest);
  --stats_.queued;
  ++stats_.displaced;
  return job;
}

absl::StatusOr<std::shared_ptr<GenerationJob>> GenerationScheduler::Submit(
    GenerationRequest request) {
  absl::StatusOr<Reservation> reservation = Reserve(request.owner);
  if (!reservation.ok()) return reservation.status();
  return Submit(*std::move(reservation), std::move(request));
}

absl::StatusOr<std::shared_ptr<GenerationJob>> GenerationScheduler::Submit(
    Reservation reservation, GenerationRequest request) {
  if (reservation.scheduler_ != this) {
    return absl::InvalidArgumentError("a generation reservation taken on another scheduler");
  }
  const model::LanguageConfig& c = model_.config().language;
  const std::string& name = model_.config().name;
  // A call that arrives with its deadline already behind it (a grpc-timeout of 1n, or a client
  // whose clock ran out while the request queued in the network) is answered before any model
  // work: it would be reported failed anyway, and must not move the session it names.
  if (const absl::Time now = clock_->Now(); request.deadline <= now) {
    return absl::DeadlineExceededError(
        absl::StrCat("model ", name, ": the call's deadline passed ",
                     absl::FormatDuration(now - request.deadline),
                     " before it could be admitted; nothing was generated"));
  }
  GenerationState& st = request.state;
  TOST_RETURN_IF_ERROR(CheckState(st));
  // The front ends check these first under the names their callers sent
  // (BuildGenerationRequest); the engine's words name no protocol's fields.
  if (request.max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", name, ": the new-token limit must be >= 0, got ", request.max_new_tokens));
  }
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": alternatives per token must be in [0, ", kMaxTopLogprobs,
                     "], got ", request.top_logprobs));
  }
  if (request.snapshot_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": the snapshot interval must be >= 0 tokens, got ",
                     request.snapshot_every));
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t t = request.prompt[i];
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", name, ": prompt token id ", t, " at index ", i,
                       " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (request.constraint != nullptr &&
      request.constraint->bitmask_words() != (c.vocab_size + 31) / 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", name, ": the constraint's token mask has ", request.constraint->bitmask_words(),
        " words; the model's ", c.vocab_size, " logits need ", (c.vocab_size + 31) / 32));
  }
  if (request.constraint == nullptr && st.constraint.has_value() && !request.clear_constraint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", name, ": the state is in the middle of a constrained output (",
        st.constraint->output.size(),
        " token(s) under its constraint so far); continue it under that constraint, or clear it "
        "(clear_constraint) to go on unconstrained"));
  }
  if (request.constraint_continues &&
      (request.constraint == nullptr || !st.constraint.has_value() ||
       request.constraint->spec() != st.constraint->spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", name,
        ": a request continuing its state's constraint must carry that constraint, replayed; ",
        st.constraint.has_value() ? "it carries another or none" : "the state has none"));
  }
  auto job = std::make_unique<Job>(doorbell_, owner_);
  job->before = st;
  std::vector<int32_t> feed;
  if (st.pending_token >= 0) feed.push_back(st.pending_token);
  feed.insert(feed.end(), request.prompt.begin(), request.prompt.end());
  if (feed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", name, ": the prompt is empty and the state has no pending token"));
  }
  if (st.sequence.position + static_cast<int64_t>(feed.size()) > c.context_length) {
    return absl::OutOfRangeError(absl::StrCat(
        "model ", name, ": position ", st.sequence.position, " + ", feed.size(),
        " prompt token(s) exceeds the context length of ", c.context_length, " tokens"));
  }
  job->prompt_tokens = static_cast<int32_t>(request.prompt.size());
  st.pending_token = feed.back();
  feed.pop_back();
  job->to_prefill = std::move(feed);
  for (int32_t t : request.prompt) st.Remember(t);
  if (request.constraint == nullptr) {
    st.constraint.reset();
  } else if (request.constraint_continues) {
    // The caller's constraint accepted the prompt as output; the state records it as such.
    st.constraint->output.insert(st.constraint->output.end(), request.prompt.begin(),
                                 request.prompt.end());
  } else {
    st.constraint = ConstraintProgress{.spec = request.constraint->spec(), .output = {}};
  }
  if (prefix_cache_.cache != nullptr && prefix_cache_.cache->enabled() &&
      request.prefix_cache != PrefixCacheUse::kOff && job->before.sequence.position == 0 &&
      job->before.pending_token < 0) {
    // Only a state that starts at position 0 knows every token its statistics will hold.
    job->history = request.prompt;
    job->cache_scope = PrefixCacheScope{name, prefix_cache_.weights_sha256, request.owner};
    job->cache_lookup = request.prefix_cache == PrefixCacheUse::kLookupAndInsert;
    job->on_grid = true;
    if (!request.prompt_cache_key.empty()) {
      int64_t shared = std::min(
          prefix_cache_.cache->JoinGroup(*job->cache_scope, request.prompt_cache_key, job->history),
          PrefixLookupLimit(*job));
      if (options_.batch_invariant) shared -= shared % options_.prefill_chunk_tokens;
      job->checkpoint = shared;
    }
    if (job->cache_lookup && prefix_cache_.cache->has_shared_tier()) {
      // Here, on the submitting thread, since it waits on the network: the scheduler's own
      // lookup (LookUpPrefix) then finds what it brought.
      prefix_cache_.cache->Prefetch(*job->cache_scope, job->history, PrefixLookupLimit(*job),
                                    /*on_grid_only=*/options_.batch_invariant);
    }
  }
  if (options_.tenants != nullptr) {
    // Once the prompt is known, and before the job may run: a prompt that would pass the tenant's
    // token window is refused here, whole.
    TOST_RETURN_IF_ERROR(
        options_.tenants->ChargePrompt(request.owner, static_cast<int64_t>(request.prompt.size())));
  }
  job->lease = std::move(reservation.lease_);
  job->text = std::make_unique<TextStream>(st.stop_strings, st.utf8_pending, st.held_text);
  job->request = std::move(request);
  job->timeline.submitted = clock_->Now();
  std::shared_ptr<GenerationJob> handle = job->handle;

  {
    absl::MutexLock lock(&mu_);
    // The place is this job's now: the reservation no longer gives it back.
    reservation.scheduler_ = nullptr;
    --reserved_;
    stats_.reserved = reserved_;
    if (admitting_ && !stopping_) {
      job->seq = next_seq_++;
      recent_arrivals_.Note(job->tenant(), job->priority(), job->timeline.submitted);
      queued_.push_back(std::move(job));
      ++stats_.queued;
      doorbell_->Ring();
      return handle;
    }
  }
  return Refuse(GenerationRefusal::kDraining);  // draining began after the place was reserved
}

int64_t GenerationScheduler::PrefixLookupLimit(const Job& job) {
  // At least the last prompt token is left to feed: a state holds statistics, not the logits its
  // next token is drawn from, so that token is fed by the job's first decode step as in a cold run.
  return static_cast<int64_t>(job.history.size()) - 1;
}

void GenerationScheduler::LookUpPrefix(Job& job) {
  std::optional<PrefixCacheHit> hit =
      prefix_cache_.cache->Lookup(*job.cache_scope, job.history, PrefixLookupLimit(job),
                                  /*on_grid_only=*/options_.batch_invariant);
  if (!hit.has_value()) return;
  // to_prefill is the prompt but its last token (the state was fresh): skip what the cache holds.
  job.to_prefill.erase(job.to_prefill.begin(), job.to_prefill.begin() + hit->tokens);
  job.state().sequence = std::move(hit->state);
  job.on_grid = hit->on_grid;
  job.cached_tokens = static_cast<int32_t>(hit->tokens);
}

void GenerationScheduler::InsertPrefix(Job& job, bool on_grid) {
  const int64_t position = job.state().sequence.position;
  model::SequenceState state;
  state.position = position;
  state.stats.resize(job.state().sequence.stats.size());
  // The row is the truth while the job is active; a failed copy only loses a cache entry.
  if (!pool_->Load(job.row, absl::MakeSpan(state.stats)).ok()) return;
  prefix_cache_.cache->Insert(*job.cache_scope, absl::MakeConstSpan(job.history.data(), position),
                              state, on_grid);
}

void GenerationScheduler::CheckpointPrefill(Job& job) {
  const int64_t chunk = options_.prefill_chunk_tokens;
  const int64_t position = job.state().sequence.position;
  if (position % chunk != 0) job.on_grid = false;
  // The prefix its prompt_cache_key group shares: where the group's next prompts start.
  const bool shared = position == job.checkpoint;
  if (job.on_grid) {
    const int64_t k = position / chunk;
    const bool last = static_cast<int64_t>(job.to_prefill.size() - job.prefilled) < chunk;
    if ((k & (k - 1)) == 0 || last || shared) InsertPrefix(job, /*on_grid=*/true);
  } else if ((job.decoding() || shared) && !options_.batch_invariant) {
    // Off the grid: the prompt's end, where a repeated prompt (another seed, a retry) starts, or
    // the group's shared prefix.
    InsertPrefix(job, /*on_grid=*/false);
  }
}

void GenerationScheduler::TakeRow(Job& job) {
  if (job.cache_lookup) LookUpPrefix(job);
  job.cache_lookup = false;  // once: a parked job resumes from its own state
  job.row = free_rows_.back();
  free_rows_.pop_back();
  absl::Status stored = pool_->Store(job.row, job.state().sequence.stats);
  if (stored.ok()) return;
  free_rows_.push_back(std::exchange(job.row, -1));
  job.row_lost = true;
  FinishActive(job, FinishReason::kCancelled, std::move(stored));
}

void GenerationScheduler::ReleaseRow(Job& job) {
  if (job.row < 0) return;
  if (job.decoding() && !job.row_lost) {
    absl::Status loaded = pool_->Load(job.row, absl::MakeSpan(job.state().sequence.stats));
    if (!loaded.ok()) job.row_lost = true;
  }
  free_rows_.push_back(std::exchange(job.row, -1));
}

void GenerationScheduler::FinishActive(Job& job, FinishReason reason, absl::Status status) {
  // The end of a generation: its statistics hold the prompt and every drawn token but the last
  // (pending, never fed), which the next call of a resent conversation starts from. Off the grid
  // (a decode step cuts after each token), so batch-invariant lookups never take it.
  const bool failed = !status.ok() && status.code() != absl::StatusCode::kCancelled;
  if (job.cache_scope.has_value() && job.row >= 0 && job.decoding() && !job.row_lost && !failed &&
      !options_.batch_invariant && job.generated > 0) {
    InsertPrefix(job, /*on_grid=*/false);
  }
  ReleaseRow(job);
  if (job.row_lost && status.ok()) {
    status = absl::InternalError(absl::StrCat("model ", model_.config().name,
                                              ": the sequence's statistics could not be read back "
                                              "from the device; the call is undone"));
  }
  {
    absl::MutexLock lock(&mu_);
    --active_count_;
    stats_.active = active_count_;
  }
  Finish(job, reason, std::move(status));
}

std::unique_ptr<GenerationScheduler::Job> GenerationScheduler::TakeQueued(
    const GenerationJob* handle) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(queued_.begin(), queued_.end(),
                         [handle](const auto& job) { return job->handle.get() == handle; });
  if (it == queued_.end()) return nullptr;
  std::unique_ptr<Job> job = std::move(*it);
  queued_.erase(it);
  --stats_.queued;
  return job;
}

void GenerationScheduler::Finish(Job& job, FinishReason reason, absl::Status status) {
  GenerationEvent e;
  e.kind = GenerationEvent::Kind::kFinished;
  e.status = std::move(status);
  e.finish_reason = reason;
  e.generated_tokens = job.generated;
  e.timeline = job.timeline;
  // The tenant's generation ends before its client hears so, as the scheduler's place does.
  job.lease = TenantLedger::Lease();
  // A call that fails (past its deadline, a model error) is reported failed to its client, so it
  // leaves its session or blob as it found it, whatever it had fed: a retry then starts from the
  // same place. A cancel (the client's own, or a stalled stream) keeps what was generated, as its
  // client chose to stop.
  const bool failed = !e.status.ok() && e.status.code() != absl::StatusCode::kCancelled;
  if (!job.decoding() || job.row_lost || failed) {
    // Ended before the prompt was fed whole, failed, or its statistics were lost on the device:
    // nothing of this call happened.
    e.prompt_tokens = 0;
    e.snapshot = std::move(job.before);
    job.handle->Publish(std::move(e));
    job.finished = true;
    return;
  }
  GenerationState& st = job.state();
  e.prompt_tokens = job.prompt_tokens;
  e.cached_tokens = job.cached_tokens;
  if (job.request.persistent) {
    st.utf8_pending = job.text->utf8_pending();
    st.held_text = job.text->held();
  } else {
    e.final_text = job.text->Flush();
    st.utf8_pending.clear();
    st.held_text.clear();
  }
  e.snapshot = st;
  job.handle->Publish(std::move(e));
  job.finished = true;
}

void GenerationScheduler::PublishStreamed(Job& job, GenerationEvent e) {
  // A call's first token goes out from this thread, not the delivery thread: where that thread
  // shares a core with this one (a server pinned to one core, or cores busy with clients), the
  // kernel may run it only once this thread's next step lets go of the core: up to 3.6 ms added
  // to the time to first token, measured with the server on one core. One listener call per call
  // is 15-25 µs here.
  if (delivery_ == nullptr || (e.kind == GenerationEvent::Kind::kToken && job.generated == 1)) {
    job.handle->Publish(std::move(e));
    return;
  }
  job.handle->Append(std::move(e));
  delivery_->Queue(job.handle);
}

bool GenerationScheduler::EmitToken(Job& job, model::DrawnToken drawn) {
  GenerationState& st = job.state();
  const model::LanguageConfig& c = model_.config().language;
  const int64_t position = st.sequence.position;  // where the new token sits
  // A logit that is not finite (below the defined vocabulary) means the model overflowed, and a
  // token drawn from it (or its logprobs) would be garbage reported as OK.
  if (drawn.nonfinite_id >= 0) {
    FinishActive(job, FinishReason::kCancelled,
                 absl::InternalError(absl::StrCat("model ", model_.config().name,
                                                  " produced a non-finite logit (id ",
                                                  drawn.nonfinite_id, ") at position ", position)));
    return false;
  }
  const int32_t token = drawn.id;
  if (TokenConstraint* constraint = job.request.constraint.get(); constraint != nullptr) {
    // The draw saw the mask, so the constraint allows the token; a refusal is a broken invariant.
    if (absl::Status accepted = constraint->Accept(token); !accepted.ok()) {
      FinishActive(job, FinishReason::kCancelled,
                   absl::InternalError(absl::StrCat(
                       "model ", model_.config().name, ": drew token ", token, " at position ",
                       position, " that its constraint refuses: ", accepted.message())));
      return false;
    }
    if (constraint->Ended()) {
      st.constraint.reset();  // complete: the state goes on unconstrained
    } else if (st.constraint.has_value()) {
      st.constraint->output.push_back(token);
    }
    // Alternatives the constraint forbids have a logprob of -infinity: not worth reporting.
    std::erase_if(drawn.top_logprobs,
                  [](const std::pair<int32_t, float>& alt) { return std::isinf(alt.second); });
  }
  st.pending_token = token;
  if (job.cache_scope.has_value()) {
    job.history.push_back(token);
    job.on_grid = false;  // its first decode step fed a token alone
  }
  st.Remember(token);
  ++st.generated_tokens;
  ++job.generated;
  if (options_.tenants != nullptr) options_.tenants->ChargeGenerated(job.tenant(), 1);

  GenerationEvent e;
  e.kind = GenerationEvent::Kind::kToken;
  e.token.id = token;
  e.token.bytes = model_.tokenizer().TokenBytes(token);
  e.token.position = position;
  const TextStream::Output out = job.text->Push(e.token.bytes);
  e.token.text = out.text;
  e.token.top_logprobs = std::move(drawn.top_logprobs);
  if (job.request.logprobs || job.request.top_logprobs > 0) e.token.logprob = drawn.logprob;
  PublishStreamed(job, std::move(e));

  const bool stop_id = std::find(st.stop_token_ids.begin(), st.stop_token_ids.end(), token) !=
                       st.stop_token_ids.end();
  if (out.stop_matched || stop_id) {
    FinishActive(job, FinishReason::kStop);
  } else if (token == c.eos_token_id ||
             (job.request.constraint != nullptr && job.request.constraint->Ended())) {
    // A constraint ends with end-of-text (its tokenizer's; the model's config names the same).
    FinishActive(job, FinishReason::kEos);
  } else if (job.generated >= job.request.max_new_tokens) {
    FinishActive(job, FinishReason::kLength);
  } else if (position >= c.context_length) {
    FinishActive(job, FinishReason::kContext);  // the new token cannot be fed: no position left
  } else if (job.request.snapshot_every > 0 && job.generated % job.request.snapshot_every == 0) {
    GenerationEvent snap;
    snap.kind = GenerationEvent::Kind::kSnapshot;
    snap.snapshot = st;
    // The one device-to-host copy of the statistics while a job runs: what the snapshot asked for.
    if (absl::Status loaded = pool_->Load(job.row, absl::MakeSpan(snap.snapshot.sequence.stats));
        !loaded.ok()) {
      job.row_lost = true;
      FinishActive(job, FinishReason::kCancelled, std::move(loaded));
      return false;
    }
    snap.snapshot.utf8_pending = job.text->utf8_pending();
    snap.snapshot.held_text = job.text->held();
    PublishStreamed(job, std::move(snap));
  }
  return !job.finished;
}

// One step, in phases: schedule (queue → active), end the interrupted, prefill, decode, record,
// emit, retire. Each phase is a member below, in that order.
bool GenerationScheduler::StepOnce() {
  const absl::Time now = clock_->Now();
  Admission admission = Schedule(now);
  if (active_.empty()) {
    next_timed_event_ = std::min(admission.queued_deadline, throttle_wake_);
    return admission.dropped > 0;
  }
  EndInterrupted(now);
  const int64_t stalled = UpdatePauses(now);
  // A job ready for its first token does not wait for another tenant's prefill: that runs after
  // the decode (the class comment).
  const int64_t chunk = options_.prefill_chunk_tokens;
  PrefillCounts prefill = PrefillChunks(chunk, /*before_decode=*/true);
  if (prefill.yielded) {
    // A call that goes before the prefill arrived while it ran: admitted and fed now, it draws its
    // first token in this step's decode. Once a step, so that arrivals cannot hold the decode back
    // (one more stops this step's prefill, and the next step admits it).
    const Admission more = Schedule(clock_->Now());
    admission.admitted |= more.admitted;
    admission.dropped += more.dropped;
    admission.prompt_tokens_started += more.prompt_tokens_started;
    admission.queued_deadline = std::min(admission.queued_deadline, more.queued_deadline);
    const PrefillCounts rest = PrefillChunks(chunk, /*before_decode=*/true);
    prefill.tokens += rest.tokens;
    prefill.chunks += rest.chunks;
    prefill.stopped |= rest.stopped;
    prefill.yielded = rest.yielded;
  }
  DecodeStep decode = Decode();
  bool starts_output = false;  // the step draws some call's first token
  for (Job* job : decode.jobs) {
    if (job->generated > 0) continue;
    starts_output = true;
    job->timeline.first_step_start = now;
    job->timeline.first_step_prefill_tokens = prefill.tokens;
    job->timeline.first_step_batch = static_cast<int32_t>(decode.jobs.size());
  }
  Record(admission, prefill, decode);
  for (size_t i = 0; i < decode.jobs.size(); ++i) {
    if (decode.admits_nothing[i]) {
      // Its pending token was fed and nothing follows it: the state holds every token, none
      // pending (a continuation must bring a prompt), and the output stops short there.
      decode.jobs[i]->state().pending_token = -1;
      FinishActive(*decode.jobs[i], FinishReason::kConstraint);
      continue;
    }
    EmitToken(*decode.jobs[i], std::move((*decode.drawn)[i]));
  }
  if (delivery_ != nullptr && starts_output) {
    // A first token's write was started above, and gRPC may finish it on a thread of its own: on
    // a core this thread shares, that thread would wait for the next step to end. Letting it run
    // first costs one system call in the steps that start a call's output.
    std::this_thread::yield();
  }
  PrefillCounts after;  // the rest of the step's chunk
  if (prefill.stopped && !prefill.yielded && prefill.tokens < chunk) {
    after = PrefillChunks(chunk - prefill.tokens, /*before_decode=*/false);
    CountPrefill(after);
    if (options_.observer != nullptr) prefill_tokens_unrecorded_ += after.tokens;
  }
  const int64_t finished = Retire(admission.queued_deadline, prefill, stalled);
  return admission.prompt_tokens_started > 0 || prefill.chunks > 0 || after.chunks > 0 ||
         !decode.jobs.empty() || finished > 0 || admission.admitted || admission.dropped > 0;
}

GenerationScheduler::Admission GenerationScheduler::Schedule(absl::Time now) {
  Admission out;
  // Queued jobs past their deadline (or cancelled and not yet taken out by Cancel) give their
  // queue place back now, not when they would have become active; parked ones likewise.
  std::vector<std::unique_ptr<Job>> dropped;
  std::vector<std::unique_ptr<Job>> dropped_parked;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if ((*it)->handle->cancel_requested() || now >= (*it)->request.deadline) {
      dropped_parked.push_back(std::move(*it));
      it = parked_.erase(it);
    } else {
      out.queued_deadline = std::min(out.queued_deadline, (*it)->request.deadline);
      ++it;
    }
  }
  Placement plan;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queued_.begin(); it != queued_.end();) {
      if ((*it)->handle->cancel_requested() || now >= (*it)->request.deadline) {
        dropped.push_back(std::move(*it));
        it = queued_.erase(it);
        --stats_.queued;
      } else {
        out.queued_deadline = std::min(out.queued_deadline, (*it)->request.deadline);
        ++it;
      }
    }
    plan = Rebalance(now, out);
    arrivals_seen_ = next_seq_;
    stats_.active = active_count_;
  }
  std::vector<Job*> started;
  for (Job* job : plan.park) {
    if (Park(*job)) continue;
    {
      absl::MutexLock lock(&mu_);  // it stays active, to finish there
      ++active_count_;
      --parked_count_;
      stats_.parked = parked_count_;
    }
    FinishActive(*job, FinishReason::kCancelled,
                 absl::InternalError(absl::StrCat("model ", model_.config().name,
                                                  ": the sequence's statistics could not be read "
                                                  "back from the device to park it")));
  }
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->row < 0 && !(*it)->finished) {
      parked_.push_back(std::move(*it));
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  for (Job* job : plan.resume) {
    auto it = std::find_if(parked_.begin(), parked_.end(),
                           [job](const auto& p) { return p.get() == job; });
    active_.push_back(std::move(*it));
    parked_.erase(it);
    started.push_back(job);
  }
  for (auto& job : plan.from_queue) {
    job->timeline.placed = now;
    started.push_back(job.get());
    active_.push_back(std::move(job));
  }
  for (auto& job : dropped_parked) {
    if (job->handle->cancel_requested()) {
      FinishParked(*job, FinishReason::kCancelled);
    } else {
      FinishParked(
          *job, FinishReason::kCancelled,
          absl::DeadlineExceededError(absl::StrCat(
              "generation passed its deadline while parked after ", job->generated, " token(s)")));
    }
  }
  for (auto& job : dropped) {
    if (job->handle->cancel_requested()) {
      Finish(*job, FinishReason::kCancelled);
    } else {
      Finish(*job, FinishReason::kCancelled,
             absl::DeadlineExceededError(
                 "generation passed its deadline while queued to become active"));
    }
  }
  out.dropped = static_cast<int64_t>(dropped.size() + dropped_parked.size());
  // active_ never holds more jobs than the pool has rows, so a row is always free here.
  for (Job* job : started) TakeRow(*job);
  return out;
}

double GenerationScheduler::WeightOf(const std::string& tenant) const {
  return options_.tenants == nullptr ? 1.0 : options_.tenants->Weight(tenant);
}

GenerationScheduler::Placement GenerationScheduler::Rebalance(absl::Time now, Admission& out) {
  const auto slots = static_cast<size_t>(options_.max_active_jobs);
  throttle_wake_ = absl::InfiniteFuture();
  // A tenant out of its token window waits, whatever it holds.
  std::map<std::string_view, bool> room;
  const auto has_room = [&](const Job& job) {
    if (options_.tenants == nullptr) return true;
    auto [it, fresh] = room.try_emplace(job.tenant(), true);
    if (fresh) it->second = options_.tenants->HasTokenRoom(job.tenant());
    return it->second;
  };
  // The jobs that want a place, and where each is now.
  enum Where { kActive = 0, kParked = 1, kQueued = 2 };
  struct Candidate {
    Job* job;
    Where where;
  };
  std::vector<Candidate> candidates;
  bool throttled = false;
  for (auto& job : active_) {
    if (job->finished) continue;
    if (has_room(*job)) {
      candidates.push_back({job.get(), kActive});
    } else {
      throttled = true;
    }
  }
  for (auto& job : parked_) {
    if (has_room(*job)) {
      candidates.push_back({job.get(), kParked});
    } else {
      throttled = true;
    }
  }
  for (auto& job : queued_) {
    if (has_room(*job)) {
      candidates.push_back({job.get(), kQueued});
    } else {
      throttled = true;
    }
  }
  if (throttled) throttle_wake_ = now + options_.tenants->options().token_window / 60;
  // Nothing waits and nothing must give its place up: every step of an unloaded server.
  if (!throttled && parked_.empty() && queued_.empty()) return {};
  std::vector<Job*> chosen;
  if (candidates.size() <= slots) {
    for (const Candidate& c : candidates) chosen.push_back(c.job);
  } else {
    // By priority; within a tenant, running jobs first, then parked, then queued, oldest first.
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) {
                       if (a.job->priority() != b.job->priority()) {
                         return a.job->priority() < b.job->priority();
                       }
                       if (a.where != b.where) return a.where < b.where;
                       return a.job->seq < b.job->seq;
                     });
    size_t left = slots;
    std::set<std::string, std::less<>> contended;  // tenants of the level the places ran out in
    for (size_t begin = 0; begin < candidates.size() && left > 0;) {
      size_t end = begin;
      while (end < candidates.size() &&
             candidates[end].job->priority() == candidates[begin].job->priority()) {
        ++end;
      }
      if (end - begin <= left) {
        for (size_t i = begin; i < end; ++i) chosen.push_back(candidates[i].job);
        left -= end - begin;
        begin = end;
        continue;
      }
      // More jobs of this priority than places: the tenants share them by weight.
      struct Share {
        double weight = 1;
        std::vector<Job*> jobs;  // in the candidates' order
        double share = 0;
        size_t given = 0;
      };
      std::map<std::string_view, Share> tenants;
      for (size_t i = begin; i < end; ++i) {
        Share& t = tenants[candidates[i].job->tenant()];
        t.weight = WeightOf(candidates[i].job->tenant());
        t.jobs.push_back(candidates[i].job);
      }
      // Water-filling: a tenant that wants less than its weighted share takes what it wants, and
      // the rest is shared again among the others.
      std::vector<Share*> open;
      for (auto& [name, t] : tenants) open.push_back(&t);
      double places = static_cast<double>(left);
      while (!open.empty()) {
        double weights = 0;
        for (Share* t : open) weights += t->weight;
        bool capped = false;
        for (auto it = open.begin(); it != open.end();) {
          if (static_cast<double>((*it)->jobs.size()) <= places * (*it)->weight / weights) {
            (*it)->share = static_cast<double>((*it)->jobs.size());
            places -= (*it)->share;
            it = open.erase(it);
            capped = true;
          } else {
            ++it;
          }
        }
        if (capped) continue;
        for (Share* t : open) t->share = places * t->weight / weights;
        break;
      }
      // Whole places first; the ones left over go to the tenants owed most so far.
      size_t given = 0;
      for (auto& [name, t] : tenants) {
        t.given = static_cast<size_t>(std::floor(t.share + 1e-9));
        given += t.given;
        double& credit = slot_credit_[std::string(name)];
        credit = std::clamp(credit + t.share - static_cast<double>(t.given), -1.0, 2.0);
        contended.emplace(name);
      }
      while (given < left) {
        Share* best = nullptr;
        double best_credit = 0;
        for (auto& [name, t] : tenants) {
          if (t.given >= t.jobs.size()) continue;
          const double credit = slot_credit_.find(name)->second;
          if (best == nullptr || credit > best_credit) {
            best = &t;
            best_credit = credit;
          }
        }
        if (best == nullptr) break;
        ++best->given;
        ++given;
        for (auto& [name, t] : tenants) {
          if (&t == best) slot_credit_.find(name)->second -= 1.0;
        }
      }
      for (auto& [name, t] : tenants) {
        for (size_t i = 0; i < t.given; ++i) chosen.push_back(t.jobs[i]);
      }
      left = 0;
    }
    // A tenant's credit is for the contention it is in now: one that left it starts afresh.
    std::erase_if(slot_credit_,
                  [&](const auto& entry) { return !contended.contains(entry.first); });
  }
  // The running jobs that lost their place are parked, then the chosen get places (Schedule does
  // both outside the lock); the counts change now, so that Reserve never sees a job in no count.
  std::set<const Job*> keep(chosen.begin(), chosen.end());
  int32_t best_new_priority = std::numeric_limits<int32_t>::max();
  for (Job* job : chosen) {
    if (job->row < 0) best_new_priority = std::min(best_new_priority, job->priority());
  }
  Placement plan;
  for (auto& job : active_) {
    if (job->finished || keep.contains(job.get())) continue;
    if (best_new_priority < job->priority()) {
      ++stats_.preemptions_priority;
    } else {
      ++stats_.preemptions_fair_share;
    }
    plan.park.push_back(job.get());
    --active_count_;
    ++parked_count_;
  }
  for (Job* job : chosen) {
    if (job->row >= 0) continue;  // already running
    auto q = std::find_if(queued_.begin(), queued_.end(),
                          [job](const auto& p) { return p.get() == job; });
    if (q != queued_.end()) {
      out.prompt_tokens_started += job->prompt_tokens;
      plan.from_queue.push_back(std::move(*q));
      queued_.erase(q);
      --stats_.queued;
    } else {
      plan.resume.push_back(job);
      --parked_count_;
    }
    out.admitted = true;
    ++active_count_;
  }
  stats_.parked = parked_count_;
  return plan;
}

bool GenerationScheduler::Park(Job& job) {
  // The row holds every token fed so far, prompt chunks included: the state takes it whole, and
  // the job resumes from it exactly.
  if (!pool_->Load(job.row, absl::MakeSpan(job.state().sequence.stats)).ok()) {
    job.row_lost = true;
    return false;
  }
  free_rows_.push_back(std::exchange(job.row, -1));
  return true;
}

void GenerationScheduler::FinishParked(Job& job, FinishReason reason, absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    --parked_count_;
    stats_.parked = parked_count_;
  }
  Finish(job, reason, std::move(status));
}

void GenerationScheduler::EndInterrupted(absl::Time now) {
  for (auto& job : active_) {
    if (!job->handle->cancel_requested() && now < job->request.deadline) continue;
    // gRPC ends a call whose deadline passed by cancelling it, so a cancel at the deadline is the
    // deadline's (and fails the call) while one before it is the client's. The clock is read again:
    // the cancel may have come after this step's `now`.
    if (clock_->Now() + kDeadlineCancelSlack >= job->request.deadline) {
      FinishActive(*job, FinishReason::kCancelled,
                   absl::DeadlineExceededError(absl::StrCat("generation passed its deadline after ",
                                                            job->generated, " token(s)")));
    } else {
      FinishActive(*job, FinishReason::kCancelled);
    }
  }
}

bool GenerationScheduler::AwaitsFirstToken(const Job& job) {
  return !job.finished && job.decoding() && job.generated == 0 && job.request.max_new_tokens > 0;
}

GenerationScheduler::PrefillCounts GenerationScheduler::PrefillChunks(int64_t budget_tokens,
                                                                      bool before_decode) {
  // At most prefill_chunk_tokens prompt tokens per step, so decoders wait at most one chunk and
  // many short prompts start together. They go by priority, then to the tenant fed the fewest
  // prompt tokens per weight so far, then in arrival order: one tenant's long prompts take turns
  // with another's short one instead of running ahead of it.
  PrefillCounts out;
  std::vector<Job*> prefilling;
  std::vector<const Job*> ready;  // awaiting their first token
  for (auto& job : active_) {
    if (!job->finished && !job->decoding()) prefilling.push_back(job.get());
    if (before_decode && AwaitsFirstToken(*job)) ready.push_back(job.get());
  }
  if (prefilling.empty()) return out;
  // A tenant that prefills again after a pause starts level with those prefilling now.
  double floor = std::numeric_limits<double>::infinity();
  for (Job* job : prefilling) {
    if (auto it = prefill_vtime_.find(job->tenant()); it != prefill_vtime_.end()) {
      floor = std::min(floor, it->second);
    }
  }
  if (!std::isfinite(floor)) floor = 0;
  std::map<std::string, double, std::less<>> vtime;
  // Tenants that were not prefilling: level with the least fed, and first among equals, so that
  // a call arriving beside a long prefill is fed before that prefill's next piece.
  std::set<std::string_view> returning;
  for (Job* job : prefilling) {
    auto it = prefill_vtime_.find(job->tenant());
    vtime[job->tenant()] = it == prefill_vtime_.end() ? floor : std::max(it->second, floor);
    if (it == prefill_vtime_.end()) returning.insert(job->tenant());
  }
  const auto fed_less = [&](const Job* x, const Job* y) {
    const double vx = vtime[x->tenant()], vy = vtime[y->tenant()];
    if (vx != vy) return vx < vy;
    return returning.contains(x->tenant()) && !returning.contains(y->tenant());
  };
  std::stable_sort(prefilling.begin(), prefilling.end(), [](const Job* a, const Job* b) {
    if (a->priority() != b->priority()) return a->priority() < b->priority();
    return a->seq < b->seq;
  });
  while (!prefilling.empty()) {
    // The first job (in priority, then arrival order) of the least-fed tenant at the best priority.
    size_t pick = 0;
    for (size_t i = 1;
         i < prefilling.size() && prefilling[i]->priority() == prefilling[0]->priority(); ++i) {
      if (fed_less(prefilling[i], prefilling[pick])) pick = i;
    }
    Job* job = prefilling[pick];
    const auto drop = [&] {
      prefilling.erase(prefilling.begin() + static_cast<std::ptrdiff_t>(pick));
    };
    const int64_t budget = budget_tokens - out.tokens;
    if (budget <= 0) break;
    if (job->finished || job->decoding()) {
      drop();
      continue;
    }
    if (std::any_of(ready.begin(), ready.end(), [job](const Job* r) {
          return r->tenant() != job->tenant() || r->priority() < job->priority();
        })) {
      out.stopped = true;  // fed after the decode
      drop();
      continue;
    }
    if (options_.prefill_yield_tokens > 0 && ArrivalGoesBefore(*job)) {
      out.yielded = true;
      break;
    }
    const size_t remaining = job->to_prefill.size() - job->prefilled;
    model::SequenceState& seq = job->state().sequence;
    size_t n = std::min<size_t>(budget, remaining);
    // The job's later pieces are picked again (by tenant), unless one arrives to go first.
    n = std::min<size_t>(n, static_cast<size_t>(PieceLimit(*job, clock_->Now())));
    // A chunk ends at the prefix the job's prompt_cache_key group shares, to store its state.
    if (job->checkpoint > seq.position) {
      n = std::min<size_t>(n, static_cast<size_t>(job->checkpoint - seq.position));
    }
    if (options_.batch_invariant) {
      // A prefill's statistics depend (in their last bits) on how the prompt is cut into chunks,
      // so here a prompt is always cut the same way whatever else is prefilling: at multiples of
      // prefill_chunk_tokens counted from position 0, not from where this call started, so the
      // states a prefill passes through at those multiples are the ones a cold prefill of any
      // longer prompt computes (what the prefix cache may hand out). A piece that does not fit
      // the step's remaining budget waits for the next step (and the jobs behind it too, keeping
      // arrival order).
      const int64_t chunk = options_.prefill_chunk_tokens;
      n = std::min<size_t>(static_cast<size_t>(chunk - seq.position % chunk), remaining);
      if (static_cast<int64_t>(n) > budget) break;
    }
    if (job->timeline.prefill_start == absl::InfinitePast()) {
      job->timeline.prefill_start = clock_->Now();
    }
    auto logits = model_.Prefill(absl::MakeConstSpan(job->to_prefill.data() + job->prefilled, n),
                                 *pool_, job->row, seq.position, static_cast<int64_t>(n));
    if (!logits.ok()) {
      FinishActive(*job, FinishReason::kCancelled, logits.status());
      drop();
      continue;
    }
    seq.position += static_cast<int64_t>(n);
    job->prefilled += n;
    if (job->decoding()) job->timeline.prefill_end = clock_->Now();
    out.tokens += static_cast<int64_t>(n);
    vtime[job->tenant()] += static_cast<double>(n) / WeightOf(job->tenant());
    returning.erase(job->tenant());
    ++out.chunks;
    if (job->cache_scope.has_value()) CheckpointPrefill(*job);
    if (before_decode && AwaitsFirstToken(*job)) ready.push_back(job);
    if (job->finished || job->decoding()) drop();
  }
  prefill_vtime_.clear();
  for (auto& [tenant, t] : vtime) prefill_vtime_.emplace(tenant, t);
  return out;
}

bool GenerationScheduler::ArrivalGoesBefore(const Job& job) {
  if (next_seq_.load() == arrivals_seen_) return false;
  absl::MutexLock lock(&mu_);
  // Arrival order: the newest are at the back of the queue.
  for (auto it = queued_.rbegin(); it != queued_.rend() && (*it)->seq >= arrivals_seen_; ++it) {
    const Job& q = **it;
    if (q.priority() < job.priority() ||
        (q.priority() == job.priority() && q.tenant() != job.tenant())) {
      return true;
    }
  }
  return false;
}

int64_t GenerationScheduler::PieceLimit(const Job& job, absl::Time now) {
  constexpr int64_t kWhole = std::numeric_limits<int64_t>::max();
  if (options_.prefill_yield_tokens == 0 || options_.batch_invariant) return kWhole;
  absl::MutexLock lock(&mu_);
  return recent_arrivals_.PrecedingSince(job.tenant(), job.priority(),
                                         now - options_.prefill_yield_window)
             ? options_.prefill_yield_tokens
             : kWhole;
}

GenerationScheduler::DecodeStep GenerationScheduler::Decode() {
  DecodeStep out;
  for (auto& job : active_) {
    if (job->finished || !job->decoding() || job->paused_since != absl::InfiniteFuture()) continue;
    if (job->request.max_new_tokens == 0) {
      FinishActive(*job, FinishReason::kLength);  // prompt fed; its last token stays pending
      continue;
    }
    out.jobs.push_back(job.get());
  }
  if (out.jobs.empty()) return out;
  // The constrained rows' masks, started now and finished where the draw needs them (before_draw
  // below): on a GPU while the forward runs, and in parallel over rows on the masker's threads.
  std::vector<ConstraintMasker::Task> masks;
  for (Job* job : out.jobs) {
    if (TokenConstraint* constraint = job->request.constraint.get(); constraint != nullptr) {
      job->allowed.resize(static_cast<size_t>(constraint->bitmask_words()));
      masks.push_back({constraint, absl::MakeSpan(job->allowed)});
    }
  }
  out.constrained_rows = static_cast<int32_t>(masks.size());
  out.admits_nothing.assign(out.jobs.size(), false);
  masker_.Start(std::move(masks));
  std::vector<int32_t> tokens;
  std::vector<int64_t> rows, positions;
  std::vector<std::vector<int32_t>> recent(out.jobs.size());
  std::vector<model::TokenDraw> draws(out.jobs.size());
  for (size_t i = 0; i < out.jobs.size(); ++i) {
    const GenerationState& st = out.jobs[i]->state();
    tokens.push_back(st.pending_token);
    rows.push_back(out.jobs[i]->row);
    positions.push_back(st.sequence.position);
    if (st.sampling.repetition_penalty != 1.f) {  // the window matters only to a penalty
      recent[i].assign(st.recent_tokens.begin(), st.recent_tokens.end());
    }
    // The new token sits one past the fed one: its draw is numbered by that position.
    draws[i] = {st.sampling, static_cast<uint64_t>(st.sequence.position + 1), recent[i],
                out.jobs[i]->request.top_logprobs, out.jobs[i]->request.logprobs};
    if (out.jobs[i]->request.constraint != nullptr) draws[i].allowed = out.jobs[i]->allowed;
    draws[i].logit_bias = out.jobs[i]->request.logit_bias;
  }
  const auto finish_masks = [&] {
    masker_.Finish();
    for (size_t i = 0; i < out.jobs.size(); ++i) {
      std::vector<uint32_t>& allowed = out.jobs[i]->allowed;
      if (out.jobs[i]->request.constraint == nullptr ||
          std::any_of(allowed.begin(), allowed.end(), [](uint32_t word) { return word != 0; })) {
        continue;
      }
      // The constraint admits no token (a grammar whose next bytes no token spells): the row is
      // in the step already, so it draws from everything and its token is dropped.
      out.admits_nothing[i] = true;
      std::fill(allowed.begin(), allowed.end(), ~uint32_t{0});
    }
  };
  out.drawn = model_.Step(
      tokens, *pool_, rows, positions, draws, options_.batch_invariant,
      out.constrained_rows > 0 ? std::function<void()>(finish_masks) : std::function<void()>());
  // A step that failed before its draw never called it: no worker may still hold a job's
  // constraint once the jobs can end.
  masker_.Finish();
  out.mask_time = masker_.compute_time();
  out.mask_wait = masker_.wait_time();
  if (!out.drawn.ok()) {
    for (Job* job : out.jobs) FinishActive(*job, FinishReason::kCancelled, out.drawn.status());
    out.jobs.clear();
    return out;
  }
  for (Job* job : out.jobs) ++job->state().sequence.position;
  const absl::Time emitted_at = clock_->Now();
  for (Job* job : out.jobs) {
    if (job->generated == 0) job->timeline.first_token = emitted_at;
  }
  if (options_.observer != nullptr) {
    for (Job* job : out.jobs) {
      (job->generated == 0 ? out.first_token : out.inter_token)
          .push_back(emitted_at -
                     (job->generated == 0 ? job->timeline.submitted : job->last_token));
      job->last_token = emitted_at;
    }
  }
  return out;
}

void GenerationScheduler::CountPrefill(const PrefillCounts& prefill) {
  if (prefill.chunks == 0) return;
  absl::MutexLock lock(&mu_);
  stats_.prefill_chunks += prefill.chunks;
  stats_.prefill_tokens += prefill.tokens;
}

void GenerationScheduler::Record(const Admission& admission, const PrefillCounts& prefill,
                                 const DecodeStep& decode) {
  // The step's prefill and decode counters and the observer's record are in place before any token
  // of the step is published: a stream can end with its token (and its client read the status or
  // the metrics at once), so counting after the emission would show that client the step before.
  const auto batch = static_cast<int32_t>(decode.jobs.size());
  std::string graphs_off;  // the new decode mode, when this step turned graphs off
  CountPrefill(prefill);
  if (batch > 0) {
    absl::MutexLock lock(&mu_);
    ++stats_.decode_steps;
    stats_.decoded_tokens += batch;
    stats_.max_decode_batch = std::max<int32_t>(stats_.max_decode_batch, batch);
    ++stats_.decode_batch_histogram[decode.jobs.size()];
    if (std::string mode = pool_->decode_mode(); mode != stats_.decode_mode) {
      if (GraphsTurnedOff(mode)) graphs_off = mode;
      stats_.decode_mode = std::move(mode);  // graphs turned off after a failed capture
    }
  }
  if (!graphs_off.empty() && options_.observer != nullptr) {
    options_.observer->OnDecodeGraphsOff(model_.config().name, graphs_off);
  }
  if (options_.observer != nullptr) {
    GenerationStepRecord record;
    record.model = model_.config().name;
    record.decode_batch = batch;
    record.prefill_tokens = prefill.tokens + std::exchange(prefill_tokens_unrecorded_, 0);
    record.prompt_tokens_started = admission.prompt_tokens_started;
    record.tokens_emitted = batch;
    record.time_to_first_token = decode.first_token;
    record.inter_token_latency = decode.inter_token;
    record.constrained_rows = decode.constrained_rows;
    record.mask_time = decode.mask_time;
    record.mask_wait = decode.mask_wait;
    options_.observer->OnStep(record);
  }
}

int64_t GenerationScheduler::Retire(absl::Time queued_deadline, const PrefillCounts& prefill,
                                    int64_t stalled) {
  const auto finished =
      std::count_if(active_.begin(), active_.end(), [](const auto& j) { return j->finished; });
  std::erase_if(active_, [](const auto& j) { return j->finished; });
  int32_t paused = 0;
  next_timed_event_ = std::min(queued_deadline, throttle_wake_);
  for (const auto& job : active_) {
    next_timed_event_ = std::min(next_timed_event_, job->request.deadline);
    if (job->paused_since == absl::InfiniteFuture()) continue;
    ++paused;
    if (options_.stream_stall_timeout > absl::ZeroDuration()) {
      next_timed_event_ =
          std::min(next_timed_event_, job->paused_since + options_.stream_stall_timeout);
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.paused = paused;
  ++stats_.steps;
  stats_.stalled_jobs += stalled;
  return finished;
}

int64_t GenerationScheduler::UpdatePauses(absl::Time now) {
  int64_t stalled = 0;
  for (auto& job : active_) {
    if (job->finished) continue;
    if (job->handle->buffered_tokens() < options_.max_buffered_tokens) {
      job->paused_since = absl::InfiniteFuture();
      continue;
    }
    if (job->paused_since == absl::InfiniteFuture()) job->paused_since = now;
    if (options_.stream_stall_timeout > absl::ZeroDuration() &&
        now - job->paused_since >= options_.stream_stall_timeout) {
      ++stalled;
      job->handle->stalled_.store(true, std::memory_order_release);
      FinishActive(*job, FinishReason::kCancelled,
                   absl::CancelledError(absl::StrCat(
                       "model ", model_.config().name, ": the client took none of the last ",
                       options_.max_buffered_tokens, " tokens for ",
                       absl::FormatDuration(options_.stream_stall_timeout),
                       " (--stream_stall_timeout_ms); generation stopped after ", job->generated,
                       " token(s), its state kept")));
    }
  }
  return stalled;
}

void GenerationScheduler::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  delivery_ = std::make_unique<ListenerDelivery>(absl::StrCat("emit:", model_.config().name));
  thread_ = std::thread([this] { Loop(); });
}

void GenerationScheduler::Loop() {
  NameThisThread(absl::StrCat("step:", model_.config().name));
  while (true) {
    // Read before looking at the jobs: a ring from here on ends the wait below at once.
    const int64_t seen = doorbell_->Count();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (StepOnce()) continue;
    // Nothing to do until a job arrives, a consumer takes a token or cancels, or a deadline or a
    // stall timeout of an active job comes due.
    const absl::Duration wait =
        next_timed_event_ == absl::InfiniteFuture()
            ? absl::InfiniteDuration()
            : std::max(absl::ZeroDuration(), next_timed_event_ - clock_->Now());
    doorbell_->WaitPast(seen, wait);
  }
}

void GenerationScheduler::StopAdmitting() {
  absl::MutexLock lock(&mu_);
  admitting_ = false;
}

void GenerationScheduler::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    admitting_ = false;
    stopping_ = true;
  }
  doorbell_->Ring();
  if (thread_.joinable()) thread_.join();
  delivery_.reset();  // the loop's token events woken, its thread joined
  // The loop has stopped: this thread now owns active_ and queued_.
  std::deque<std::unique_ptr<Job>> queued;
  {
    absl::MutexLock lock(&mu_);
    queued.swap(queued_);
    stats_.queued = 0;
  }
  for (auto& job : active_) {
    if (job->finished) continue;
    ReleaseRow(*job);
    Finish(*job, FinishReason::kDrained);
  }
  for (auto& job : parked_) Finish(*job, FinishReason::kDrained);
  for (auto& job : queued) Finish(*job, FinishReason::kDrained);
  active_.clear();
  parked_.clear();
  absl::MutexLock lock(&mu_);
  active_count_ = 0;
  parked_count_ = 0;
  stats_.active = 0;
  stats_.parked = 0;
}

int32_t GenerationScheduler::in_flight() const {
  absl::MutexLock lock(&mu_);
  return active_count_ + parked_count_ + static_cast<int32_t>(queued_.size());
}

GenerationSchedulerStats GenerationScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tost::service
