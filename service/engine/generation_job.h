// A generation job as the engine hands it to a front end, and the events it publishes: what a
// consumer of a generation sees, without the scheduler that runs it (generation_scheduler.h).
//
// A job publishes tokens, state snapshots and one final event; the consumer takes them (TryNext)
// when its listener tells it some are waiting. Tokens it leaves untaken pause the job in the
// scheduler, so a slow consumer throttles its own job and no other.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/engine/constraints.h"
#include "service/engine/generation_state.h"

namespace tost::service {

class GenerationScheduler;
class ListenerDelivery;

// kConstraint: the job's constraint admitted no token at all (its grammar cannot go on from the
// output so far with any token of the vocabulary); the output is cut short there.
enum class FinishReason { kLength, kEos, kStop, kCancelled, kContext, kDrained, kConstraint };

struct TokenEvent {
  int32_t id = 0;
  std::string bytes;
  std::string text;      // complete characters released by this token (may be empty)
  int64_t position = 0;  // absolute position of this token in the sequence
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // This token's own log-probability (log-softmax of the raw logits), when the request asked for
  // logprobs.
  std::optional<float> logprob;
};

// When a job passed the steps to its first token, by the scheduler's clock (InfinitePast: it did
// not reach that point), so that a front end can show where a slow first token spent its time.
struct GenerationTimeline {
  absl::Time submitted = absl::InfinitePast();      // queued to become active (Submit)
  absl::Time placed = absl::InfinitePast();         // the start of the step that gave it a place
  absl::Time prefill_start = absl::InfinitePast();  // its first prefill chunk began
  absl::Time prefill_end = absl::InfinitePast();    // its last prefill chunk ended
  // The step that drew its first token: when that step began and when its decode ended, with the
  // prompt tokens that step fed over every job (its own included) and the rows it decoded.
  absl::Time first_step_start = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  int64_t first_step_prefill_tokens = 0;
  int32_t first_step_batch = 0;
};

struct GenerationEvent {
  enum class Kind { kToken, kSnapshot, kFinished };
  Kind kind = Kind::kToken;
  TokenEvent token;  // kToken
  // kSnapshot (every `snapshot_every` tokens) and kFinished: the state to keep. A finished job
  // whose status is non-OK other than CANCELLED (past its deadline, a model error) failed, and its
  // snapshot is the state it started from; a cancelled one keeps what it generated.
  GenerationState snapshot;
  // kFinished:
  absl::Status status;  // non-OK: the job failed (e.g. an internal model error)
  FinishReason finish_reason = FinishReason::kLength;
  int32_t prompt_tokens = 0;
  // Of prompt_tokens, those whose statistics came from the prefix-state cache (not prefilled).
  int32_t cached_tokens = 0;
  int32_t generated_tokens = 0;
  std::string final_text;  // text released at the end (one-shot generations only)
  GenerationTimeline timeline;
};

// How a request uses the engine's prefix-state cache (PrefixStateCache).
enum class PrefixCacheUse {
  kOff,
  // Stores the states this job reaches, when it knows every token they hold (it started at
  // position 0): what a call continuing a session or a blob asks for, as it brings its own state.
  kInsert,
  // Also starts a fresh state (position 0, no pending token) from the longest cached prefix of
  // its prompt; a state that is not fresh is only inserted from.
  kLookupAndInsert,
};

struct GenerationRequest {
  GenerationState state;  // a fresh state (NewState) or a session's
  std::vector<int32_t>
      prompt;  // appended to the sequence; may be empty if state has a pending token
  int32_t max_new_tokens = 64;  // 0: only feed the prompt
  int32_t top_logprobs = 0;     // per token, the n most likely alternatives
  bool logprobs = false;        // each token's own logprob; top_logprobs > 0 implies it
  int32_t snapshot_every = 0;   // publish the state every k tokens (0: only at the end)
  // (token id, bias) pairs added to this job's logits before each draw (model::TokenDraw's
  // logit_bias); ids distinct and within the vocabulary (BuildGenerationRequest checks). Not part
  // of the state: a continued call biases only if it asks again.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool persistent = false;  // the state outlives this call: keep withheld text in it
  absl::Time deadline = absl::InfiniteFuture();
  // The caller's identity (Authenticator::Identify): the prefix-cache entries this job reads and
  // creates are its own; kAnonymousCaller when authentication is off (one shared scope).
  std::string owner;
  // Lower runs sooner (as in vLLM): active places go to the lowest values first, and a job of a
  // lower value takes the place of the highest-valued running one (parked with its state, resumed
  // where it stopped). Between jobs of one priority, the owners (tenants) share places by weight.
  int32_t priority = 0;
  PrefixCacheUse prefix_cache = PrefixCacheUse::kLookupAndInsert;
  // OpenAI's prompt_cache_key (empty: none): a fresh job joins the key's group
  // (PrefixStateCache::JoinGroup) and stores the state at the prefix it shares with the group's
  // last prompt, cutting its prefill there (in batch-invariant serving, at the prefill chunk
  // multiple at or before it, so cuts stay on the grid).
  std::string prompt_cache_key;
  // Constrained generation (null: none): before each draw the job's row may draw only the tokens
  // it allows (end-of-text only where the output may end), and it is told each drawn token. Its
  // bitmask must cover the model's logits (Submit checks). Reported logprobs are those of the
  // constrained distribution, and alternatives it forbids are left out of top_logprobs. Built on
  // the submitting thread (ConstraintCompiler); only the scheduler's thread steps it after.
  // While a job runs, state.constraint records its progress (the output the constraint has
  // accepted) so that the state continues under it wherever it goes.
  std::unique_ptr<TokenConstraint> constraint;
  // With `constraint` set: true when it is the state's own pending constraint (state.constraint,
  // same spec), already replayed by the caller up to the state's output, and this call's prompt
  // already accepted by it as part of that output (a client steering the structure); false when it
  // starts after the prompt, replacing whatever the state was under.
  bool constraint_continues = false;
  // Without `constraint`: leave the state's pending constraint. Without this, a state in the
  // middle of a constrained output is refused (FAILED_PRECONDITION), so that no caller continues
  // one unconstrained by omission.
  bool clear_constraint = false;
};

class GenerationJob {
 public:
  // The next event, waiting at most `timeout`; nullopt on timeout.
  std::optional<GenerationEvent> Next(absl::Duration timeout);
  // The next event if one is ready.
  std::optional<GenerationEvent> TryNext() { return Next(absl::ZeroDuration()); }
  // `listener` is called after each event is published (with no lock of the job or the scheduler
  // held; it must not block), so a consumer need not poll: for a final event on the thread that
  // published it, for tokens and snapshots of a started scheduler on its ListenerDelivery thread
  // (once for events published together), otherwise on the scheduler's thread. Setting
  // another listener (or null) returns only once no call of the previous one is in progress, so a
  // consumer can clear it and then be destroyed.
  void SetListener(absl::AnyInvocable<void()> listener);
  // Calls the listener now, as a published event does and under the same guarantee (SetListener
  // waits for it): for a consumer that learns something on a thread of its own (a session store's
  // check-in) and must act on it where it may be destroyed right after.
  void WakeListener();
  // Asks the scheduler to stop this job. A job still queued to become active gives its place back
  // at once: it is taken out of the queue and its final event is published on the calling thread
  // (listener included) before Cancel returns, so a burst of reset streams never holds places
  // while the scheduler is busy with a step. An active job is dropped at the start of the next
  // step (the step in progress may be using its state).
  void Cancel();
  bool cancel_requested() const { return cancelled_.load(std::memory_order_relaxed); }
  // Tokens published and not yet taken by the consumer.
  int32_t buffered_tokens() const;
  // True once the scheduler has ended the job because its consumer took nothing for
  // stream_stall_timeout. Its final event is waiting behind tokens nobody reads, so a consumer
  // that cannot deliver them (a stream stuck in flow control) should abandon its delivery.
  bool stalled() const { return stalled_.load(std::memory_order_acquire); }

 private:
  friend class GenerationScheduler;
  friend class ListenerDelivery;
  struct Doorbell;
  struct Owner;
  GenerationJob(std::shared_ptr<Doorbell> doorbell, std::shared_ptr<Owner> owner)
      : doorbell_(std::move(doorbell)), owner_(std::move(owner)) {}
  // Queues `e` for the consumer and calls the listener.
  void Publish(GenerationEvent e);
  // Queues `e` for the consumer without calling the listener (ListenerDelivery will).
  void Append(GenerationEvent e);

  // Rung when the consumer takes a token or cancels, so a scheduler waiting on paused jobs wakes.
  const std::shared_ptr<Doorbell> doorbell_;
  // The scheduler that queued this job, while it exists: Cancel() takes the job out of its queue.
  const std::shared_ptr<Owner> owner_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> stalled_{false};
  std::atomic<bool> wake_queued_{false};  // a ListenerDelivery wake of this job is queued
  mutable absl::Mutex mu_;
  std::deque<GenerationEvent> events_ ABSL_GUARDED_BY(mu_);
  int32_t buffered_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // Held while the listener runs; the listener may take mu_ (TryNext), never the reverse.
  absl::Mutex listener_mu_;
  absl::AnyInvocable<void()> listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace tost::service
