#include "service/api/raw_request.h"

#include <grpc/compression.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/stubs/logging.h"
#include "service/api/before_handler.h"
#include "service/api/inflate.h"
#include "service/engine/client_text.h"

// Exported by libgrpc for gRPC's own tests (declared in its sources, not in its installed headers):
// the flags of the last message a call received, and the algorithm its grpc-encoding named
// (GRPC_COMPRESS_NONE when absent or not one gRPC knows). With decompression left to the server
// (server.cc), the message flags are the only place that still says a message was sent compressed:
// gRPC hands a message compressed with an encoding it does not know over as plain bytes.
uint32_t grpc_call_test_only_get_message_flags(grpc_call* call);
grpc_compression_algorithm grpc_call_test_only_get_compression_algorithm(grpc_call* call);

namespace tost::service {
namespace {

// The message flag gRPC's HTTP/2 transport sets for a message whose compressed flag byte is 1.
constexpr uint32_t kMessageFlaggedCompressed = 0x80000000u;

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// protobuf's default recursion limit (io::CodedInputStream::GetDefaultRecursionLimit()): the
// parser refuses messages and groups nested deeper.
constexpr int kMaxDepth = 100;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Walks a serialized message with its descriptor and finds the first thing protobuf's parser
// would refuse. It accepts exactly what the parser accepts: unknown fields (kept, so their wire
// format must be sound, groups included), known fields sent with another wire type (kept as
// unknown), repeated scalars packed or not; and it checks what the parser checks: tags, varints
// (at most 10 bytes; tags and lengths at most 5), lengths against what is left, packed contents,
// nesting depth and the UTF-8 of proto3 string fields. Bytes fields are skipped, not copied.
class WireWalker {
 public:
  WireWalker(std::string_view wire, const Descriptor& root) : wire_(wire), root_(root) {}

  absl::Status Walk() {
    size_t at = 0;
    return Message(at, wire_.size(), &root_, root_.name(), 0, std::nullopt);
  }

 private:
  // The fields from `at` up to `end` (or up to the end-group tag of `group`, for a group) of a
  // message of type `type` (null: an unknown group), named `path`. Leaves `at` after them.
  absl::Status Message(size_t& at, size_t end, const Descriptor* type, const std::string& path,
                       int depth, std::optional<uint32_t> group) const {
    if (depth > kMaxDepth) {
      return Malformed(path, at,
                       absl::StrCat("messages or groups nested more than ", kMaxDepth,
                                    " deep (protobuf's recursion limit)"));
    }
    std::unordered_map<uint32_t, int> seen;  // per field number: the index of its next value
    while (at < end) {
      const size_t tag_at = at;
      uint64_t tag = 0;
      if (!ReadVarint(at, end, 5, tag) || tag > UINT32_MAX) {
        return Malformed(path, tag_at, "a field tag that is not a varint of at most 32 bits");
      }
      const uint32_t number = static_cast<uint32_t>(tag >> 3);
      const uint32_t wire_type = static_cast<uint32_t>(tag & 7);
      if (wire_type == kEndGroup) {
        if (group.has_value() && number == *group) return absl::OkStatus();
        return Malformed(
            path, tag_at,
            absl::StrCat("an end-group tag of field ", number, " without its start-group tag"));
      }
      if (number == 0) return Malformed(path, tag_at, "field number 0");
      const FieldDescriptor* field = type == nullptr ? nullptr : type->FindFieldByNumber(number);
      const std::string field_path = FieldPath(path, field, number, seen[number]++);
      switch (wire_type) {
        case kVarint: {
          uint64_t value = 0;
          if (!ReadVarint(at, end, 10, value)) {
            return Malformed(field_path, tag_at,
                             "a varint value longer than 10 bytes or past the end of its message");
          }
          break;
        }
        case kFixed64:
        case kFixed32: {
          const size_t size = wire_type == kFixed64 ? 8 : 4;
          if (end - at < size) {
            return Malformed(field_path, tag_at,
                             absl::StrCat("a ", size * 8, "-bit value with ", end - at,
                                          " bytes left in its message"));
          }
          at += size;
          break;
        }
        case kLengthDelimited: {
          const size_t length_at = at;
          uint64_t length = 0;
          if (!ReadVarint(at, end, 5, length) || length > INT32_MAX) {
            return Malformed(field_path, length_at, "a length that is not a varint below 2^31");
          }
          if (length > end - at) {
            return Malformed(field_path, length_at,
                             absl::StrCat("a length of ", length, " bytes with ", end - at,
                                          " left in its message"));
          }
          const size_t value_end = at + static_cast<size_t>(length);
          TOST_RETURN_IF_ERROR(LengthDelimited(field, at, value_end, field_path, depth));
          at = value_end;
          break;
        }
        case kStartGroup:
          // proto3 declares no groups: this is an unknown field, which the parser keeps and so
          // parses, up to its end-group tag.
          TOST_RETURN_IF_ERROR(Message(at, end, nullptr, field_path, depth + 1, number));
          break;
        default:
          return Malformed(
              field_path, tag_at,
              absl::StrCat("wire type ", wire_type, ", which protobuf does not define"));
      }
    }
    if (group.has_value()) {
      return Malformed(
          path, at,
          absl::StrCat("the end of the input inside group field ", *group, " (no end-group tag)"));
    }
    return absl::OkStatus();
  }

  // A length-delimited value of `field` (null: unknown) from `at` to `end`.
  absl::Status LengthDelimited(const FieldDescriptor* field, size_t at, size_t end,
                               const std::string& path, int depth) const {
    if (field == nullptr) return absl::OkStatus();  // unknown: kept as bytes
    const std::string_view value = wire_.substr(at, end - at);
    switch (field->type()) {
      case FieldDescriptor::TYPE_STRING: {
        // The parser checks proto3 strings only (proto2 ones it lets through).
        if (field->file()->syntax() != google::protobuf::FileDescriptor::SYNTAX_PROTO3) break;
        // protobuf's own check: the prefix it accepts, which is the whole value when valid.
        const int valid = google::protobuf::internal::UTF8SpnStructurallyValid(
            google::protobuf::StringPiece(value.data(), value.size()));
        if (static_cast<size_t>(valid) != value.size()) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": not valid UTF-8 at byte ", valid,
                                                         "; a string field takes UTF-8 text, got ",
                                                         QuoteClientText(value)));
        }
        break;
      }
      case FieldDescriptor::TYPE_MESSAGE:
        return Message(at, end, field->message_type(), path, depth + 1, std::nullopt);
      case FieldDescriptor::TYPE_BYTES:
      case FieldDescriptor::TYPE_GROUP:
        break;
      default:
        // A scalar: packed when repeated, otherwise an unknown field the parser keeps as bytes.
        if (field->is_repeated()) return Packed(*field, at, end, path);
        break;
    }
    return absl::OkStatus();
  }

  // Packed values of a repeated scalar: whole fixed-size values, or varints ending exactly at
  // `end`.
  absl::Status Packed(const FieldDescriptor& field, size_t at, size_t end,
                      const std::string& path) const {
    size_t fixed = 0;
    switch (field.type()) {
      case FieldDescriptor::TYPE_FIXED32:
      case FieldDescriptor::TYPE_SFIXED32:
      case FieldDescriptor::TYPE_FLOAT:
        fixed = 4;
        break;
      case FieldDescriptor::TYPE_FIXED64:
      case FieldDescriptor::TYPE_SFIXED64:
      case FieldDescriptor::TYPE_DOUBLE:
        fixed = 8;
        break;
      default:
        break;
    }
    if (fixed != 0) {
      if ((end - at) % fixed != 0) {
        return Malformed(path, at,
                         absl::StrCat("packed ", fixed * 8, "-bit values in ", end - at,
                                      " bytes, not a multiple of ", fixed));
      }
      return absl::OkStatus();
    }
    for (int index = 0; at < end; ++index) {
      const size_t value_at = at;
      uint64_t value = 0;
      if (!ReadVarint(at, end, 10, value)) {
        return Malformed(absl::StrCat(path, "[", index, "]"), value_at,
                         "a packed varint longer than 10 bytes or past the end of its field");
      }
    }
    return absl::OkStatus();
  }

  // A varint of at most `max_bytes` bytes before `end`, as protobuf reads them (it ignores the
  // bits past 64 of a 10-byte varint).
  bool ReadVarint(size_t& at, size_t end, int max_bytes, uint64_t& value) const {
    value = 0;
    for (int i = 0; i < max_bytes && at < end; ++i) {
      const uint8_t byte = static_cast<uint8_t>(wire_[at++]);
      if (i < 10) value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  static std::string FieldPath(const std::string& path, const FieldDescriptor* field,
                               uint32_t number, int index) {
    if (field == nullptr) return absl::StrCat(path, " field ", number);
    // Repeated strings, bytes and messages (map entries too) are numbered; packed scalars are
    // not, their values being numbered inside the field.
    const bool numbered = field->is_repeated() && !field->is_packable();
    return numbered ? absl::StrCat(path, ".", field->name(), "[", index, "]")
                    : absl::StrCat(path, ".", field->name());
  }

  absl::Status Malformed(const std::string& path, size_t at, absl::string_view got) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid protobuf encoding at byte ", at, " of ", wire_.size(),
                     ": expected a serialized ", root_.full_name(), ", got ", got));
  }

  const std::string_view wire_;
  const Descriptor& root_;
};

}  // namespace

absl::Status CheckWireFormat(std::string_view wire, const google::protobuf::Descriptor& type) {
  if (wire.size() > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(type.name(), ": ", wire.size(), " bytes, more than protobuf parses (2 GiB)"));
  }
  return WireWalker(wire, type).Walk();
}

namespace {

// Why protobuf refused `wire`, a request for `message`: the walk names the field; a case it would
// not know still gets an answer naming the message.
absl::Status Diagnose(std::string_view wire, const google::protobuf::Message& message) {
  const Descriptor& type = *message.GetDescriptor();
  TOST_RETURN_IF_ERROR(CheckWireFormat(wire, type));
  return absl::InvalidArgumentError(absl::StrCat(type.name(), ": expected a serialized ",
                                                 type.full_name(), ", got ", wire.size(),
                                                 " bytes protobuf could not parse"));
}

}  // namespace

absl::Status ParseRequest(std::string_view wire, google::protobuf::Message& message) {
  if (wire.size() <= INT_MAX) {
    // protobuf logs every string field it refuses: a client must not be able to fill the logs.
    google::protobuf::LogSilencer quiet;
    if (message.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
      return absl::OkStatus();
    }
  }
  return Diagnose(wire, message);
}

absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message& message) {
  if (!buffer.Valid()) {
    return absl::InvalidArgumentError(
        std::string(message.GetDescriptor()->name()).append(kNoRequestMessageEnd));
  }
  {
    // Straight from gRPC's slices, as its generated handlers parse: a large request arrives in
    // many and is not copied whole. (The copy of the buffer shares its slices.)
    grpc::ByteBuffer shared(buffer);
    grpc::ProtoBufferReader reader(&shared);
    google::protobuf::LogSilencer quiet;
    if (reader.status().ok() && message.ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  // Refused: the bytes in one piece (copied only when in several) for the walk to explain why.
  grpc::Slice slice;
  if (!buffer.TrySingleSlice(&slice).ok()) {
    if (grpc::Status dumped = buffer.DumpToSingleSlice(&slice); !dumped.ok()) {
      return absl::InternalError(
          absl::StrCat(message.GetDescriptor()->name(),
                       ": could not read the request's bytes: ", dumped.error_message()));
    }
  }
  return Diagnose(std::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()),
                  message);
}

absl::StatusOr<std::string> InflateRequest(const grpc::ByteBuffer& buffer,
                                           grpc_compression_algorithm algorithm, int64_t max_bytes,
                                           const Descriptor& type) {
  if (algorithm != GRPC_COMPRESS_DEFLATE && algorithm != GRPC_COMPRESS_GZIP) {
    return absl::InternalError(absl::StrCat(
        type.name(), ": no inflation for compression algorithm ", static_cast<int>(algorithm)));
  }
  std::vector<grpc::Slice> slices;
  if (buffer.Valid()) {
    if (grpc::Status dumped = buffer.Dump(&slices); !dumped.ok()) {
      return absl::InternalError(absl::StrCat(
          type.name(), ": could not read the request's bytes: ", dumped.error_message()));
    }
  }
  std::vector<std::string_view> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& slice : slices) {
    chunks.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return InflateMessage(
      chunks, algorithm == GRPC_COMPRESS_GZIP ? Compression::kGzip : Compression::kDeflate,
      max_bytes, type.name());
}

absl::Status ParseRequest(grpc::CallbackServerContext& context, const grpc::ByteBuffer& buffer,
                          int64_t max_bytes, google::protobuf::Message& message) {
  grpc_call* call = context.c_call();
  // An empty message needs no inflating (gRPC's own decompression passed those through too).
  if (call == nullptr || !buffer.Valid() || buffer.Length() == 0 ||
      (grpc_call_test_only_get_message_flags(call) & kMessageFlaggedCompressed) == 0) {
    return ParseRequest(buffer, message);
  }
  const grpc_compression_algorithm algorithm = grpc_call_test_only_get_compression_algorithm(call);
  if (algorithm != GRPC_COMPRESS_DEFLATE && algorithm != GRPC_COMPRESS_GZIP) {
    // gRPC keeps no name it does not know (an unknown grpc-encoding reads as none at all), so the
    // encoding the client sent cannot be quoted back.
    return absl::UnimplementedError(absl::StrCat(
        message.GetDescriptor()->name(),
        ": the request message is flagged compressed, but the call's grpc-encoding is not one this "
        "server decompresses: expected gzip or deflate (grpc-accept-encoding: identity,deflate,"
        "gzip), got an encoding gRPC does not know, identity, or none"));
  }
  TOST_ASSIGN_OR_RETURN(std::string inflated,
                        InflateRequest(buffer, algorithm, max_bytes, *message.GetDescriptor()));
  return ParseRequest(inflated, message);
}

grpc::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* buffer) {
  // gRPC's writer serialises into an empty buffer only (a reactor reuses its buffer per message).
  buffer->Clear();
  bool own_buffer = false;
  return grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, buffer,
                                                                         &own_buffer);
}

}  // namespace tost::service
