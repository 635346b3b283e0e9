// API key files: what they may name, and what is refused with the line that says why; and the one
// check both front ends call with what a call presents.
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

CallerCredentials Presented(std::string_view api_key, std::string_view authorization,
                            std::string_view tls_identity) {
  return CallerCredentials{
      .api_key = api_key, .authorization = authorization, .tls_identity = tls_identity};
}

TEST(Authenticator, IdentifiesTheSameCredentialsWhicheverFrontEndPresentsThem) {
  auto keyed = Authenticator::FromText("alice 0123456789abcdef\n", "keys");
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  EXPECT_EQ(*keyed->Identify(Presented("0123456789abcdef", "", "")), "alice");
  EXPECT_EQ(*keyed->Identify(Presented("", "Bearer 0123456789abcdef", "")), "alice");
  EXPECT_EQ(*keyed->Identify(Presented("", "bearer 0123456789abcdef", "")), "alice");
  const auto missing = keyed->Identify(Presented("", "", "alice"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing API key"));
  EXPECT_THAT(keyed->Identify(Presented("", "Bearer 0123456789abcdeX", "")).status().message(),
              HasSubstr("unknown API key"));
  EXPECT_EQ(keyed->Identify(Presented("", "Basic 0123456789abcdef", "")).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Without keys: the TLS client identity, else anonymous.
  const Authenticator open;
  EXPECT_EQ(*open.Identify(Presented("", "", "alice")), "tls:alice");
  EXPECT_EQ(*open.Identify(Presented("", "", "")), "anonymous");
}

}  // namespace
}  // namespace tost::service
