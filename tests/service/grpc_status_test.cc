// The gRPC side of an error's two halves: ToGrpcStatus carries the server detail to the
// interceptor in the binary details; ForGrpcClient (what the interceptor sends) drops it, bounds
// the message and replaces the server failures' messages.
#include "service/api/grpc_status.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error_detail.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;

TEST(GrpcStatus, TheServerDetailRidesInTheBinaryDetailsAndNeverReachesTheClient) {
  const grpc::Status sent = ToGrpcStatus(WithServerDetail(
      absl::UnavailableError("the session store (--session_store): could not connect"),
      "store redis://10.0.0.7:6379/0"));
  EXPECT_EQ(sent.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(sent.error_message(), "the session store (--session_store): could not connect");
  EXPECT_EQ(sent.error_details(), "tost-server-detail:store redis://10.0.0.7:6379/0");

  const GrpcClientError client = ForGrpcClient(sent, "rid-1");
  EXPECT_TRUE(client.withheld);
  EXPECT_EQ(client.detail, "store redis://10.0.0.7:6379/0");
  EXPECT_EQ(client.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(client.status.error_message(), sent.error_message());
  EXPECT_EQ(client.status.error_details(), "");
}

TEST(GrpcStatus, AnOrdinaryRefusalPassesUnchanged) {
  const grpc::Status sent = ToGrpcStatus(absl::NotFoundError("model \"x\" is not served"));
  EXPECT_EQ(sent.error_details(), "");
  const GrpcClientError client = ForGrpcClient(sent, "rid-2");
  EXPECT_FALSE(client.withheld);
  EXPECT_EQ(client.status.error_message(), "model \"x\" is not served");
  EXPECT_TRUE(ForGrpcClient(grpc::Status::OK, "rid-2").status.ok());
}

TEST(GrpcStatus, InternalErrorsNameTheRequestIdAndLongMessagesAreCut) {
  const GrpcClientError internal =
      ForGrpcClient(ToGrpcStatus(absl::InternalError("model m: step failed at /opt/x.cc:1")), "r3");
  EXPECT_TRUE(internal.withheld);
  EXPECT_EQ(internal.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(internal.status.error_message(),
            "internal error (request id r3): the server's log has the details");

  const GrpcClientError cut =
      ForGrpcClient(ToGrpcStatus(absl::InvalidArgumentError(std::string(5000, 'x'))), "r4");
  EXPECT_TRUE(cut.withheld);
  EXPECT_LE(cut.status.error_message().size(), kMaxClientMessageBytes);
  EXPECT_THAT(cut.status.error_message(), HasSubstr("(5000 bytes; the server's log has all of it "
                                                    "under request id r4)"));
}

}  // namespace
}  // namespace tost::service
