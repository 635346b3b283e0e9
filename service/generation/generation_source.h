// Where a generation's state comes from, resolved the same way by every front end: fresh, a
// server-held session (checked out for the caller, who must own it), or a state blob (verified and
// bound to the caller). tost.v1 Generate and the OpenAI-compatible routes both call it, so the
// owner checks and their refusals are one code path.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "service/engine/engine.h"

namespace tost::service {

struct GenerationSource {
  std::string model;  // the request's, or the session's / blob's when the request left it empty
  GenerationScheduler* scheduler = nullptr;
  ModelIdentity identity;
  // The state being continued; nullopt for a fresh generation.
  std::optional<GenerationState> state;
  // The session checked out (busy) for this call, "" when none: the caller checks its final state
  // in (SessionStore::Checkin) or releases it (Release) if the call fails before it runs.
  std::string checked_out;
};

// Checks out `session_id` or opens `state_blob` (at most one may be set) for `owner`, and looks up
// the language model: `model`, or the state's when `model` is empty. A session of another model
// than a non-empty `model` is INVALID_ARGUMENT (naming field `model_field`). On any error nothing
// stays checked out.
absl::StatusOr<GenerationSource> ResolveGenerationSource(Engine& engine, const std::string& owner,
                                                         const std::string& model,
                                                         const std::string& session_id,
                                                         const std::string& state_blob,
                                                         const std::string& model_field = "model");

// For a job that sets no constraint of its own: when its state is in the middle of a constrained
// output (GenerationState::constraint), the job continues under that constraint, compiled again
// (a cache hit where it was compiled before) and replayed to where the state stands, with the
// job's prompt accepted as part of the output; or, with `clear`, drops it. Nothing for a state
// under no constraint. INVALID_ARGUMENT naming the prompt token the constraint refuses there (or
// an end-of-text that would complete the output); FAILED_PRECONDITION when the recorded output
// does not replay on this server; the compiler's errors otherwise (a compile takes one of
// `caller`'s slots). `where` names the state in messages ("session ID", "the state blob":
// StateName).
absl::Status ContinueStateConstraint(const Engine& engine, const std::string& model,
                                     const std::string& caller, bool clear,
                                     const std::string& where, GenerationRequest& job);
// "session \"ID\"" (quoted as client text) for a session, "the state blob" for none.
std::string StateName(const std::string& session_id);

}  // namespace tost::service
