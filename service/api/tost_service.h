// tost.v1.Tost over the engine. Classification and the model and server RPCs live in
// tost_service.cc, the session RPCs in session_handlers.cc, and Generate, which streams, in
// generate_reactor.cc on gRPC's callback API: no thread is held per stream, cancellation arrives
// through OnCancel, and at most one write is in flight per stream, so a client that stops reading
// pauses its own generation (the scheduler's flow control) instead of growing a server buffer.
//
// Every method receives its request as bytes (RawService): a request protobuf refuses is answered
// INVALID_ARGUMENT naming the field, before the typed handlers below run.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/device/device_memory.h"
#include "service/api/auth.h"
#include "service/api/raw_service.h"
#include "service/api/request_input.h"
#include "service/engine/engine.h"
#include "tost/v1/tost.pb.h"

namespace tost::service {

class TostService final : public RawService {
 public:
  // The CUDA devices' memory for ServerStatus (the server passes model::CudaDeviceMemory; the
  // API layer links no LibTorch).
  using DeviceMemoryProbe = std::function<std::vector<model::DeviceMemoryStats>()>;

  // `engine`, `auth` and `admission`'s pools are not owned and must outlive the service. Generate
  // admits its calls on `admission` (generate_reactor.cc says why not on gRPC's threads), and the
  // session RPCs, which wait on the session store, run on its store pool (handler_pool.h). An
  // empty probe reports no devices.
  TostService(Engine& engine, const Authenticator& auth, ServiceLimits limits,
              AdmissionPools admission, DeviceMemoryProbe device_memory = {});

  grpc::Status Classify(grpc::ServerContextBase* context, const tost::v1::ClassifyRequest* request,
                        tost::v1::ClassifyResponse* response);
  // Parses the request itself (generate_reactor.cc).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer& request);
  grpc::Status ListModels(grpc::ServerContextBase* context,
                          const tost::v1::ListModelsRequest* request,
                          tost::v1::ListModelsResponse* response);
  grpc::Status ModelInfo(grpc::ServerContextBase* context,
                         const tost::v1::ModelInfoRequest* request,
                         tost::v1::ModelStatus* response);
  grpc::Status ServerStatus(grpc::ServerContextBase* context,
                            const tost::v1::ServerStatusRequest* request,
                            tost::v1::ServerStatusResponse* response);
  grpc::Status CreateSession(grpc::ServerContextBase* context,
                             const tost::v1::CreateSessionRequest* request,
                             tost::v1::SessionInfo* response);
  grpc::Status ForkSession(grpc::ServerContextBase* context, const tost::v1::SessionRef* request,
                           tost::v1::SessionInfo* response);
  grpc::Status ExportSession(grpc::ServerContextBase* context, const tost::v1::SessionRef* request,
                             tost::v1::ExportSessionResponse* response);
  grpc::Status ImportSession(grpc::ServerContextBase* context,
                             const tost::v1::ImportSessionRequest* request,
                             tost::v1::SessionInfo* response);
  grpc::Status CloseSession(grpc::ServerContextBase* context, const tost::v1::SessionRef* request,
                            tost::v1::CloseSessionResponse* response);

 private:
  Engine& engine_;
  const Authenticator& auth_;
  const ServiceLimits limits_;
  const AdmissionPools admission_;
  const DeviceMemoryProbe device_memory_;
};

}  // namespace tost::service
