// tost.v1.Tost handlers: request validation against the service limits, model calls, replies.
// v0 runs each request on its gRPC thread; the batcher and the generation scheduler replace the
// direct model calls without changing the validation here.
#pragma once

#include <cstdint>

#include "tost/v1/tost.grpc.pb.h"
#include "service/model_registry.h"

namespace tost::service {

struct ServiceLimits {
  int64_t max_batch_size = 64;                   // images per Classify request
  int64_t max_tensor_elements = 64LL << 20;      // floats per Classify tensor
  int64_t max_prompt_bytes = 1 << 20;            // bytes (or token ids) per Generate prompt
  int32_t max_new_tokens = 4096;                 // ceiling on GenerateRequest.max_new_tokens
  int32_t default_max_new_tokens = 64;           // when the request leaves it at 0
  int32_t default_top_k_labels = 5;              // when ClassifyRequest.top_k is 0
};

class TostService final : public tost::v1::Tost::Service {
 public:
  TostService(const ModelRegistry& registry, ServiceLimits limits) : registry_(registry), limits_(limits) {}

  grpc::Status Classify(grpc::ServerContext* context, const tost::v1::ClassifyRequest* request,
                        tost::v1::ClassifyResponse* response) override;
  grpc::Status Generate(grpc::ServerContext* context, const tost::v1::GenerateRequest* request,
                        grpc::ServerWriter<tost::v1::GenerateResponse>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const tost::v1::ListModelsRequest* request,
                          tost::v1::ListModelsResponse* response) override;

 private:
  const ModelRegistry& registry_;
  const ServiceLimits limits_;
};

}  // namespace tost::service
