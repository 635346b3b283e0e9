#include "service/store/redis_url.h"

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tost::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kForm[] = "redis://[[user]:password@]host[:port][/db]";

RedisEndpoint Parsed(const std::string& url) {
  absl::StatusOr<RedisEndpoint> e = ParseRedisUrl(url);
  EXPECT_TRUE(e.ok()) << url << ": " << e.status();
  return e.ok() ? *e : RedisEndpoint{};
}

TEST(RedisUrlTest, HostAlone) {
  RedisEndpoint e = Parsed("redis://localhost");
  EXPECT_EQ(e.host, "localhost");
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "");
  EXPECT_EQ(e.Redacted(), "redis://localhost:6379/0");
}

TEST(RedisUrlTest, HostPortDb) {
  RedisEndpoint e = Parsed("redis://10.1.2.3:6380/2");
  EXPECT_EQ(e.host, "10.1.2.3");
  EXPECT_EQ(e.port, 6380);
  EXPECT_EQ(e.db, 2);
  EXPECT_EQ(e.Redacted(), "redis://10.1.2.3:6380/2");
}

TEST(RedisUrlTest, TrailingSlashIsDbZero) {
  EXPECT_EQ(Parsed("redis://store.internal:1/").db, 0);
  EXPECT_EQ(Parsed("redis://store.internal:65535").port, 65535);
  EXPECT_EQ(Parsed("redis://store_1.internal-2/15").db, 15);
}

TEST(RedisUrlTest, SchemeIsCaseInsensitive) { EXPECT_EQ(Parsed("REDIS://h").host, "h"); }

TEST(RedisUrlTest, PasswordOfTheDefaultUser) {
  RedisEndpoint e = Parsed("redis://:s3cret@cache:7000/3");
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "s3cret");
  EXPECT_EQ(e.host, "cache");
  EXPECT_EQ(e.port, 7000);
  EXPECT_EQ(e.db, 3);
  EXPECT_EQ(e.Redacted(), "redis://:***@cache:7000/3");
}

TEST(RedisUrlTest, AclUserAndPassword) {
  RedisEndpoint e = Parsed("redis://alice:s3cret@cache");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, "s3cret");
  EXPECT_EQ(e.Redacted(), "redis://alice:***@cache:6379/0");
  EXPECT_EQ(e.Address(), "redis://cache:6379/0");
}

TEST(RedisUrlTest, PercentDecodesUserAndPassword) {
  RedisEndpoint e = Parsed("redis://al%40ice%3a:p%3Ass%2Fw%25rd%20%2b+@cache");
  EXPECT_EQ(e.user, "al@ice:");
  EXPECT_EQ(e.password, "p:ss/w%rd ++");
  // The user is encoded again so that the redacted form parses back to the same user.
  EXPECT_EQ(e.Redacted(), "redis://al%40ice%3A:***@cache:6379/0");
}

TEST(RedisUrlTest, UnencodedAtAndSlashInThePasswordBelongToIt) {
  // The credentials end at the last '@', so a password that was not percent-encoded still parses
  // (and never ends up in the host or the database where a message would print it).
  RedisEndpoint e = Parsed("redis://:p@ss/w:rd@cache:6380/1");
  EXPECT_EQ(e.password, "p@ss/w:rd");
  EXPECT_EQ(e.host, "cache");
  EXPECT_EQ(e.port, 6380);
  EXPECT_EQ(e.db, 1);
}

TEST(RedisUrlTest, Ipv6InBrackets) {
  RedisEndpoint e = Parsed("redis://[::1]:6390/4");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 6390);
  EXPECT_EQ(e.db, 4);
  EXPECT_EQ(e.Redacted(), "redis://[::1]:6390/4");
  EXPECT_EQ(Parsed("redis://[fe80::1:2]").port, 6379);
  RedisEndpoint with_password = Parsed("redis://:pw@[2001:db8::7]/1");
  EXPECT_EQ(with_password.host, "2001:db8::7");
  EXPECT_EQ(with_password.Redacted(), "redis://:***@[2001:db8::7]:6379/1");
  EXPECT_EQ(with_password.Address(), "redis://[2001:db8::7]:6379/1");
}

TEST(RedisUrlTest, RedactedNeverPrintsThePassword) {
  RedisEndpoint e;
  e.host = "h";
  e.user = "bob";
  e.password = "hunter2";
  EXPECT_EQ(e.Redacted(), "redis://bob:***@h:6379/0");
  e.user = "";
  EXPECT_EQ(e.Redacted(), "redis://:***@h:6379/0");
}

struct Refusal {
  std::string url;
  std::string why;    // a part of the message that says what was wrong
  std::string shown;  // how the message shows the value received
};

void PrintTo(const Refusal& r, std::ostream* os) { *os << "'" << r.url << "'"; }

// "7_redis___host_0": the case's index and its URL, for ctest's and gtest's test names.
std::string RefusalName(const ::testing::TestParamInfo<Refusal>& info) {
  std::string name = std::to_string(info.index) + "_";
  for (char c : info.param.url.substr(0, 40)) {
    name.push_back(absl::ascii_isalnum(static_cast<unsigned char>(c)) ? c : '_');
  }
  return name;
}

class RedisUrlRefusalTest : public ::testing::TestWithParam<Refusal> {};

// Every refusal: INVALID_ARGUMENT naming the flag, the form expected and the value received with
// its credentials redacted; "secret" (the password of every case that has one) never appears.
TEST_P(RedisUrlRefusalTest, SaysWhatWasExpectedAndReceived) {
  const Refusal& r = GetParam();
  absl::StatusOr<RedisEndpoint> e = ParseRedisUrl(r.url);
  ASSERT_FALSE(e.ok()) << r.url << " parsed as " << e->Redacted();
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), AllOf(HasSubstr("--session_store"), HasSubstr(kForm),
                                          HasSubstr("got '" + r.shown + "'"), HasSubstr(r.why),
                                          Not(HasSubstr("secret"))));
}

INSTANTIATE_TEST_SUITE_P(
    RedisUrl, RedisUrlRefusalTest,
    ::testing::Values(
        Refusal{"", "an empty value", ""}, Refusal{"localhost:6379", "no scheme", "localhost:6379"},
        Refusal{":secret@localhost", "no scheme", "***@localhost"},
        Refusal{"http://host", "scheme 'http' is not supported", "http://host"},
        Refusal{"unix:///run/redis.sock", "scheme 'unix' is not supported",
                "unix:///run/redis.sock"},
        Refusal{"redis://", "no host", "redis://"},
        Refusal{"redis://:secret@", "no host", "redis://***@"},
        Refusal{"redis://:6379", "no host", "redis://:6379"},
        Refusal{"redis://:secret", "no host", "redis://:***"},
        Refusal{"redis://user:secret", "the port is not a number", "redis://user:***"},
        Refusal{"redis://host:0", "port 0 is out of range 1..65535", "redis://host:0"},
        Refusal{"redis://host:65536", "port 65536 is out of range", "redis://host:65536"},
        Refusal{"redis://host:99999999999", "out of range 1..65535", "redis://host:99999999999"},
        Refusal{"redis://host:", "nothing after ':'", "redis://host:"},
        Refusal{"redis://host:-1", "the port is not a number", "redis://host:***"},
        Refusal{"redis://secret@host", "need a ':' before the password", "redis://***@host"},
        Refusal{"redis://user:@host", "the password after ':' is empty", "redis://***@host"},
        Refusal{"redis://:@host", "the password after ':' is empty", "redis://***@host"},
        Refusal{"redis://:secret%zz@host", "the password has a malformed percent-escape",
                "redis://***@host"},
        Refusal{"redis://:secret%4@host", "the password has a malformed percent-escape",
                "redis://***@host"},
        Refusal{"redis://us%er:secret@host", "the user name has a malformed percent-escape",
                "redis://***@host"},
        Refusal{"redis://host/abc", "the database 'abc' after '/' is not a non-negative integer",
                "redis://host/abc"},
        Refusal{"redis://host/-1", "not a non-negative integer", "redis://host/-1"},
        Refusal{"redis://host/1/2", "not a non-negative integer", "redis://host/1/2"},
        Refusal{"redis://host/99999999999", "not a non-negative integer",
                "redis://host/99999999999"},
        Refusal{"redis://:secret@host/+1", "not a non-negative integer", "redis://***@host/+1"},
        Refusal{"redis://host?db=1", "query parameters and fragments", "redis://host?db=1"},
        Refusal{"redis://:secret@host#x", "query parameters and fragments", "redis://***@host#x"},
        Refusal{"redis://[::1", "no closing ']'", "redis://[::1"},
        Refusal{"redis://[zz]:1", "'zz' in brackets is not an IPv6 address", "redis://[zz]:1"},
        Refusal{"redis://[]", "in brackets is not an IPv6 address", "redis://[]"},
        Refusal{"redis://[::1]x", "expected ':port' or '/db' after ']'", "redis://[::1]x"},
        Refusal{"redis://::1:6379", "must be written in brackets", "redis://::1:6379"},
        Refusal{"redis://ho st", "characters a host name cannot have", "redis://ho st"},
        Refusal{"redis://:secret@ho$t", "characters a host name cannot have", "redis://***@ho$t"}),
    RefusalName);

TEST(RedisUrlTest, TlsIsRefusedWithTheWayAround) {
  absl::StatusOr<RedisEndpoint> e = ParseRedisUrl("rediss://alice:secret@store:6380/1");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(),
              AllOf(HasSubstr("--session_store"), HasSubstr("got 'rediss://***@store:6380/1'"),
                    HasSubstr("TLS"), HasSubstr("not supported"), HasSubstr("hiredis 0.14"),
                    HasSubstr("stunnel"), HasSubstr("private network"), Not(HasSubstr("secret")),
                    Not(HasSubstr("alice"))));
}

TEST(RedisUrlTest, LongValuesAreShortenedInMessages) {
  std::string url = "redis://host/" + std::string(1000, 'x');
  absl::StatusOr<RedisEndpoint> e = ParseRedisUrl(url);
  ASSERT_FALSE(e.ok());
  EXPECT_LT(e.status().message().size(), 600u) << e.status();
}

}  // namespace
}  // namespace tost::store
