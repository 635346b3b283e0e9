// Request bytes to messages, and messages to response bytes, for the services whose methods
// receive their requests raw (service/api/raw_service.h).
//
// gRPC's own deserialisation answers a request protobuf refuses with INTERNAL and an empty
// message, and most such requests are a client's mistake: a proto3 `string` field (a model name, a
// session id, a stop string, a KServe tensor name) holding bytes that are not UTF-8, or bytes that
// are not a serialized message at all. Here they become INVALID_ARGUMENT naming the field, e.g.
//   GenerateRequest.stop.stop[2]: not valid UTF-8 at byte 1; a string field takes UTF-8 text,
//   got "a\xffb"
// (repeated fields and map entries are numbered in the order the request carries them).
#pragma once

#include <grpc/impl/codegen/compression_types.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace tost::service {

// Replaces `message` with the request in `wire`, parsed by protobuf (which decides, as it did
// when gRPC parsed requests; its log lines about them are silenced). When it refuses them, the
// bytes are walked with the message's descriptor, field by field and into every sub-message, to
// name the field and say why: INVALID_ARGUMENT for invalid UTF-8 in a string field, a truncated or
// malformed field, an end-group tag without its start, field number 0, or nesting deeper than
// protobuf's recursion limit (100).
absl::Status ParseRequest(std::string_view wire, google::protobuf::Message& message);

// The same for a request as gRPC received it, parsed from its slices in place.
absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message& message);

// The request of a call as gRPC received it (server.cc leaves per-message decompression to this
// function: gRPC 1.51 inflates a message in full before checking its size, answers a corrupt one
// with a bare stream reset, and reads a message compressed with an encoding it does not know as if
// it were not compressed). A message the client flagged compressed is inflated here, never past
// `max_bytes` (--max_message_bytes), then parsed as above:
//   - an encoding the server does not decompress: UNIMPLEMENTED listing those it does (gRPC's
//     answer to an unsupported encoding, as its grpc-accept-encoding header lists them);
//   - bytes that are not valid gzip or deflate data: INVALID_ARGUMENT saying where zlib stopped;
//   - more than `max_bytes` once inflated: RESOURCE_EXHAUSTED naming the limit.
absl::Status ParseRequest(grpc::CallbackServerContext& context, const grpc::ByteBuffer& buffer,
                          int64_t max_bytes, google::protobuf::Message& message);

// The inflation alone, for a message compressed with `algorithm` (deflate or gzip): its bytes,
// or one of the refusals above naming `type`.
absl::StatusOr<std::string> InflateRequest(const grpc::ByteBuffer& buffer,
                                           grpc_compression_algorithm algorithm, int64_t max_bytes,
                                           const google::protobuf::Descriptor& type);

// The walk alone: OK when protobuf would parse `wire` as a `type`, otherwise the refusal naming the
// field that ParseRequest answers. (ParseRequest walks only what protobuf refused; the tests check
// that the two agree on what they accept.)
absl::Status CheckWireFormat(std::string_view wire, const google::protobuf::Descriptor& type);

// Serialises a response into `buffer` (replacing what it held) as gRPC's generated handlers do.
grpc::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* buffer);

}  // namespace tost::service
