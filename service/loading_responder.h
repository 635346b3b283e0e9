// What answers on the server's port while the models load: grpc.health.v1 reports
// NOT_SERVING while loading (or draining). Loading and warming up a repository takes seconds to
// minutes; without this the port would stay closed until then, and a probe could not tell "still
// loading" from "dead".
//
// The responder is a small gRPC server of its own: its health service reports NOT_SERVING for ""
// and for every service tost_server registers, and any other method gets UNAVAILABLE with a
// message saying why and when to retry. The real server binds the same port while the responder
// still listens (gRPC listens with SO_REUSEPORT), and only then is the responder stopped, so a
// client never meets a closed port between the two.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/statusor.h"

namespace tost::service {

// The services whose health tost_server reports by name (besides "", the whole server): the
// responder reports them NOT_SERVING, the real server SERVING.
inline constexpr const char* kHealthCheckedServices[] = {"tost.v1.Tost",
                                                         "inference.GRPCInferenceService"};

class LoadingResponder {
 public:
  // Listens on host:port (0: a free port, see port()) with `credentials`.
  static absl::StatusOr<std::unique_ptr<LoadingResponder>> Start(
      const std::string& host, int port, std::shared_ptr<grpc::ServerCredentials> credentials);
  ~LoadingResponder();

  int port() const { return port_; }
  // Stops listening and waits for the calls in flight (they are all immediate). Idempotent.
  void Stop();

 private:
  class UnavailableWhileLoading;
  LoadingResponder();

  std::unique_ptr<UnavailableWhileLoading> generic_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tost::service
