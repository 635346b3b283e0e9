// Bounded inflation of a compressed gRPC message (gzip or gRPC's "deflate", zlib's format), free of
// gRPC so the fuzzer can drive it under the sanitizers: the request path (raw_request.h) hands it
// the message's slices.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tost::service {

enum class Compression { kDeflate, kGzip };

// "deflate" or "gzip", as grpc-encoding names them.
const char* CompressionName(Compression compression);

// The bytes `chunks` (one compressed message, cut anywhere) inflate to, never holding more than
// `max_bytes` + 1 of output: past `max_bytes` RESOURCE_EXHAUSTED naming the limit; bytes that are
// not one whole stream of `compression` (corrupt, truncated, or followed by more bytes)
// INVALID_ARGUMENT saying where zlib stopped. `type_name` (the request's message type) starts every
// message.
absl::StatusOr<std::string> InflateMessage(absl::Span<const std::string_view> chunks,
                                           Compression compression, int64_t max_bytes,
                                           absl::string_view type_name);

}  // namespace tost::service
