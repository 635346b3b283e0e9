#include "service/api/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tost::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode both follow google.rpc.Code numbering.
  const std::string detail = ServerDetail(status);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      detail.empty() ? std::string() : absl::StrCat(kServerDetailMark, detail));
}

}  // namespace tost::service
