// OpenAI's error body from an absl::Status: the type per code, the param carried by the status or
// given by the caller, and valid JSON whatever the message holds.
#include "service/openai/error.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/utf8.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

TEST(OpenAiError, Types) {
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kInvalidArgument), "invalid_request_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kOutOfRange), "invalid_request_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kFailedPrecondition), "invalid_request_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kUnimplemented), "invalid_request_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kUnauthenticated), "authentication_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kPermissionDenied), "permission_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kNotFound), "not_found_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kResourceExhausted), "rate_limit_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kUnavailable), "server_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kInternal), "server_error");
  EXPECT_STREQ(OpenAiErrorType(absl::StatusCode::kDeadlineExceeded), "server_error");
}

TEST(OpenAiError, BodyFromAFieldError) {
  const absl::Status s = FieldError("messages[2].role", "expected one of ..., got \"robot\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "messages[2].role: expected one of ..., got \"robot\"");
  EXPECT_EQ(json::parse(OpenAiErrorBody(s)), json::parse(R"({"error": {
      "message": "messages[2].role: expected one of ..., got \"robot\"",
      "type": "invalid_request_error", "param": "messages[2].role",
      "code": "invalid_argument"}})"));
  // The caller's param wins over the status's.
  EXPECT_EQ(json::parse(OpenAiErrorBody(s, "messages"))["error"]["param"], "messages");
}

TEST(OpenAiError, BodyWithoutParam) {
  EXPECT_EQ(json::parse(OpenAiErrorBody(absl::NotFoundError("model \"x\" is not served"))),
            json::parse(R"({"error": {"message": "model \"x\" is not served",
                "type": "not_found_error", "param": null, "code": "not_found"}})"));
  EXPECT_EQ(json::parse(OpenAiErrorBody(absl::UnauthenticatedError("no key")))["error"]["code"],
            "unauthenticated");
}

TEST(OpenAiError, WithParamKeepsAnExistingOne) {
  const absl::Status s = WithParam(FieldError("stop[1]", "bad"), "stop");
  EXPECT_EQ(ErrorParam(s), "stop[1]");
  EXPECT_EQ(ErrorParam(WithParam(absl::InvalidArgumentError("x"), "n")), "n");
  EXPECT_TRUE(WithParam(absl::OkStatus(), "n").ok());
  EXPECT_EQ(ErrorParam(absl::InternalError("x")), "");
}

TEST(OpenAiError, InvalidUtf8InAMessageStillGivesValidJson) {
  const std::string body = OpenAiErrorBody(absl::InvalidArgumentError("bad \xff byte"), "p\xfe");
  EXPECT_EQ(model::FirstInvalidUtf8(body), std::nullopt);
  const json j = json::parse(body);
  EXPECT_EQ(j["error"]["message"], "bad \\xff byte");
  EXPECT_EQ(json::parse(OpenAiErrorBody(absl::OkStatus()))["error"]["type"], "server_error");
}

}  // namespace
}  // namespace tost::service::openai
