// GuardTorch, the one place LibTorch exceptions become statuses: each kind of c10 error maps to the
// code a client can act on, naming the model and the operation.
#include "model/torch_boundary.h"

#include <gtest/gtest.h>

#include <stdexcept>

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
  EXPECT_NE(oom.message().find("CUDA out of memory"), std::string::npos) << oom;
  EXPECT_EQ(Throwing<c10::ValueError>("bad").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Throwing<c10::IndexError>("bad").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Throwing<c10::Error>("bad").code(), absl::StatusCode::kInternal);
  const absl::Status other =
      GuardTorch("m", "step", []() -> int { throw std::runtime_error("boom"); }).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_NE(other.message().find("model m: step failed: boom"), std::string::npos) << other;
}

}  // namespace
}  // namespace tost::model
