// W3C Trace Context on the way in: the `traceparent` a gateway or a client sends (HTTP header or
// gRPC metadata) names the trace a request belongs to, so that one request is followed through a
// gateway and every replica it touches. The server does not record spans yet; what it does is
// carry the trace id into its access log (`trace_id`, and `span_id`: an id of its own for this
// request, the span a tracer would record) and into the request id, so that two replicas' logs of
// one trace share an id whatever the client put in x-request-id.
//
//   traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//                version-trace id (32 hex)-parent span id (16 hex)-flags
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tost::service {

struct TraceParent {
  std::string trace_id;   // 32 lowercase hex digits, not all zeros
  std::string parent_id;  // 16 lowercase hex digits, not all zeros: the caller's span
  uint8_t flags = 0;      // bit 0: sampled
};

// The value of a traceparent header as the W3C Trace Context recommendation defines it: version 00
// exactly as above (55 characters), a later version at least its four fields, the 56th character
// '-' when longer; version ff, uppercase hex, an all-zero trace or parent id, or anything else is
// no trace (nullopt), and the request is served without one. Surrounding spaces and tabs are
// ignored.
std::optional<TraceParent> ParseTraceParent(std::string_view value);

// Who a request is, for the access log and the client.
struct RequestIdentity {
  // The client's x-request-id when valid (IsValidRequestId); else, with a trace,
  // "<trace_id>-<span_id>"; else 16 random hex digits.
  std::string request_id;
  std::string trace_id;  // empty without a valid traceparent
  std::string span_id;   // this server's span of the request: 16 random hex digits; empty without
};

// From the request's x-request-id and traceparent values ("" when absent).
RequestIdentity IdentifyRequest(std::string_view x_request_id, std::string_view traceparent);

}  // namespace tost::service
