#include "service/api/reflection_service.h"

#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "service/api/grpc_status.h"
#include "service/api/raw_request.h"

namespace tost::service {
namespace {

using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

void SetError(grpc::StatusCode code, std::string_view message, ServerReflectionResponse& response) {
  auto* error = response.mutable_error_response();
  error->set_error_code(static_cast<int32_t>(code));
  error->set_error_message(std::string(message));
}

// The file asked for and, depth first, those of its dependencies the stream has not been sent yet:
// a client resolves every type the file names from the one answer. The file itself always comes
// (as grpc-go sends it; gRPC C++'s plugin answers an empty response for a file sent before, which
// a client asking for a second symbol of one file cannot tell from "nothing there").
void AddFileAndDependencies(const google::protobuf::FileDescriptor& file, bool requested,
                            std::unordered_set<std::string>& sent,
                            ServerReflectionResponse& response) {
  if (!sent.insert(file.name()).second && !requested) return;
  google::protobuf::FileDescriptorProto proto;
  file.CopyTo(&proto);
  proto.SerializeToString(response.mutable_file_descriptor_response()->add_file_descriptor_proto());
  for (int i = 0; i < file.dependency_count(); ++i) {
    AddFileAndDependencies(*file.dependency(i), /*requested=*/false, sent, response);
  }
}

}  // namespace

// One stream: a request read, its answer written, and so on until the client half-closes. One
// operation at a time, so the reactions never overlap.
class ReflectionService::Reactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Reactor(const ReflectionService& service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    // Before any request is read: without a key the caller learns nothing, not even the services.
    if (absl::StatusOr<std::string> caller = service_.auth_.Identify(*context_); !caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call ended): every request was answered
      Finish(grpc::Status::OK);
      return;
    }
    ServerReflectionRequest request;
    absl::Status parsed = ParseRequest(*context_, read_, service_.max_request_bytes_, request);
    read_.Clear();
    if (!parsed.ok()) {
      Finish(ToGrpcStatus(parsed));
      return;
    }
    ServerReflectionResponse response;
    Answer(request, response);
    if (grpc::Status serialized = SerializeResponse(response, &written_); !serialized.ok()) {
      Finish(serialized);
      return;
    }
    StartWrite(&written_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "ServerReflectionInfo: the client went away before its answer was sent"));
      return;
    }
    StartRead(&read_);
  }

  void OnDone() override { delete this; }

 private:
  // What gRPC's reflection plugin answers, from the descriptors linked into the binary.
  void Answer(const ServerReflectionRequest& request, ServerReflectionResponse& response) {
    const google::protobuf::DescriptorPool& pool =
        *google::protobuf::DescriptorPool::generated_pool();
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : service_.services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        return;
      case ServerReflectionRequest::kFileByFilename:
        if (const auto* file = pool.FindFileByName(request.file_by_filename())) {
          AddFileAndDependencies(*file, /*requested=*/true, sent_files_, response);
        } else {
          SetError(grpc::StatusCode::NOT_FOUND, "File not found.", response);
        }
        return;
      case ServerReflectionRequest::kFileContainingSymbol:
        if (const auto* file = pool.FindFileContainingSymbol(request.file_containing_symbol())) {
          AddFileAndDependencies(*file, /*requested=*/true, sent_files_, response);
        } else {
          SetError(grpc::StatusCode::NOT_FOUND, "Symbol not found.", response);
        }
        return;
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& wanted = request.file_containing_extension();
        const auto* type = pool.FindMessageTypeByName(wanted.containing_type());
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", response);
          return;
        }
        const auto* extension = pool.FindExtensionByNumber(type, wanted.extension_number());
        if (extension == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND, "Extension not found.", response);
          return;
        }
        AddFileAndDependencies(*extension->file(), /*requested=*/true, sent_files_, response);
        return;
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const auto* type = pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", response);
          return;
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
        return;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        break;
    }
    SetError(grpc::StatusCode::UNIMPLEMENTED,
             "The request is not supported: expected one of file_by_filename, "
             "file_containing_symbol, file_containing_extension, all_extension_numbers_of_type "
             "or list_services",
             response);
  }

  const ReflectionService& service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer read_;
  grpc::ByteBuffer written_;
  // The files this stream has been sent (by name), as gRPC's plugin keeps them per stream.
  std::unordered_set<std::string> sent_files_;
};

ReflectionService::ReflectionService(std::vector<std::string> services, const Authenticator& auth,
                                     int64_t max_request_bytes)
    : services_(std::move(services)), auth_(auth), max_request_bytes_(max_request_bytes) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReflectionService::ServerReflectionInfo(grpc::CallbackServerContext* context) {
  return new Reactor(*this, context);
}

}  // namespace tost::service
