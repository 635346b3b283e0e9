#include "model/device/device_failure.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(TOST_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace tost::model {
namespace {

// The values of cudaError_t (driver_types.h), so the classification is the same in builds
// without CUDA (the tests run there); checked against the enum where CUDA is present.
enum StickyCudaError : int {
  kEccUncorrectable = 214,
  // An error the GPU's error containment caught (Hopper reports contained uncorrectable memory
  // errors and some invalid NVLink peer accesses so).
  kContained = 226,
  kIllegalAddress = 700,
  kLaunchTimeout = 702,
  kAssert = 710,
  kHardwareStackError = 714,
  kIllegalInstruction = 715,
  kMisalignedAddress = 716,
  kInvalidAddressSpace = 717,
  kInvalidPc = 718,
  kLaunchFailure = 719,
  // A kernel exited without freeing its tensor memory.
  kTensorMemoryLeak = 721,
  // The MPS server terminated this client.
  kMpsClientTerminated = 810,
  // A device outside CUDA that CUDA was waiting on signalled an error.
  kExternalDevice = 911,
};

#if defined(TOST_WITH_CUDA)
static_assert(int{kEccUncorrectable} == int{cudaErrorECCUncorrectable});
static_assert(int{kContained} == int{cudaErrorContained});
static_assert(int{kIllegalAddress} == int{cudaErrorIllegalAddress});
static_assert(int{kLaunchTimeout} == int{cudaErrorLaunchTimeout});
static_assert(int{kAssert} == int{cudaErrorAssert});
static_assert(int{kHardwareStackError} == int{cudaErrorHardwareStackError});
static_assert(int{kIllegalInstruction} == int{cudaErrorIllegalInstruction});
static_assert(int{kMisalignedAddress} == int{cudaErrorMisalignedAddress});
static_assert(int{kInvalidAddressSpace} == int{cudaErrorInvalidAddressSpace});
static_assert(int{kInvalidPc} == int{cudaErrorInvalidPc});
static_assert(int{kLaunchFailure} == int{cudaErrorLaunchFailure});
static_assert(int{kTensorMemoryLeak} == int{cudaErrorTensorMemoryLeak});
static_assert(int{kMpsClientTerminated} == int{cudaErrorMpsClientTerminated});
static_assert(int{kExternalDevice} == int{cudaErrorExternalDevice});
#endif

struct DeviceFailureState {
  absl::Mutex mu;
  std::function<void(const std::string&)> handler ABSL_GUARDED_BY(mu);
  std::string reason ABSL_GUARDED_BY(mu);
};

DeviceFailureState& State() {
  static auto* state = new DeviceFailureState();
  return *state;
}

}  // namespace

bool IsStickyCudaError(int code) {
  switch (code) {
    case kEccUncorrectable:
    case kContained:
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailure:
    case kTensorMemoryLeak:
    case kMpsClientTerminated:
    case kExternalDevice:
      return true;
    default:
      return false;
  }
}

void SetDeviceLostHandler(std::function<void(const std::string& why)> handler) {
  DeviceFailureState& s = State();
  absl::MutexLock lock(&s.mu);
  s.handler = std::move(handler);
}

bool ReportCudaError(int code, const std::string& what) {
  if (!IsStickyCudaError(code)) return false;
  DeviceFailureState& s = State();
  std::function<void(const std::string&)> handler;
  {
    absl::MutexLock lock(&s.mu);
    if (!s.reason.empty()) return true;  // already reported: the replica is on its way out
    s.reason = what;
    handler = s.handler;
  }
  if (handler) handler(what);  // outside the lock: it may log, signal, or ask for the reason
  return true;
}

std::string DeviceLostReason() {
  DeviceFailureState& s = State();
  absl::MutexLock lock(&s.mu);
  return s.reason;
}

}  // namespace tost::model
