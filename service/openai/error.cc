#include "service/openai/error.h"

#include <cctype>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/utf8.h"

namespace tost::service::openai {
namespace {

// A payload type URL of this library's own: nothing outside it reads or writes it.
constexpr absl::string_view kParamPayload = "type.tost-serve/openai.param";

}  // namespace

const char* OpenAiErrorType(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnimplemented:
      return "invalid_request_error";
    case absl::StatusCode::kUnauthenticated:
      return "authentication_error";
    case absl::StatusCode::kPermissionDenied:
      return "permission_error";
    case absl::StatusCode::kNotFound:
      return "not_found_error";
    case absl::StatusCode::kResourceExhausted:
      return "rate_limit_error";
    default:
      return "server_error";
  }
}

absl::Status FieldError(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat(param, ": ", message)), param);
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  if (status.ok() || param.empty() || status.GetPayload(kParamPayload).has_value()) return status;
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string ErrorParam(const absl::Status& status) {
  const auto p = status.GetPayload(kParamPayload);
  return p.has_value() ? std::string(*p) : std::string();
}

std::string OpenAiErrorBody(const absl::Status& status, absl::string_view param) {
  const absl::Status s =
      status.ok() ? absl::InternalError("an error body was built for an OK status") : status;
  std::string code = absl::StatusCodeToString(s.code());
  for (char& c : code) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string field = param.empty() ? ErrorParam(s) : std::string(param);
  nlohmann::json error = {
      {"message",
       model::EscapeInvalidUtf8(std::string_view(s.message().data(), s.message().size()))},
      {"type", OpenAiErrorType(s.code())},
      {"param", field.empty() ? nlohmann::json() : nlohmann::json(model::EscapeInvalidUtf8(field))},
      {"code", code}};
  return nlohmann::json({{"error", std::move(error)}}).dump();
}

}  // namespace tost::service::openai
