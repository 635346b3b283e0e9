#include "service/server.h"

#include <chrono>
#include <iostream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"
#include "model/torch_threads.h"

namespace tost::service {

absl::Status ValidateServerOptions(const ServerOptions& o) {
  if (o.port < 0 || o.port > 65535) return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", o.port));
  if (o.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes must be >= 1024, got ", o.max_message_bytes));
  }
  if (o.intra_op_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--intra_op_threads must be >= 0, got ", o.intra_op_threads));
  }
  if (o.model_repository.empty()) return absl::InvalidArgumentError("--model_repository must name a directory");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  TOST_RETURN_IF_ERROR(ValidateServerOptions(options));
  model::SetTorchThreads(options.intra_op_threads);
  TOST_ASSIGN_OR_RETURN(std::vector<model::LoadedModel> models, model::LoadRepository(options.model_repository));
  for (const auto& m : models) {
    if (m.status.ok()) {
      std::cerr << "tost_server: loaded model " << m.name << " (" << model::ArchitectureName(m.config.architecture)
                << ", version " << m.config.version << (m.config.trained ? "" : ", untrained") << ")\n";
    } else {
      std::cerr << "tost_server: model " << m.name << " failed to load: " << m.status.message() << "\n";
    }
  }
  std::unique_ptr<Server> server(new Server());
  server->registry_ = std::make_unique<ModelRegistry>(std::move(models));
  server->service_ = std::make_unique<TostService>(*server->registry_, options.limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", options.host, ":", options.port,
                                               " (address in use or not permitted?)"));
  }
  auto* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("tost.v1.Tost", true);
  return server;
}

Server::~Server() {
  if (server_ != nullptr) Shutdown(0);
}

void Server::Shutdown(int grace_ms) {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
  server_.reset();
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace tost::service
