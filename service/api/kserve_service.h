// KServe v2 / Open Inference Protocol gRPC handlers (inference.GRPCInferenceService subset:
// ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelInfer), so Triton and
// KServe clients classify with tost-serve unchanged.
//
// A vision model is described as
//   inputs  "image"        FP32  [-1, C, H, W]  preprocessed pixels (as tost.v1 Classify.tensor)
//           "image_bytes"  BYTES [-1]           encoded PNG/JPEG images ([-1, 1] accepted too),
//                                               decoded and preprocessed as the model config says
//   output  "probabilities" FP32 [-1, num_classes]  softmax over the classes
// A request carries exactly one of the two inputs, as raw_input_contents (BYTES elements each a
// 4-byte little-endian length and then the bytes) or in InferTensorContents. Outputs come back in
// raw_output_contents. The classification extension: a requested output parameter
// "classification" = N (int64) returns BYTES [batch, min(N, num_classes)] strings
// "<probability>:<index>:<label>", highest first, formatted as Triton does (std::to_string of the
// float value, i.e. six decimals).
//
// With API keys configured (service/api/auth.h), every method needs one (tritonclient:
// headers={"x-api-key": ...}), ServerLive and ServerReady included: a keyless probe asks
// grpc.health.v1, which is what the kubelet's gRPC probe calls, and an open ServerMetadata would
// tell anyone the server's name and version.
//
// Codes: unknown model or version NOT_FOUND; a model that failed to load FAILED_PRECONDITION with
// its load error (ModelReady answers ready=false and sends the error as trailing metadata
// "tost-load-error"); a language model UNIMPLEMENTED, pointing to tost.v1.Tost/Generate; any
// malformed field INVALID_ARGUMENT naming it, a request protobuf refuses (invalid UTF-8 in a string
// field, a malformed encoding) included: every method receives its request as bytes (RawService).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kserve/v2/grpc_service.pb.h"
#include "service/api/auth.h"
#include "service/api/raw_service.h"
#include "service/api/request_input.h"
#include "service/engine/engine.h"

namespace tost::service {

inline constexpr char kKServeImageInput[] = "image";
inline constexpr char kKServeImageBytesInput[] = "image_bytes";
inline constexpr char kKServeProbabilitiesOutput[] = "probabilities";

class KServeService final : public RawService {
 public:
  // While the engine drains, ServerReady and ModelReady answer false; classification runs through
  // the engine's per-model dynamic batcher. `auth` checks the caller of every RPC; null when no
  // API keys are configured. `engine` and `auth` are not owned and must outlive the service.
  KServeService(const Engine& engine, const Authenticator* auth, ServiceLimits limits);

  grpc::Status ServerLive(grpc::ServerContextBase* context,
                          const inference::ServerLiveRequest* request,
                          inference::ServerLiveResponse* response);
  grpc::Status ServerReady(grpc::ServerContextBase* context,
                           const inference::ServerReadyRequest* request,
                           inference::ServerReadyResponse* response);
  grpc::Status ModelReady(grpc::ServerContextBase* context,
                          const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response);
  grpc::Status ServerMetadata(grpc::ServerContextBase* context,
                              const inference::ServerMetadataRequest* request,
                              inference::ServerMetadataResponse* response);
  grpc::Status ModelMetadata(grpc::ServerContextBase* context,
                             const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response);
  grpc::Status ModelInfer(grpc::ServerContextBase* context,
                          const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response);

 private:
  absl::Status Authenticate(const grpc::ServerContextBase& context) const;
  absl::Status Infer(const inference::ModelInferRequest& request, absl::Time deadline,
                     inference::ModelInferResponse& response) const;

  const Engine& engine_;
  const Authenticator* auth_;
  const ServiceLimits limits_;
};

}  // namespace tost::service
