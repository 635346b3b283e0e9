// The answers of calls that end before their handler runs because they brought no request: their
// stream was reset first (a client that opens and resets streams as fast as it can, HTTP/2 "rapid
// reset", makes thousands a second) or the client sent none. The services give them (RawService,
// the Generate reactor, ParseRequest), and the metrics interceptor recognises them by their code
// and the end of their message, to count them and summarise them in the log instead of writing a
// line each (service/observability/metrics.cc).
#pragma once

#include <grpcpp/support/status.h>

#include <string_view>

namespace tost::service {

// After "<RequestType>" (INVALID_ARGUMENT): gRPC handed the call over without a request message.
inline constexpr std::string_view kNoRequestMessageEnd = ": expected a request message, got none";
// After "<method path>" (CANCELLED): the call was already cancelled when its handler would start.
inline constexpr std::string_view kCancelledBeforeHandlerMessageEnd =
    ": the call was cancelled before its handler ran";

// "no_request" or "cancelled" for such an answer; nullptr for any other.
inline const char* EndedBeforeHandlerReason(grpc::StatusCode code, std::string_view message) {
  const auto ends_with = [message](std::string_view end) {
    return message.size() >= end.size() && message.substr(message.size() - end.size()) == end;
  };
  if (code == grpc::StatusCode::INVALID_ARGUMENT && ends_with(kNoRequestMessageEnd))
    return "no_request";
  if (code == grpc::StatusCode::CANCELLED && ends_with(kCancelledBeforeHandlerMessageEnd))
    return "cancelled";
  return nullptr;
}

}  // namespace tost::service
