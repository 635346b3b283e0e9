// Continuous-batching generation for one language model.
//
// Each scheduler step: (1) drops cancelled, past-deadline and drained jobs, freeing their active
// places at once; (2) feeds at most `prefill_chunk_tokens` prompt tokens (split over the prefilling
// jobs in arrival order, tssa_causal continuing each one's state), so a long prompt never stalls
// the decoders for more than a chunk; (3) runs one batched decode step (GenerativeModel::Step) for
// every decoding job, samples per job and publishes each token to its job at once. Jobs join and
// leave between steps. A job whose prompt is fed and whose first token is still to come does not
// wait for the prefill of another tenant's jobs or of less urgent ones: the step's prefill skips
// such pieces, the decode runs and publishes, and the rest of the chunk is fed after it in the
// same step (the jobs it completes draw their first token at the next). Short prompts of one
// tenant and priority still start together. Each job's prompt is cut into the same pieces either
// way. Nor does a call wait for the chunk running when it arrives, once calls that go before the
// prefilling ones have been arriving: prefill then runs in short pieces, and the step stops
// between them to admit and feed the newcomer (prefill_yield_tokens).
//
// Who runs when the active places are fewer than the jobs: each step, the places go to the lowest
// `priority` values first; between the jobs of one priority, the tenants (request.owner) with jobs
// there share them in proportion to their weights (TenantLedger), a fractional share carried as a
// credit from step to step so that, over steps, each tenant gets its share exactly; within a
// tenant, running jobs keep their places before parked ones resume, and those before queued ones
// start, oldest first. A running job that loses its place is parked: its row is copied back into
// its state (a few KB) and freed, and when it gets a place again its state is written to a row
// and it goes on from the same token, never recomputed (under batch_invariant, with exactly the
// tokens it would have drawn without the pause). Prefill tokens are shared the same way: each
// step's chunk goes to the prefilling jobs by priority, then to the tenant that has been fed the
// fewest prompt tokens per weight. A tenant whose tokens_per_minute window is used up gets no
// place until it has room again. Queue places are shared by weight as well (Reserve).
//
// Jobs are handed to callers as GenerationJob handles: the front end takes their events (notified
// by a listener) and writes them to its stream, so a slow client never blocks the step loop. Flow
// control is per job: a job whose consumer has not taken `max_buffered_tokens` published tokens is
// paused (it keeps its active place and state but is left out of decode steps) until the consumer
// catches up; a job paused for `stream_stall_timeout` is cancelled, its final state kept like any
// other.
//
// Thread-safety: Submit/Cancel/Drain/stats may be called from any thread; StepOnce runs on the
// scheduler's own thread after Start(), or on the test's thread when Start() is never called.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/engine/clock.h"
#include "service/engine/constraint_masker.h"
#include "service/engine/constraints.h"
#include "service/engine/generation_job.h"
#include "service/engine/generation_state.h"
#include "service/engine/listener_delivery.h"
#include "service/engine/model_interface.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/recent_arrivals.h"
#include "service/engine/session_codec.h"
#include "service/engine/tenant_ledger.h"

namespace tost::service {

// What one scheduler step did (metrics). Valid only during the OnStep call.
struct GenerationStepRecord {
  std::string_view model;
  int32_t decode_batch = 0;           // sequences in this step's batched decode (0: none)
  int64_t prefill_tokens = 0;         // prompt tokens fed by prefill chunks in this step
  int64_t prompt_tokens_started = 0;  // prompt tokens of the jobs that became active in this step
  int64_t tokens_emitted = 0;         // tokens published to jobs in this step
  // One entry per job whose first token this step emitted: from Submit to that token.
  absl::Span<const absl::Duration> time_to_first_token;
  // One entry per other token emitted: since the same job's previous token.
  absl::Span<const absl::Duration> inter_token_latency;
  // Constrained generation: decode rows whose draw this step was masked, the time computing
  // their masks (summed over rows, mostly while the forward ran), and how long the draw waited
  // for them after the forward was issued.
  int32_t constrained_rows = 0;
  absl::Duration mask_time;
  absl::Duration mask_wait;
};

// Called on the step loop's thread after each step that did work; must be cheap and thread-safe.
// Why Submit refused a job before any model work.
enum class GenerationRefusal {
  kQueueFull,  // every active place and queue place taken (RESOURCE_EXHAUSTED)
  kDraining,   // the scheduler stopped admitting (UNAVAILABLE)
};

class GenerationObserver {
 public:
  virtual ~GenerationObserver() = default;
  virtual void OnStep(const GenerationStepRecord& record) = 0;
  // Called on the submitting thread, without the scheduler's lock held.
  virtual void OnRefused(std::string_view model, GenerationRefusal reason) {}
  // Decode graphs were turned off for `model` (a capture, or a graph's check against the eager
  // step, failed): `decode_mode` is the pool's, "eager: " and why. At most once per scheduler:
  // from Create, when the captures of PrepareDecode failed, or from the step that saw it; without
  // the scheduler's lock held. Decode goes on, eagerly, and ServerStatus shows the same mode.
  virtual void OnDecodeGraphsOff(std::string_view model, std::string_view decode_mode) {}
};

struct GenerationSchedulerOptions {
  int32_t max_active_jobs = 64;   // jobs prefilling or decoding at once
  int32_t max_queued_jobs = 256;  // jobs admitted but waiting to become active
  // Prompt tokens fed per scheduler step, over all prefilling jobs.
  int32_t prefill_chunk_tokens = 128;
  // Prefill that gives way: while a call that goes before a prefilling job (another tenant's at
  // its priority, or a more urgent one) has arrived within `prefill_yield_window`, that job's
  // prompt is fed in pieces of at most this many tokens; and a step's prefill stops between
  // pieces when such a call arrives, admits it, and feeds it at once, so that it draws its first
  // token in that step's decode. Such a call then waits for one piece of a running prefill, not a
  // chunk. Small pieces feed prompts more slowly (the CPU's products are less efficient on fewer
  // rows), which is why a tenant alone is fed whole chunks. Under batch_invariant the pieces stay
  // whole chunks (a cut must not depend on load) and the step still stops between them. 0: never
  // smaller than a chunk, and a step's prefill is never stopped for an arrival.
  int32_t prefill_yield_tokens = 16;
  // A tenant that called within the last minute is likely to call again.
  absl::Duration prefill_yield_window = absl::Seconds(60);
  // Bit-identical results under any load: decode rows computed independently, and every prompt
  // prefilled in the same pieces (cut at multiples of prefill_chunk_tokens from position 0)
  // whatever shares the step; prefix-cache hits only on states a cold prefill computes too.
  bool batch_invariant = false;
  // Tokens a job may have published and its consumer not yet taken; at this many it is paused.
  int32_t max_buffered_tokens = 8;
  // A job paused this long (its client reads nothing) is cancelled with its state kept;
  // ZeroDuration: never.
  absl::Duration stream_stall_timeout = absl::Seconds(30);
  // Threads computing constrained rows' token masks while a decode step's forward runs (and in
  // parallel with each other); 0: the scheduler's thread computes them after the forward.
  // Started on the first constrained step.
  int32_t mask_threads = 2;
  GenerationObserver* observer = nullptr;  // not owned, outlives the scheduler; null: no records
  // Tenants' weights and quotas, shared by the engine's schedulers; not owned, outlives the
  // scheduler. Null: every owner weighs 1 and has no quota.
  TenantLedger* tenants = nullptr;
};

absl::Status ValidateGenerationSchedulerOptions(const GenerationSchedulerOptions& o);

// What the scheduler has done, for tests and metrics.
struct GenerationSchedulerStats {
  int64_t steps = 0;
  int64_t decode_steps = 0;
  int64_t decoded_tokens = 0;
  int64_t prefill_chunks = 0;
  int64_t prefill_tokens = 0;
  int32_t max_decode_batch = 0;
  std::vector<int64_t> decode_batch_histogram;  // [b] = decode steps that ran with batch size b
  int32_t active = 0;
  int32_t queued = 0;
  int32_t paused = 0;  // active jobs waiting for their consumer
  int32_t parked = 0;  // started jobs that gave their place up, waiting with their state
  // Running jobs parked to give their place to a job of a lower priority value, or to another
  // tenant's fair share (tokens_per_minute throttling included).
  int64_t preemptions_priority = 0;
  int64_t preemptions_fair_share = 0;
  // Queued jobs that gave their queue place to another tenant's share (DisplaceQueued).
  int64_t displaced = 0;
  int32_t reserved = 0;          // places reserved and not yet submitted
  int64_t stalled_jobs = 0;      // jobs cancelled after stream_stall_timeout
  int64_t state_pool_bytes = 0;  // the model's state pool (max_active_jobs rows)
  std::string decode_mode;       // model::StatePool::decode_mode(), as of the last decode step
};

// The engine's prefix-state cache as one model's scheduler uses it.
struct PrefixCacheBinding {
  PrefixStateCache* cache = nullptr;  // not owned, outlives the scheduler; null: no cache
  std::string weights_sha256;         // the model's, part of every key (raw 32 bytes)
};

class GenerationScheduler {
 public:
  static absl::StatusOr<std::unique_ptr<GenerationScheduler>> Create(
      const GenerativeModel& model, GenerationSchedulerOptions options, Clock* clock,
      PrefixCacheBinding prefix_cache = {});
  ~GenerationScheduler();

  // A fresh state for this model with the given sampling parameters.
  GenerationState NewState(const model::SamplingParams& sampling) const;

  // INVALID_ARGUMENT unless `state` belongs to this model (name and state size) and its sampling
  // parameters and stop token ids are valid: what every state must pass before it is stored or
  // run (Submit checks it too).
  absl::Status CheckState(const GenerationState& state) const;

  // A place among the admitted jobs, taken before the caller does any work on its request (a
  // prompt of up to a MiB is tokenised only once it holds one). Move-only; dropping it unused gives
  // the place back.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept
        : scheduler_(std::exchange(other.scheduler_, nullptr)), lease_(std::move(other.lease_)) {}
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

   private:
    friend class GenerationScheduler;
    Reservation(GenerationScheduler* scheduler, TenantLedger::Lease lease)
        : scheduler_(scheduler), lease_(std::move(lease)) {}
    GenerationScheduler* scheduler_ = nullptr;
    TenantLedger::Lease lease_;  // the tenant's count of generations
  };
  // RESOURCE_EXHAUSTED (with a retry hint) when every active place and queue place is taken or
  // reserved and no other tenant holds more queue places per weight than `tenant` would with this
  // one (else that tenant's newest queued job is refused instead, and this one takes its place),
  // or when `tenant` is at its max_concurrent or out of its token window; UNAVAILABLE once
  // draining: Submit's refusals, decided before any work. The tenant is the request's owner.
  absl::StatusOr<Reservation> Reserve(std::string_view tenant = kAnonymousCaller);
  // Submits with a place taken by Reserve(); errors as Submit's.
  absl::StatusOr<std::shared_ptr<GenerationJob>> Submit(Reservation reservation,
                                                        GenerationRequest request);

  // Admits a job or refuses it before any model work: INVALID_ARGUMENT for a bad request,
  // OUT_OF_RANGE past the context length, RESOURCE_EXHAUSTED (with a retry hint) when every active
  // place and queue place is taken, UNAVAILABLE once draining.
  absl::StatusOr<std::shared_ptr<GenerationJob>> Submit(GenerationRequest request);

  // Runs the step loop on an owned thread until Shutdown().
  void Start();
  // Refuses new jobs (UNAVAILABLE) while admitted ones run on: the first half of a drain.
  void StopAdmitting();
  // Stops the loop and joins its thread; jobs still admitted end with FinishReason kDrained and
  // their final state, so their clients can resume elsewhere.
  void Shutdown();
  // Jobs admitted and not finished (queued or active).
  int32_t in_flight() const;

  // One scheduler iteration. Returns false when there was nothing to do (no job, or every job
  // paused with no prompt left to feed).
  bool StepOnce();

  GenerationSchedulerStats stats() const;
  const GenerativeModel& model() const { return model_; }
  const GenerationSchedulerOptions& options() const { return options_; }

 private:
  friend class GenerationJob;
  struct Job;
  GenerationScheduler(const GenerativeModel& model, GenerationSchedulerOptions options,
                      Clock* clock, std::unique_ptr<model::StatePool> pool,
                      PrefixCacheBinding prefix_cache);
  void Loop();
  // Takes `handle`'s job out of the queue (null when it is not queued: already active, finished,
  // or dropped by a step), giving its place back.
  std::unique_ptr<Job> TakeQueued(const GenerationJob* handle);
  // The phases of StepOnce, in order.
  struct Admission {
    bool admitted = false;              // a queued job became active
    int64_t dropped = 0;                // queued jobs cancelled or past their deadline, ended
    int64_t prompt_tokens_started = 0;  // the prompt tokens of the jobs admitted
    absl::Time queued_deadline = absl::InfiniteFuture();  // the earliest of those still queued
  };
  // What Rebalance decided: active jobs to park, parked ones to resume, queued ones (taken out of
  // the queue) to start.
  struct Placement {
    std::vector<Job*> park;
    std::vector<Job*> resume;
    std::vector<std::unique_ptr<Job>> from_queue;
  };
  // Tenant-weighted choice of the jobs that hold places this step (the class comment); counts
  // the moves it decides as done.
  Placement Rebalance(absl::Time now, Admission& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies an active job's row into its state and frees the row; false when the row could not
  // be read (the job keeps it, marked lost).
  bool Park(Job& job);
  // Ends a parked job (the state it holds is current: it has no row).
  void FinishParked(Job& job, FinishReason reason, absl::Status status = absl::OkStatus());
  double WeightOf(const std::string& tenant) const;
  // With every place taken: the newest queued job of the tenant holding the most queue places per
  // weight, taken out of the queue, when that tenant holds more per weight than `tenant` would
  // with one more; null otherwise.
  std::unique_ptr<Job> DisplaceQueued(std::string_view tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct PrefillCounts {
    int64_t tokens = 0;
    int64_t chunks = 0;
    bool stopped = false;  // stopped early: a job awaits its first token
    bool yielded = false;  // stopped early for an arrival that goes before the next piece
  };
  struct DecodeStep {
    std::vector<Job*> jobs;  // decoded this step, in the order of `drawn`
    absl::StatusOr<std::vector<model::DrawnToken>> drawn;
    std::vector<absl::Duration> first_token, inter_token;  // filled only for the observer
    int32_t constrained_rows = 0;                          // rows whose draw had a mask
    absl::Duration mask_time;  // computing those masks, summed over rows
    absl::Duration mask_wait;  // the draw's wait for them once the forward was issued
    // Per job: its constraint admitted no token, so its draw is void (the step fed its pending
    // token all the same) and it ends with kConstraint.
    std::vector<bool> admits_nothing;
  };
  // Drops cancelled and expired queued jobs, admits queued jobs to free places (with their rows).
  Admission Schedule(absl::Time now);
  // Ends active jobs that were cancelled or passed their deadline.
  void EndInterrupted(absl::Time now);
  // Pauses jobs whose consumer lags, resumes those that caught up, and cancels the ones stalled
  // past stream_stall_timeout (returns how many).
  int64_t UpdatePauses(absl::Time now);
  // Feeds at most `budget` prompt tokens, shared by the prefilling jobs; with
  // `before_decode`, skips the pieces that a job ready for its first token (its prompt fed whole)
  // of another tenant or a lower priority value would wait for (`stopped`: some were). Stops
  // (`yielded`) before a piece that a call submitted since `arrivals_seen_` goes before.
  PrefillCounts PrefillChunks(int64_t budget, bool before_decode);
  // Whether a call submitted since `arrivals_seen_` and still queued goes before `job`.
  bool ArrivalGoesBefore(const Job& job);
  // The most tokens of `job`'s prompt the next piece feeds: prefill_yield_tokens while a call
  // that goes before it arrived within prefill_yield_window, else no limit.
  int64_t PieceLimit(const Job& job, absl::Time now);
  // Its prompt is fed whole and its first token is still to be drawn.
  static bool AwaitsFirstToken(const Job& job);
  // One batched step of every decoding job that is not paused; draws their tokens.
  DecodeStep Decode();
  // The step's counters and the observer's record, before any of its tokens is published.
  void Record(const Admission& admission, const PrefillCounts& prefill, const DecodeStep& decode);
  // Adds fed prompt chunks to the scheduler's counters (Record's, and the after-decode pieces').
  void CountPrefill(const PrefillCounts& prefill);
  // Removes finished jobs and sets when the scheduler must look again; returns how many finished.
  int64_t Retire(absl::Time queued_deadline, const PrefillCounts& prefill, int64_t stalled);
  // Gives an admitted job a pool row holding its statistics; when the row cannot be written the
  // job finishes with the error.
  void TakeRow(Job& job);
  // Copies the job's row back into its state (when its prompt was fed whole) and frees the row.
  void ReleaseRow(Job& job);
  // Prefix cache: starts an admitted job from the longest cached prefix of its prompt (before its
  // row is written), and stores the statistics its row holds now (the first `position` tokens of
  // its history; copied from the row).
  void LookUpPrefix(Job& job);
  void InsertPrefix(Job& job, bool on_grid);
  // The longest prefix of the job's prompt a cached state may cover.
  static int64_t PrefixLookupLimit(const Job& job);
  // After a prefill chunk: stores the state on the grid (at prefill_chunk_tokens · 2^k, and at the
  // last multiple the prompt reaches: O(log) entries per prompt, not one per chunk, as each entry
  // holds its whole key), or at the prompt's end.
  void CheckpointPrefill(Job& job);
  // Ends an active job: its place goes back before its final event is published, so a client
  // that hears the end and at once sends its next request is not refused for its own old place.
  void FinishActive(Job& job, FinishReason reason, absl::Status status = absl::OkStatus());
  // Publishes `job`'s final event. Touches nothing but the job, so any thread that owns the job
  // may call it (GenerationJob::Cancel does, for a job it took out of the queue).
  static void Finish(Job& job, FinishReason reason, absl::Status status = absl::OkStatus());
  // The refusal of a job that cannot be admitted, after telling the observer.
  absl::Status Refuse(GenerationRefusal reason);
  // Publishes the token the step drew for `job` and applies the stop rules. Returns false when
  // the job finished.
  bool EmitToken(Job& job, model::DrawnToken drawn);
  // Publishes a token or snapshot of the step loop: its listener is woken by delivery_ once there
  // is one, inline otherwise.
  void PublishStreamed(Job& job, GenerationEvent e);

  const GenerativeModel& model_;
  const GenerationSchedulerOptions options_;
  Clock* const clock_;
  const PrefixCacheBinding prefix_cache_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Job>> queued_ ABSL_GUARDED_BY(mu_);
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int32_t active_count_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // places held by Reservations not yet submitted
  int32_t parked_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Arrival order of submitted jobs: advanced under mu_, read without it by a prefill that looks
  // for arrivals between its pieces.
  std::atomic<int64_t> next_seq_{0};
  RecentArrivals recent_arrivals_ ABSL_GUARDED_BY(mu_);
  GenerationSchedulerStats stats_ ABSL_GUARDED_BY(mu_);

  const std::shared_ptr<GenerationJob::Doorbell> doorbell_;
  // Shared with every job handle, which may outlive the scheduler; cleared by the destructor.
  const std::shared_ptr<GenerationJob::Owner> owner_;

  // Owned by the step loop (one thread at a time).
  std::vector<std::unique_ptr<Job>> active_;
  // Started jobs that gave their place up; they hold no row, their state is current.
  std::vector<std::unique_ptr<Job>> parked_;
  // Per tenant: the fractional share of places it was owed and not given (fair share), and the
  // prompt tokens fed to it per weight (prefill order; lifted to the least of the tenants that
  // prefill, so that an idle tenant comes back with no backlog of credit).
  std::map<std::string, double, std::less<>> slot_credit_;
  std::map<std::string, double, std::less<>> prefill_vtime_;
  // next_seq_ when the step last admitted jobs: later ones are arrivals that may stop
  // its prefill.
  int64_t arrivals_seen_ = 0;
  // Prompt tokens fed after a step's decode: told to the observer with the next step's record.
  int64_t prefill_tokens_unrecorded_ = 0;
  // A tenant out of its token window was left without a place: look again this soon.
  absl::Time throttle_wake_ = absl::InfiniteFuture();
  // The active jobs' statistics, one row each, where the model computes: decode steps update them
  // in place, and a row is copied to the host only for a snapshot or when its job ends.
  const std::unique_ptr<model::StatePool> pool_;
  std::vector<int64_t> free_rows_;
  ConstraintMasker masker_;
  // The earliest instant at which a deadline or a stall ends an active job (the idle loop's wake).
  absl::Time next_timed_event_ = absl::InfiniteFuture();
  // Started with the loop's thread (Start), stopped after it (Shutdown): the token events' listener
  // calls. Null when the test's thread steps the scheduler: then they run inline, as a test wants.
  std::unique_ptr<ListenerDelivery> delivery_;
  std::thread thread_;
};

}  // namespace tost::service
