#include "tests/service/engine/engine_testing.h"

#include <utility>

namespace tost::service::testing {

void Record(GenerationEvent event, Collected& out) {
  switch (event.kind) {
    case GenerationEvent::Kind::kToken:
      out.tokens.push_back(event.token.id);
      out.positions.push_back(event.token.position);
      out.text += event.token.text;
      break;
    case GenerationEvent::Kind::kSnapshot:
      ++out.snapshots;
      break;
    case GenerationEvent::Kind::kFinished:
      out.final = std::move(event);
      break;
  }
}

void Drain(GenerationJob& job, Collected& out) {
  while (auto event = job.TryNext()) Record(*std::move(event), out);
}

bool StepUntil(GenerationScheduler& scheduler, absl::FunctionRef<bool()> done, int max_steps) {
  for (int i = 0; i < max_steps; ++i) {
    if (done()) return true;
    scheduler.StepOnce();
  }
  return done();
}

Collected RunToEnd(GenerationScheduler& scheduler, GenerationJob& job, int max_steps) {
  Collected out;
  StepUntil(
      scheduler,
      [&] {
        Drain(job, out);
        return out.final.has_value();
      },
      max_steps);
  return out;
}

}  // namespace tost::service::testing
