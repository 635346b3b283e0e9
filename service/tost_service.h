// tost.v1.Tost handlers: request validation against the service limits, model calls, replies.
// Classification and model RPCs live in tost_service.cc; Generate and the session RPCs in
// generation_handlers.cc.
#pragma once

#include <cstdint>

#include "service/image_decode.h"
#include "service/serving_core.h"
#include "tost/v1/tost.grpc.pb.h"

namespace tost::service {

struct ServiceLimits {
  int64_t max_batch_size = 8;                // images per Classify request (<= images per batch)
  int64_t max_tensor_elements = 64LL << 20;  // floats per Classify tensor
  int64_t max_prompt_bytes = 1 << 20;        // bytes (or token ids) per Generate prompt
  int32_t max_new_tokens = 4096;             // ceiling on GenerateRequest.max_new_tokens
  int32_t default_max_new_tokens = 64;       // when the request leaves it at 0
  int32_t default_top_k_labels = 5;          // when ClassifyRequest.top_k is 0
  ImageLimits image;                         // encoded images: Classify.images, KServe BYTES
};

class TostService final : public tost::v1::Tost::Service {
 public:
  TostService(ServingCore& core, ServiceLimits limits)
      : core_(core), registry_(core.registry), limits_(limits) {}

  grpc::Status Classify(grpc::ServerContext* context, const tost::v1::ClassifyRequest* request,
                        tost::v1::ClassifyResponse* response) override;
  grpc::Status Generate(grpc::ServerContext* context, const tost::v1::GenerateRequest* request,
                        grpc::ServerWriter<tost::v1::GenerateResponse>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const tost::v1::ListModelsRequest* request,
                          tost::v1::ListModelsResponse* response) override;
  grpc::Status ModelInfo(grpc::ServerContext* context, const tost::v1::ModelInfoRequest* request,
                         tost::v1::ModelStatus* response) override;
  grpc::Status ServerStatus(grpc::ServerContext* context,
                            const tost::v1::ServerStatusRequest* request,
                            tost::v1::ServerStatusResponse* response) override;
  grpc::Status CreateSession(grpc::ServerContext* context,
                             const tost::v1::CreateSessionRequest* request,
                             tost::v1::SessionInfo* response) override;
  grpc::Status ForkSession(grpc::ServerContext* context, const tost::v1::SessionRef* request,
                           tost::v1::SessionInfo* response) override;
  grpc::Status ExportSession(grpc::ServerContext* context, const tost::v1::SessionRef* request,
                             tost::v1::ExportSessionResponse* response) override;
  grpc::Status ImportSession(grpc::ServerContext* context,
                             const tost::v1::ImportSessionRequest* request,
                             tost::v1::SessionInfo* response) override;
  grpc::Status CloseSession(grpc::ServerContext* context, const tost::v1::SessionRef* request,
                            tost::v1::CloseSessionResponse* response) override;

 private:
  ServingCore& core_;
  const ModelRegistry& registry_;
  const ServiceLimits limits_;
};

}  // namespace tost::service
