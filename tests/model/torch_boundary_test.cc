// GuardTorch, the one place LibTorch exceptions become statuses: each kind of c10 error maps to the
// code a client can act on, naming the model and the operation; LibTorch's own text is the server
// detail, never the message.
#include "model/nets/torch_boundary.h"

#include "base/error_detail.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace tost::model {
namespace {

template <typename Exception>
absl::Status Throwing(const char* what) {
  return GuardTorch("m", "step",
                    [&]() -> int {
                      throw Exception(c10::SourceLocation{__func__, __FILE__, __LINE__}, what);
                    })
      .status();
}

TEST(GuardTorch, MapsEachErrorKindToItsCode) {
  EXPECT_TRUE(GuardTorch("m", "step", [] { return 1; }).ok());
  const absl::Status oom = Throwing<c10::OutOfMemoryError>("CUDA out of memory. Tried to allocate");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("model m: step: out of memory; retry later"), std::string::npos)
      << oom;
  EXPECT_EQ(oom.message().find("CUDA out of memory"), std::string::npos) << oom;
  EXPECT_NE(ServerDetail(oom).find("LibTorch: CUDA out of memory"), std::string::npos) << oom;
  for (const absl::Status& s : {Throwing<c10::ValueError>("bad"), Throwing<c10::IndexError>("bad"),
                                Throwing<c10::Error>("bad")}) {
    EXPECT_EQ(s.message().find("bad"), std::string::npos) << s;
    EXPECT_EQ(ServerDetail(s), "LibTorch: bad") << s;
  }
  EXPECT_EQ(Throwing<c10::ValueError>("bad").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Throwing<c10::IndexError>("bad").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Throwing<c10::Error>("bad").code(), absl::StatusCode::kInternal);
  const absl::Status other =
      GuardTorch("m", "step", []() -> int { throw std::runtime_error("boom"); }).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(other.message(), "model m: step failed") << other;
  EXPECT_EQ(ServerDetail(other), "LibTorch: boom") << other;
}

absl::Status CudaFailure(int code) {
  return GuardTorch("m", "step",
                    [&]() -> int {
                      throw c10::AcceleratorError(c10::SourceLocation{__func__, __FILE__, __LINE__},
                                                  code, "CUDA error: test");
                    })
      .status();
}

// One test: the device-lost latch is process-wide, and only the first sticky error runs the
// handler.
TEST(GuardTorch, AStickyCudaErrorLosesTheDeviceOnceAndAnOrdinaryOneFailsOnlyTheCall) {
  std::vector<std::string> reported;
  SetDeviceLostHandler([&](const std::string& why) { reported.push_back(why); });
  EXPECT_FALSE(IsStickyCudaError(0));
  EXPECT_FALSE(IsStickyCudaError(1));   // cudaErrorInvalidValue
  EXPECT_FALSE(IsStickyCudaError(2));   // cudaErrorMemoryAllocation
  EXPECT_TRUE(IsStickyCudaError(700));  // cudaErrorIllegalAddress
  EXPECT_TRUE(IsStickyCudaError(710));  // cudaErrorAssert
  EXPECT_TRUE(IsStickyCudaError(719));  // cudaErrorLaunchFailure

  const absl::Status ordinary = CudaFailure(1);
  EXPECT_EQ(ordinary.code(), absl::StatusCode::kInternal) << ordinary;
  EXPECT_TRUE(reported.empty());
  EXPECT_EQ(DeviceLostReason(), "");

  const absl::Status lost = CudaFailure(700);
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_NE(lost.message().find("retry on another replica"), std::string::npos) << lost;
  EXPECT_NE(ServerDetail(lost).find("CUDA error: test"), std::string::npos) << lost;
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_NE(reported[0].find("CUDA error: test"), std::string::npos);
  EXPECT_EQ(DeviceLostReason(), reported[0]);

  EXPECT_EQ(CudaFailure(719).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reported.size(), 1u) << "the handler runs once per process";
  SetDeviceLostHandler({});
}

}  // namespace
}  // namespace tost::model
