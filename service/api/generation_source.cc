#include "service/api/generation_source.h"

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

}  // namespace tost::service
