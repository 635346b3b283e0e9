#include "service/api/raw_service.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace tost::service {
namespace {

[[noreturn]] void Fatal(const std::string& what) {
  std::fprintf(stderr, "tost-serve: %s\n", what.c_str());
  std::abort();
}

}  // namespace

RawService::RawService(const std::string& service_full_name, int64_t max_request_bytes)
    : service_(
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_full_name)),
      max_request_bytes_(max_request_bytes),
      // "rpc:Tost", "rpc:GRPCInferenceService" (cut to 15 bytes): the service's last name.
      handlers_(absl::StrCat("rpc:", service_full_name.substr(service_full_name.rfind('.') + 1)),
                kMaxHandlerThreads, kMaxQueuedHandlerCalls) {
  if (service_ == nullptr) {
    Fatal(absl::StrCat("the proto service ", service_full_name, " is not linked in"));
  }
}

grpc::Status RawService::PoolFull(const char* path) {
  return ToGrpcStatus(absl::ResourceExhaustedError(
      absl::StrCat(path, ": ", kMaxHandlerThreads, " calls are running and ",
                   kMaxQueuedHandlerCalls, " more are waiting for a thread; retry later")));
}

const char* RawService::Register(const std::string& method,
                                 const google::protobuf::Descriptor& request,
                                 const google::protobuf::Descriptor& response, bool streaming) {
  const google::protobuf::MethodDescriptor* m = service_->FindMethodByName(method);
  if (m == nullptr || m->input_type() != &request || m->output_type() != &response ||
      m->client_streaming() || m->server_streaming() != streaming) {
    Fatal(absl::StrCat("the handler of ", service_->full_name(), ".", method, " (",
                       request.full_name(), " -> ", streaming ? "stream " : "",
                       response.full_name(), ") does not match the proto service"));
  }
  paths_.push_back(absl::StrCat("/", service_->full_name(), "/", m->name()));
  return paths_.back().c_str();
}

}  // namespace tost::service
