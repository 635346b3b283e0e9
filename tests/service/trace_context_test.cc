// W3C traceparent parsing and the request identity it gives a call
// (service/observability/trace_context.h).
#include "service/observability/trace_context.h"

#include <string>

#include <gtest/gtest.h>

#include "service/observability/logging.h"

namespace tost::service {
namespace {

constexpr char kTrace[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParent[] = "00f067aa0ba902b7";
const std::string kValid = std::string("00-") + kTrace + "-" + kParent + "-01";

TEST(TraceContextTest, ParsesTheRecommendationsExampleAndItsFlags) {
  auto t = ParseTraceParent(kValid);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id, kTrace);
  EXPECT_EQ(t->parent_id, kParent);
  EXPECT_EQ(t->flags, 1);
  t = ParseTraceParent(std::string("00-") + kTrace + "-" + kParent + "-fe");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->flags, 0xfe);
  // Optional whitespace around a header value.
  EXPECT_TRUE(ParseTraceParent(" \t" + kValid + " ").has_value());
  // A later version: the four fields, and whatever follows a '-'.
  EXPECT_TRUE(ParseTraceParent(std::string("01-") + kTrace + "-" + kParent + "-01").has_value());
  EXPECT_TRUE(
      ParseTraceParent(std::string("cc-") + kTrace + "-" + kParent + "-01-what-the-future-says")
          .has_value());
}

TEST(TraceContextTest, RefusesEveryMalformedValue) {
  const std::string trace = kTrace, parent = kParent;
  for (const std::string& bad : {
           std::string(),
           std::string("00"),
           kValid.substr(0, 54),                                 // one character short
           kValid + "-01",                                       // version 00 has no more fields
           "ff-" + trace + "-" + parent + "-01",                 // version ff is invalid
           "0g-" + trace + "-" + parent + "-01",                 // not hex
           "00-" + std::string(32, '0') + "-" + parent + "-01",  // all-zero trace id
           "00-" + trace + "-" + std::string(16, '0') + "-01",   // all-zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + parent + "-01",  // uppercase
           "00-" + trace + "-" + parent + "-0",                      // short flags
           "00_" + trace + "-" + parent + "-01",                     // wrong separator
           "00-" + trace + "_" + parent + "-01",
           "00-" + trace + "-" + parent + "_01",
           "01-" + trace + "-" + parent + "-01x",  // later version, no '-' after
           "00-" + trace.substr(0, 31) + "x-" + parent + "-01",
           "00-" + trace + "-" + parent + "-0\n",
       }) {
    EXPECT_FALSE(ParseTraceParent(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(TraceContextTest, RequestIdKeepsTheClientsIdElseCarriesTheTraceElseIsNew) {
  // A valid x-request-id wins; the trace is still recorded, with a span id of this server's.
  RequestIdentity who = IdentifyRequest("client-42", kValid);
  EXPECT_EQ(who.request_id, "client-42");
  EXPECT_EQ(who.trace_id, kTrace);
  ASSERT_EQ(who.span_id.size(), 16u);
  EXPECT_NE(who.span_id, kParent) << "the server's span is its own, the caller's is its parent";
  EXPECT_NE(who.span_id, std::string(16, '0'));

  // Without one (or with an invalid one), the request id is "<trace id>-<span id>": a valid
  // request id, so that it is echoed and logged like any other, and unique per request.
  who = IdentifyRequest("", kValid);
  EXPECT_EQ(who.request_id, std::string(kTrace) + "-" + who.span_id);
  EXPECT_TRUE(IsValidRequestId(who.request_id)) << who.request_id;
  const RequestIdentity again = IdentifyRequest("bad id with spaces", kValid);
  EXPECT_EQ(again.trace_id, kTrace);
  EXPECT_NE(again.span_id, who.span_id);
  EXPECT_EQ(again.request_id, std::string(kTrace) + "-" + again.span_id);

  // No trace: the ids of before, and no trace fields.
  who = IdentifyRequest("", "garbage");
  EXPECT_TRUE(who.trace_id.empty());
  EXPECT_TRUE(who.span_id.empty());
  EXPECT_EQ(who.request_id.size(), 16u);
  EXPECT_TRUE(IsValidRequestId(who.request_id));
  EXPECT_EQ(IdentifyRequest("abc", "").request_id, "abc");
}

}  // namespace
}  // namespace tost::service
