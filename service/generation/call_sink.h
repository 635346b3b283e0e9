// What a protocol implements to carry one generation call to its client: whether the stream has
// room, and how it writes a token, a state snapshot, a choice's end and the call's end. The rules
// of the call (which event goes when, check-ins, stalls, cancels) are GenerationCall's; a sink only
// speaks its wire format.
//
// Every method but the admission hooks is called with the call's lock held, so a sink never sees
// two of its methods at once, and none may call back into the call synchronously (a wake passed to
// NotifyWhenRoom runs later, on the sink's own thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/engine/generation_job.h"
#include "service/engine/model_interface.h"
#include "service/generation/generation_input.h"

namespace tost::service {

// The admission step an error came from, so that a sink can name the field its caller sent.
enum class AdmissionStep {
  kResolve,             // the model, session or state blob (ResolveGenerationSource)
  kReserve,             // a place in the scheduler
  kInput,               // prompt, sampling, stops and counts (BuildGenerationRequest)
  kCompileConstraint,   // the request's own constraint
  kContinueConstraint,  // the state's pending constraint, replayed
  kSubmit,              // the scheduler's checks of the job
};

// What the call resolved, for the sink to build its replies from.
struct AdmittedCall {
  std::string model;  // the model serving the call (the state's when the request named none)
  const GenerativeModel* generator = nullptr;
  int32_t choices = 1;
};

class CallSink {
 public:
  virtual ~CallSink() = default;

  // Admission hooks, on the admitting thread, without the call's lock:
  // An admission error in the words the caller's protocol uses (field names, status codes); the
  // default keeps it.
  virtual absl::Status Refine(AdmissionStep step, absl::Status status) { return status; }
  // The call's input, once the model is resolved and a place per choice is held (so a full
  // scheduler refuses before a prompt is rendered or tokenised). Its prompt is a view into the
  // sink's request, which the sink keeps alive until Admit returns.
  virtual absl::StatusOr<GenerationInput> Input(const AdmittedCall& call) = 0;
  // Every choice was submitted; called before any method below.
  virtual void Started(const AdmittedCall& call) {}

  // Whether the stream can take another event now. A sink without flow control answers true.
  virtual bool HasRoom() = 0;
  // Asks for `wake` to be called once HasRoom may be true again (the call asks at most once until
  // it is called). False, dropping `wake`, when there is room already (the stream drained between
  // HasRoom and this call): the call goes on at once.
  virtual bool NotifyWhenRoom(absl::AnyInvocable<void()> wake) = 0;

  // A token of choice `choice`. An error (a message that cannot be encoded) fails the call.
  virtual absl::Status Token(size_t choice, const TokenEvent& token) = 0;
  // A state snapshot of choice `choice` (the request asked for one every k tokens): `blob` is the
  // sealed state, `position` the sequence position it stands at.
  virtual absl::Status Snapshot(size_t choice, std::string blob, int64_t position) = 0;
  // Choice `choice` ended well (its session, if any, is checked in): `blob` is its sealed final
  // state when the caller gets it back (a state blob call, return_state, or a drain), else empty.
  virtual absl::Status Final(size_t choice, const GenerationEvent& event, std::string blob) = 0;
  // The call ended: `status` OK after every choice's Final, else why it failed. With `client_gone`
  // the client left or stopped reading, and nothing reaches it any more: the sink closes its end.
  // Called once; no method is called after it.
  virtual void End(const absl::Status& status, bool client_gone) = 0;

  // The client took nothing for the stall timeout while the stream was full: reset the stream
  // (what it holds is dropped). The call goes on only to take its choices' final states.
  virtual void Abort() = 0;
};

}  // namespace tost::service
