#include "service/loading_responder.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tost::service {

// Every method the responder does not implement itself (all of tost.v1.Tost and of the KServe
// service) ends at once with UNAVAILABLE: the code clients retry on.
class LoadingResponder::UnavailableWhileLoading final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(const std::string& method) {
        Finish(
            grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat(method,
                                      ": tost_server is still loading and warming up its models; "
                                      "retry when grpc.health.v1 reports SERVING")));
      }
      void OnDone() override { delete this; }
    };
    return new Reactor(context->method());
  }
};

LoadingResponder::LoadingResponder() = default;

LoadingResponder::~LoadingResponder() { Stop(); }

absl::StatusOr<std::unique_ptr<LoadingResponder>> LoadingResponder::Start(
    const std::string& host, int port, std::shared_ptr<grpc::ServerCredentials> credentials) {
  std::unique_ptr<LoadingResponder> r(new LoadingResponder());
  r->generic_ = std::make_unique<UnavailableWhileLoading>();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", port), std::move(credentials), &r->port_);
  builder.RegisterCallbackGenericService(r->generic_.get());
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr || r->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", host, ":", port,
                                               " (address in use or not permitted?)"));
  }
  auto* health = r->server_->GetHealthCheckService();
  health->SetServingStatus(false);
  for (const char* service : kHealthCheckedServices) {
    health->SetServingStatus(service, false);
  }
  return r;
}

void LoadingResponder::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

}  // namespace tost::service
