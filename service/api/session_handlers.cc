// tost.v1 session RPCs: create, fork, export, import and close server-held generation sessions.
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/api/generation_request.h"
#include "service/api/grpc_status.h"
#include "service/api/tost_service.h"

namespace tost::service {

grpc::Status TostService::CreateSession(grpc::ServerContextBase* context,
                                        const tost::v1::CreateSessionRequest* request,
                                        tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, auth_.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationScheduler * scheduler, engine_.Scheduler(request->model()));
    GenerationState state = scheduler->NewState(SamplingFromProto(request->sampling()));
    TOST_RETURN_IF_ERROR(ApplyStop(request->stop(), state));
    TOST_RETURN_IF_ERROR(scheduler->CheckState(state));
    TOST_ASSIGN_OR_RETURN(std::string id, engine_.sessions().Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ForkSession(grpc::ServerContextBase* context,
                                      const tost::v1::SessionRef* request,
                                      tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, auth_.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationState state,
                          engine_.sessions().Get(request->session_id(), owner));
    TOST_ASSIGN_OR_RETURN(std::string id, engine_.sessions().Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ExportSession(grpc::ServerContextBase* context,
                                        const tost::v1::SessionRef* request,
                                        tost::v1::ExportSessionResponse* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, auth_.Identify(*context));
    TOST_ASSIGN_OR_RETURN(GenerationState state,
                          engine_.sessions().Get(request->session_id(), owner));
    TOST_ASSIGN_OR_RETURN(ModelIdentity identity, engine_.Identity(state.model));
    response->set_state(engine_.codec().Encode(state, identity, owner));
    FillSessionInfo(request->session_id(), state, response->mutable_session());
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::ImportSession(grpc::ServerContextBase* context,
                                        const tost::v1::ImportSessionRequest* request,
                                        tost::v1::SessionInfo* response) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, auth_.Identify(*context));
    TOST_ASSIGN_OR_RETURN(OpenedBlob blob, engine_.codec().Open(request->state()));
    TOST_ASSIGN_OR_RETURN(ModelIdentity identity, engine_.Identity(blob.model()));
    TOST_ASSIGN_OR_RETURN(GenerationState state, engine_.codec().Decode(blob, identity, owner));
    TOST_ASSIGN_OR_RETURN(std::string id, engine_.sessions().Add(owner, state));
    FillSessionInfo(id, state, response);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TostService::CloseSession(grpc::ServerContextBase* context,
                                       const tost::v1::SessionRef* request,
                                       tost::v1::CloseSessionResponse*) {
  auto run = [&]() -> absl::Status {
    TOST_ASSIGN_OR_RETURN(const std::string owner, auth_.Identify(*context));
    return engine_.sessions().Close(request->session_id(), owner);
  };
  return ToGrpcStatus(run());
}

}  // namespace tost::service
