// Injected time. Components that make timing decisions (the dynamic batcher, session idle reaping)
// read time through a Clock so their tests can drive it by hand with FakeClock instead of sleeping.
//
//   RealClock  wall time (absl::Now()); RealClock::Get() is a process-wide instance.
//   FakeClock  time that moves only when a test calls Advance().
//
// Thread-safety: Now() may be called from any thread on both implementations; FakeClock's Advance()
// too. A Clock is never owned by the components that read it: it must outlive them.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tost::service {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  // The process-wide real clock (never destroyed, so it outlives every user).
  static Clock* Get() {
    static RealClock* const clock = new RealClock();
    return clock;
  }
};

class FakeClock final : public Clock {
 public:
  // Starts at an arbitrary fixed instant (not the epoch, so "time zero" bugs show up as odd
  // values).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Moves time forward by `delta` (negative deltas are ignored: time never runs backwards).
  void Advance(absl::Duration delta) {
    absl::MutexLock lock(&mu_);
    if (delta > absl::ZeroDuration()) now_ += delta;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tost::service
