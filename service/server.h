// Owns the gRPC server: loads the model repository, registers tost.v1, grpc.health.v1 and server
// reflection, binds the port (0 picks a free one) and shuts down.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "service/model_registry.h"
#include "service/tost_service.h"

namespace tost::service {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8500;                           // 0: the kernel picks a free port (tests)
  std::string model_repository = "models";
  int max_message_bytes = 64 << 20;          // receive and send limit per message
  int keepalive_time_ms = 30'000;            // server pings idle connections this often
  int keepalive_timeout_ms = 10'000;         // and drops them if no ack arrives in time
  int intra_op_threads = 0;                  // LibTorch threads; 0 = one per core
  ServiceLimits limits;
};

absl::Status ValidateServerOptions(const ServerOptions& options);

class Server {
 public:
  // Loads the repository and starts serving. Models that fail to load are reported (ListModels,
  // logs) while the others serve; a repository that cannot be read is an error.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  int port() const { return port_; }
  const ModelRegistry& registry() const { return *registry_; }

  // Stops accepting calls, lets in-flight calls finish for up to `grace_ms`, then cancels them.
  void Shutdown(int grace_ms);
  void Wait();

 private:
  Server() = default;

  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<TostService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tost::service
