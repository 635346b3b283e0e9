#include "service/generation/generation_source.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"

namespace tost::service {

absl::StatusOr<GenerationSource> ResolveGenerationSource(Engine& engine, const std::string& owner,
                                                         const std::string& model,
                                                         const std::string& session_id,
                                                         const std::string& state_blob,
                                                         const std::string& model_field) {
  if (!session_id.empty() && !state_blob.empty()) {
    return absl::InvalidArgumentError("set session_id or state, not both");
  }
  // Where the state comes from decides the model when the request leaves it empty. The model is
  // looked up once, and a blob authenticated and parsed once, whichever way the call comes.
  GenerationSource source;
  source.model = model;
  std::optional<OpenedBlob> blob;
  if (!session_id.empty()) {
    TOST_ASSIGN_OR_RETURN(source.state, engine.sessions().Checkout(session_id, owner));
    source.checked_out = session_id;
  }
  // A refusal below gives the session back: the caller holds it only on success.
  absl::Cleanup release = [&] {
    if (!source.checked_out.empty()) engine.sessions().Release(source.checked_out);
  };
  if (!session_id.empty()) {
    if (!source.model.empty() && source.model != source.state->model) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_field, ": session \"", session_id, "\" belongs to model \"",
                       source.state->model, "\", the request names ", QuoteClientText(source.model),
                       " (leave ", model_field, " empty to continue the session's)"));
    }
    source.model = source.state->model;
  } else if (!state_blob.empty()) {
    TOST_ASSIGN_OR_RETURN(blob, engine.codec().Open(state_blob));
    if (source.model.empty()) source.model = blob->model();
  }
  TOST_ASSIGN_OR_RETURN(Engine::ServedGenerator served, engine.Generator(source.model));
  source.scheduler = served.scheduler;
  source.identity = std::move(served.identity);
  if (blob.has_value()) {
    TOST_ASSIGN_OR_RETURN(source.state, engine.codec().Decode(*blob, source.identity, owner));
  }
  std::move(release).Cancel();
  return source;
}

absl::Status ContinueStateConstraint(const Engine& engine, const std::string& model,
                                     const std::string& caller, bool clear,
                                     const std::string& where, GenerationRequest& job) {
  if (!job.state.constraint.has_value()) return absl::OkStatus();
  if (clear) {
    job.clear_constraint = true;
    return absl::OkStatus();
  }
  const ConstraintProgress& progress = *job.state.constraint;
  absl::StatusOr<std::unique_ptr<TokenConstraint>> compiled =
      engine.CompileConstraint(model, progress.spec, caller);
  if (!compiled.ok()) {
    return absl::Status(
        compiled.status().code(),
        absl::StrCat(where, " is in the middle of a constrained output, and its constraint ",
                     "could not be compiled here: ", compiled.status().message()));
  }
  TokenConstraint& constraint = **compiled;
  if (absl::Status replayed = constraint.Replay(progress.output); !replayed.ok()) {
    // The output was accepted by this constraint where it was generated: a replica whose
    // tokenizer or grammar engine differs cannot stand where that one stood.
    return absl::FailedPreconditionError(absl::StrCat(
        where, " is in the middle of a constrained output that its constraint does not accept ",
        "on this server (", replayed.message(),
        "); continue it on a replica of the same version, or clear its constraint"));
  }
  for (size_t i = 0; i < job.prompt.size(); ++i) {
    absl::Status accepted = constraint.Accept(job.prompt[i]);
    if (accepted.ok() && constraint.Ended()) {
      accepted = absl::InvalidArgumentError("it is end-of-text, which would complete the output");
    }
    if (!accepted.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt: ", where, " is in the middle of a constrained output, so its prompt continues ",
          "that output, and prompt token ", i, " (id ", job.prompt[i],
          ") is not allowed there: ", accepted.message(),
          "; send a prompt the constraint allows, a new constraint, or ", "clear_constraint"));
    }
  }
  job.constraint = *std::move(compiled);
  job.constraint_continues = true;
  return absl::OkStatus();
}

std::string StateName(const std::string& session_id) {
  return session_id.empty() ? std::string("the state blob")
                            : absl::StrCat("session ", QuoteClientText(session_id));
}

}  // namespace tost::service
