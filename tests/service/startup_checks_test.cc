// The start-up checks of tost_server's flags and ports (service/flag_ranges.h, port_probe.h), and
// the listeners' addresses and key options (service/server.h).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "service/flag_ranges.h"
#include "service/port_probe.h"
#include "service/server.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;

TEST(FlagRanges, InRangeValuesPass) {
  const FlagRange ranges[] = {{"a", 0, 0, 10}, {"b", 10, 0, 10}, {"c", -1, -1, 5, "-1 = off"}};
  EXPECT_TRUE(CheckFlagRanges(ranges).ok());
}

TEST(FlagRanges, EveryFlagOutOfRangeIsNamedAsTypedWithItsRange) {
  const FlagRange ranges[] = {{"max_new_tokens", -1, 1, 100},
                              {"port", 8500, 0, 65535},
                              {"stream_stall_timeout_ms", -5, 0, 1000, "0 = never"}};
  const absl::Status s = CheckFlagRanges(ranges);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--max_new_tokens=-1: expected an integer in [1, 100]"));
  EXPECT_THAT(
      s.message(),
      HasSubstr("--stream_stall_timeout_ms=-5: expected an integer in [0, 1000] (0 = never)"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("--port")));
}

TEST(RenamedFlag, TheCurrentNameWinsWhenTheOldOneIsAbsent) {
  const auto r = ResolveRenamedFlag({"new_name", 4, true, "old_name", 8, false});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 4);
  EXPECT_EQ(r->warning, "");
  const auto defaults = ResolveRenamedFlag({"new_name", 8, false, "old_name", 8, false});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->warning, "");
}

TEST(RenamedFlag, TheOldNameAloneIsTakenWithAWarningNamingTheNewOne) {
  const auto r = ResolveRenamedFlag({"new_name", 8, false, "old_name", 3, true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, 3);
  EXPECT_THAT(r->warning, HasSubstr("--old_name is deprecated"));
  EXPECT_THAT(r->warning, HasSubstr("write --new_name=3 instead"));
}

TEST(RenamedFlag, BothNamesAgreeingIsAcceptedAndDisagreeingStopsTheStart) {
  const auto same = ResolveRenamedFlag({"new_name", 3, true, "old_name", 3, true});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->value, 3);
  const auto differ = ResolveRenamedFlag({"new_name", 4, true, "old_name", 3, true});
  EXPECT_EQ(differ.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(differ.status().message(), HasSubstr("--old_name=3 and --new_name=4 disagree"));
  EXPECT_THAT(differ.status().message(), HasSubstr("give only --new_name"));
}

// A listener like gRPC's (SO_REUSEPORT) on a loopback port; returns its port, or 0.
int ListenWithReusePort(int& fd) {
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 4) != 0)
    return 0;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

TEST(PortProbe, APortAnotherServerListensOnIsInUseEvenWithReusePort) {
  int fd = -1;
  const int port = ListenWithReusePort(fd);
  ASSERT_GT(port, 0);
  const absl::Status busy = CheckPortFree("127.0.0.1", port, "--port");
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(busy.message(), HasSubstr("port in use"));
  EXPECT_THAT(busy.message(), HasSubstr("--port="));
  // The wildcard address overlaps the loopback listener too.
  EXPECT_EQ(CheckPortFree("0.0.0.0", port, "--port").code(), absl::StatusCode::kFailedPrecondition);
  close(fd);
  EXPECT_TRUE(CheckPortFree("127.0.0.1", port, "--port").ok());
}

TEST(PortProbe, PortZeroAndBracketedAddressesAreAccepted) {
  EXPECT_TRUE(CheckPortFree("127.0.0.1", 0, "--port").ok());
  int fd = -1;
  const int port = ListenWithReusePort(fd);
  ASSERT_GT(port, 0);
  close(fd);
  // A free port on IPv6 loopback, if this host has IPv6; an unresolvable name is an error.
  const absl::Status v6 = CheckPortFree("[::1]", port, "--port");
  EXPECT_TRUE(v6.ok() || v6.code() == absl::StatusCode::kInvalidArgument) << v6;
  EXPECT_EQ(CheckPortFree("no-such-host.invalid", port, "--port").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ListenerAddresses, HostIsEveryListenersAddressUnlessItsOwnIsSet) {
  ServerOptions o;
  o.host = "127.0.0.1";
  ServerOptions resolved = ResolveListenerAddresses(o);
  EXPECT_EQ(resolved.http_address, "127.0.0.1");
  EXPECT_EQ(resolved.metrics.address, "127.0.0.1");
  o.http_address = "0.0.0.0";
  resolved = ResolveListenerAddresses(o);
  EXPECT_EQ(resolved.http_address, "0.0.0.0");
  EXPECT_EQ(resolved.metrics.address, "127.0.0.1");
  o.metrics.address = "::1";
  EXPECT_EQ(ResolveListenerAddresses(o).metrics.address, "::1");
  // The defaults keep what the server always did: every listener on 0.0.0.0.
  const ServerOptions defaults = ResolveListenerAddresses(ServerOptions{});
  EXPECT_EQ(defaults.http_address, "0.0.0.0");
  EXPECT_EQ(defaults.metrics.address, "0.0.0.0");
}

TEST(ListenerAddresses, AnEmptyHostAndKeylessMetricsKeysAreRefusedNamingTheFlag) {
  ServerOptions o;
  EXPECT_TRUE(ValidateServerOptions(o).ok()) << ValidateServerOptions(o);
  o.host = "";
  EXPECT_THAT(ValidateServerOptions(o).message(), HasSubstr("--host must name an address"));
  o.host = "127.0.0.1";
  o.metrics.require_api_key = true;
  const absl::Status keyless = ValidateServerOptions(o);
  EXPECT_EQ(keyless.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(keyless.message(), HasSubstr("--metrics_require_api_key needs --api_keys_file"));
  o.api_keys_file = "/etc/tost/keys";
  EXPECT_TRUE(ValidateServerOptions(o).ok()) << ValidateServerOptions(o);
}

}  // namespace
}  // namespace tost::service
