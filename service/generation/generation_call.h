// One generation call from admission to its last event, for every front end: the protocol-neutral
// rules between the engine and a CallSink.
//
// Admission (Admit, on an admission thread, never an I/O or RPC callback thread: it may wait on a
// shared store, a MiB prompt's tokenisation or a constraint compile) resolves the state source,
// reserves one scheduler place per choice before any work on the prompt, builds each choice's job,
// compiles the request's constraint or continues the state's, applies the persistence and
// prefix-cache rules and submits. An error leaves nothing held (session released, places back).
//
// The pump then moves each job's events into the sink, only while the sink has room: a reader that
// stops reading pauses its own jobs in the scheduler, and once the scheduler ends one as stalled
// the call aborts the stream and takes the remaining events only for their final states. A
// session's state is checked in before the client hears the end, and a choice ends only once the
// store has it. One failing choice cancels the others; a client gone cancels every choice, and
// their final states still go back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/api/request_input.h"
#include "service/engine/engine.h"
#include "service/generation/call_sink.h"
#include "service/generation/generation_input.h"
#include "service/generation/generation_source.h"
#include "service/structured/constraint.h"

namespace tost::service {

// What a front end asks of one call, in no protocol's types.
struct GenerationCallRequest {
  std::string owner;  // the caller (Authenticator::Identify): owns the sessions, blobs, prefixes
  std::string model;  // empty: the session's or the blob's
  std::string session_id;
  std::optional<std::string> state_blob;  // a sealed state to continue
  // Choices generated side by side from the same prompt, 1..kMaxChoicesPerRequest; choice i samples
  // with ChoiceSeed(seed, i).
  int32_t choices = 1;
  // The prompt, sampling and stops come from the sink (CallSink::Input), once a place is held.
  std::optional<structured::Constraint> constraint;
  bool clear_constraint = false;  // drop the state's pending constraint instead of continuing it
  bool return_state = false;      // each choice's final state goes back as a blob
  absl::Time deadline = absl::InfiniteFuture();
  int32_t priority = 0;  // lower runs sooner; within the engine's tenants().options().max_priority
  // The group whose shared prefix the prefix-state cache keeps (GenerationRequest::
  // prompt_cache_key; OpenAI's field of that name, and GenerateRequest's); empty: none. At most
  // kMaxPromptCacheKeyChars.
  std::string prompt_cache_key;
  GenerationFieldNames names;  // how errors name the request's fields
};

class GenerationCall : public std::enable_shared_from_this<GenerationCall> {
 public:
  // `engine` and `limits` outlive the call; `sink` until its End, or until Detach returns (a sink
  // whose lifetime its protocol decides: a gRPC reactor).
  static std::shared_ptr<GenerationCall> Create(Engine& engine, const ServiceLimits& limits,
                                                CallSink& sink);
  // A call that owns its sink: both live while the call's jobs do (their listeners hold the call)
  // or while the front end holds the call.
  static std::shared_ptr<GenerationCall> Create(Engine& engine, const ServiceLimits& limits,
                                                std::shared_ptr<CallSink> sink);

  // Admits `request` and starts pumping its events into the sink. On an error nothing is held and
  // no sink method but the admission hooks (Refine, Input) ran: the front end answers with it.
  absl::Status Admit(GenerationCallRequest request);

  // Stops every choice (a cancelled RPC, a passed deadline); their final states still go back, and
  // the call ends with CANCELLED. Before or during Admit: the jobs are cancelled once submitted.
  void Cancel();
  // As Cancel, and the client is gone: nothing more is written, the sink just closes.
  void ClientGone();
  // After it returns no sink method runs or will run: for a sink destroyed on its own schedule.
  void Detach();

 private:
  GenerationCall(Engine& engine, const ServiceLimits& limits, CallSink& sink,
                 std::shared_ptr<CallSink> owned_sink)
      : engine_(engine),
        limits_(limits),
        owned_sink_(std::move(owned_sink)),
        admitting_sink_(&sink),
        sink_(&sink) {}

  absl::Status AdmitJobs(GenerationCallRequest& request,
                         std::vector<std::shared_ptr<GenerationJob>>& jobs);
  // Takes every event that is ready while the sink has room; ends the call after the last
  // choice's final event. Any thread (listeners, the sink's, the store's); serialised by mu_.
  void Pump();
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleEvent(size_t i, GenerationEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A choice's final event, once its session's state (if any) is stored.
  void FinishChoice(size_t i, const GenerationEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first error is the call's; Fail also cancels the other choices.
  void SetError(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Blob(const GenerationState& state) const;
  void CancelAll();

  Engine& engine_;
  const ServiceLimits& limits_;
  const std::shared_ptr<CallSink> owned_sink_;  // null when the protocol owns the sink
  // The sink as admission sees it (its hooks run without the lock, before any job exists).
  CallSink* const admitting_sink_;
  // Set by Admit before any job exists, then read-only.
  std::string owner_;
  GenerationSource source_;
  bool return_state_ = false;  // blobs back at each choice's end (a blob call or return_state)

  absl::Mutex mu_;
  CallSink* sink_ ABSL_GUARDED_BY(mu_);  // null once detached
  std::vector<std::shared_ptr<GenerationJob>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> finished_ ABSL_GUARDED_BY(mu_);
  size_t remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // jobs_ published
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool awaiting_room_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_all_ ABSL_GUARDED_BY(mu_) = false;  // decided under the lock, done outside it
  // The session this call holds busy until its final state is checked in.
  std::string checked_out_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // A final event whose session state waits to be checked in (a session call has one choice).
  struct PendingCheckin {
    std::string session;
    size_t choice = 0;
    GenerationEvent event;
  };
  std::optional<PendingCheckin> checkin_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::service
