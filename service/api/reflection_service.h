// grpc.reflection.v1alpha.ServerReflection: what grpcurl, grpc_cli and Postman list the server's
// services and describe its messages with, behind the same API keys as every other RPC.
//
// Why not gRPC's reflection plugin (grpc++_reflection): it serves anyone, so with --api_keys_file
// a caller without a key could still list every service and fetch every message definition, and in
// gRPC 1.51 neither a server interceptor nor the plugin's API can refuse its calls. This service
// answers as the plugin does (the descriptors linked into the binary; the file asked for with those
// of its dependencies not yet sent on the stream; NOT_FOUND or UNIMPLEMENTED as an error_response
// in the stream), checks the caller (Authenticator::Identify) before reading any request, and
// receives its requests as bytes (RawService's ParseRequest: a compressed request is inflated
// within
// --max_message_bytes, a malformed one refused INVALID_ARGUMENT naming the field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "service/api/auth.h"

namespace tost::service {

class ReflectionService final : public grpc::reflection::v1alpha::ServerReflection::
                                    WithRawCallbackMethod_ServerReflectionInfo<
                                        grpc::reflection::v1alpha::ServerReflection::Service> {
 public:
  // `services`: the full names list_services answers (every service the server registers, this
  // one included). `auth` is not owned and must outlive the service; without API keys it admits
  // everyone. `max_request_bytes`: the most a compressed request may inflate to.
  ReflectionService(std::vector<std::string> services, const Authenticator& auth,
                    int64_t max_request_bytes);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override;

 private:
  class Reactor;

  const std::vector<std::string> services_;
  const Authenticator& auth_;
  const int64_t max_request_bytes_;
};

}  // namespace tost::service
