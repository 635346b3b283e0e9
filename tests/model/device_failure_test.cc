// IsStickyCudaError over every cudaError_t value: the codes after which the CUDA context is
// unusable end the replica, and no other code does (an ordinary error fails one call only).
#include "model/device/device_failure.h"

#include <gtest/gtest.h>

#include <set>

namespace tost::model {
namespace {

// cudaError_t values (driver_types.h of CUDA 13) that the runtime documents as leaving the process
// in an inconsistent state; model/device/device_failure.cc checks them against the enum where CUDA
// is present.
const std::set<int> kSticky = {
    214,  // cudaErrorECCUncorrectable
    226,  // cudaErrorContained: what Hopper reports for contained uncorrectable memory errors
    700,  // cudaErrorIllegalAddress
    702,  // cudaErrorLaunchTimeout
    710,  // cudaErrorAssert
    714,  // cudaErrorHardwareStackError
    715,  // cudaErrorIllegalInstruction
    716,  // cudaErrorMisalignedAddress
    717,  // cudaErrorInvalidAddressSpace
    718,  // cudaErrorInvalidPc
    719,  // cudaErrorLaunchFailure
    721,  // cudaErrorTensorMemoryLeak
    810,  // cudaErrorMpsClientTerminated
    911,  // cudaErrorExternalDevice
};

TEST(DeviceFailure, EveryStickyCodeEndsTheReplica) {
  for (int code : kSticky) EXPECT_TRUE(IsStickyCudaError(code)) << "cudaError_t " << code;
}

TEST(DeviceFailure, NoOtherCodeDoes) {
  // Every cudaError_t value is below 1000 (cudaErrorUnknown is 999); past it, and negative values,
  // are not CUDA errors at all.
  for (int code = -1; code <= 1100; ++code) {
    if (kSticky.count(code) == 0) {
      EXPECT_FALSE(IsStickyCudaError(code)) << "cudaError_t " << code;
    }
  }
  // The neighbours of the sticky ones that leave the context usable.
  EXPECT_FALSE(IsStickyCudaError(2));    // cudaErrorMemoryAllocation
  EXPECT_FALSE(IsStickyCudaError(225));  // cudaErrorUnsupportedDevSideSync
  EXPECT_FALSE(IsStickyCudaError(720));  // cudaErrorCooperativeLaunchTooLarge
  EXPECT_FALSE(IsStickyCudaError(809));  // cudaErrorMpsMaxConnectionsReached
  EXPECT_FALSE(IsStickyCudaError(910));  // cudaErrorGraphExecUpdateFailure
}

}  // namespace
}  // namespace tost::model
