// An error's two halves: what its client reads (bounded, no server detail, no failing layer's own
// words for INTERNAL) and what the server's log keeps.
#include "base/error_detail.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/cord.h"

namespace tost {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ErrorDetail, TravelsWithTheStatusAndSurvivesRewording) {
  absl::Status s = WithServerDetail(absl::InvalidArgumentError("the schema is refused"),
                                    "/opt/deps/xgrammar/cpp/json.cc:12: Check failed");
  EXPECT_EQ(s.message(), "the schema is refused");
  EXPECT_EQ(ServerDetail(s), "/opt/deps/xgrammar/cpp/json.cc:12: Check failed");
  s.SetPayload("type.example/other", absl::Cord("kept"));
  const absl::Status reworded = WithMessage(s, "field: the schema is refused");
  EXPECT_EQ(reworded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reworded.message(), "field: the schema is refused");
  EXPECT_EQ(ServerDetail(reworded), ServerDetail(s));
  EXPECT_EQ(reworded.GetPayload("type.example/other"), absl::Cord("kept"));
  EXPECT_EQ(FullErrorText(reworded),
            "field: the schema is refused [/opt/deps/xgrammar/cpp/json.cc:12: Check failed]");
  // A second detail is added to the first; both are bounded.
  const absl::Status more = WithServerDetail(s, std::string(10000, 'd'));
  EXPECT_THAT(ServerDetail(more), HasSubstr("Check failed; ddd"));
  EXPECT_LE(ServerDetail(more).size(), kMaxServerDetailBytes + 32);
  EXPECT_EQ(ServerDetail(absl::NotFoundError("x")), "");
  EXPECT_EQ(FullErrorText(absl::NotFoundError("x")), "x");
}

TEST(ForClient, KeepsABoundedMessageWithoutDetailAsItIs) {
  const absl::Status s = absl::NotFoundError("model \"x\" is not served");
  const ClientError c = ForClient(s, "rid-1");
  EXPECT_FALSE(c.withheld);
  EXPECT_EQ(c.status, s);
}

TEST(ForClient, DropsTheDetailAndKeepsTheOtherPayloads) {
  absl::Status s = WithServerDetail(absl::UnavailableError("the session store (--session_store): "
                                                           "could not connect"),
                                    "store redis://10.0.0.7:6379/0");
  s.SetPayload("type.example/param", absl::Cord("model"));
  const ClientError c = ForClient(s, "rid-2");
  EXPECT_TRUE(c.withheld);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.status.message(), s.message());
  EXPECT_EQ(ServerDetail(c.status), "");
  EXPECT_EQ(c.status.GetPayload("type.example/param"), absl::Cord("model"));
  // Given its own answer again, nothing more is withheld.
  EXPECT_FALSE(ForClient(c.status, "rid-2").withheld);
}

TEST(ForClient, ServerFailuresGetAFixedMessageNamingTheRequestId) {
  for (const absl::Status& s :
       {absl::InternalError("model m: forward failed: c10::Error at /opt/torch/aten.cpp:12"),
        absl::UnknownError("?"), absl::DataLossError("the session store at redis://h:1/0: bad")}) {
    const ClientError c = ForClient(s, "5f0c10ab");
    EXPECT_TRUE(c.withheld);
    EXPECT_EQ(c.status.code(), s.code());
    EXPECT_EQ(c.status.message(),
              "internal error (request id 5f0c10ab): the server's log has the details");
    EXPECT_FALSE(ForClient(c.status, "5f0c10ab").withheld);
  }
  EXPECT_EQ(ForClient(absl::InternalError("x"), "").status.message(),
            "internal error: the server's log has the details");
}

TEST(ForClient, CutsALongMessageAtAUtf8BoundaryAndSaysWhereTheRestIs) {
  std::string message = "constraint json_schema: ";
  while (message.size() < 5000) message += "\xc3\xa9";  // é
  const ClientError c = ForClient(absl::InvalidArgumentError(message), "rid-3");
  EXPECT_TRUE(c.withheld);
  const std::string shown(c.status.message());
  EXPECT_LE(shown.size(), kMaxClientMessageBytes);
  EXPECT_THAT(shown, HasSubstr("... (5000 bytes; the server's log has all of it under request id "
                               "rid-3)"));
  const std::string kept = shown.substr(0, shown.find("... ("));
  EXPECT_EQ(kept.size() % 2, std::string("constraint json_schema: ").size() % 2);  // whole é's
  EXPECT_FALSE(ForClient(c.status, "rid-3").withheld);
  EXPECT_THAT(std::string(ForClient(absl::InvalidArgumentError(message), "").status.message()),
              Not(HasSubstr("request id")));
}

}  // namespace
}  // namespace tost
