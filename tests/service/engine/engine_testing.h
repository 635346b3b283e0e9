// Driving the generation scheduler from a test's thread: step until something holds, take the
// events a job has ready, run a job to its end. One copy for every engine-level test (the
// scheduler's, the engine's, the prefix cache's, the generation call's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "service/engine/generation_scheduler.h"

namespace tost::service::testing {

// What a consumer took from one job.
struct Collected {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::string text;
  std::optional<GenerationEvent> final;
  int snapshots = 0;
};

// Adds `event` to `out`.
void Record(GenerationEvent event, Collected& out);
// Takes whatever events are ready (never waits).
void Drain(GenerationJob& job, Collected& out);
// Checks `done` before each step and steps `scheduler` until it holds, at most `max_steps` steps:
// false when it never held (a bug fails instead of hanging).
bool StepUntil(GenerationScheduler& scheduler, absl::FunctionRef<bool()> done,
               int max_steps = 10000);
// Steps until `job` ends (bounded), taking its events after each step; `final` is unset when it
// never ended.
Collected RunToEnd(GenerationScheduler& scheduler, GenerationJob& job, int max_steps = 10000);

}  // namespace tost::service::testing
