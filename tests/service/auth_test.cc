// API key files: what they may name, and what is refused with the line that says why.
#include "service/api/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tost::service {
namespace {

using ::testing::HasSubstr;

TEST(Authenticator, ReadsNameKeyLinesAndRefusesWhatWouldWeakenThem) {
  EXPECT_TRUE(Authenticator::FromText(
                  "# team keys\nalice 0123456789abcdef\n\nbob fedcba9876543210\n", "keys")
                  .ok());
  // "anonymous" is every keyless caller's identity: a key of that name would share their
  // sessions and unbound state blobs.
  auto reserved = Authenticator::FromText("anonymous 0123456789abcdef\n", "keys");
  ASSERT_FALSE(reserved.ok());
  EXPECT_THAT(reserved.status().message(), HasSubstr("keys:1: the name \"anonymous\" is reserved"));
  EXPECT_THAT(Authenticator::FromText("alice short\n", "keys").status().message(),
              HasSubstr("at least 16 characters"));
  EXPECT_THAT(Authenticator::FromText("a 0123456789abcdef\nb 0123456789abcdef\n", "keys")
                  .status()
                  .message(),
              HasSubstr("keys:2: duplicate key"));
  EXPECT_THAT(Authenticator::FromText("# nothing\n", "keys").status().message(),
              HasSubstr("no keys"));
}

}  // namespace
}  // namespace tost::service
