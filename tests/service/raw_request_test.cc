// Request bytes to messages (service/api/raw_request.h): what protobuf refuses is refused with
// INVALID_ARGUMENT naming the field, what it accepts is parsed exactly as it parses it, and the
// walk that names the field agrees with protobuf on both.
#include "service/api/raw_request.h"

#include <gmock/gmock.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <zlib.h>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "kserve/v2/grpc_service.pb.h"
#include "tost/v1/tost.pb.h"

namespace tost::service {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// `wire` with every '~' replaced by `byte`: requests are built with valid text and a marker, then
// given bytes a client's serializer would refuse to write.
std::string Poison(std::string wire, char byte = '\xff') {
  for (char& c : wire) {
    if (c == '~') c = byte;
  }
  return wire;
}

// ParseRequest's answer for `wire`, checked against protobuf's own parser: both accept (and parse
// the same message) or both refuse.
template <class Message>
absl::Status ParseAndCompare(const std::string& wire) {
  Message ours;
  const absl::Status status = ParseRequest(wire, ours);
  Message theirs;
  google::protobuf::LogSilencer silence;  // protobuf's parser logs every invalid UTF-8 string
  const bool protobuf_ok = theirs.ParseFromString(wire);
  EXPECT_EQ(status.ok(), protobuf_ok) << status;
  // The walk alone agrees too, on what protobuf accepts as on what it refuses.
  const absl::Status walked = CheckWireFormat(wire, *Message::descriptor());
  EXPECT_EQ(walked.ok(), protobuf_ok) << walked;
  if (!status.ok()) {
    EXPECT_EQ(walked, status);
  }
  if (status.ok() && protobuf_ok) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ours, theirs));
  }
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  return status;
}

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

std::string Tag(uint32_t field, uint32_t wire_type) { return Varint((field << 3) | wire_type); }

std::string Delimited(uint32_t field, const std::string& value) {
  return Tag(field, 2) + Varint(value.size()) + value;
}

TEST(ParseRequest, ParsesWhatProtobufParses) {
  tost::v1::GenerateRequest request;
  request.set_model("tost-austen");
  request.set_prompt_bytes("\xff\xfe not text, and bytes need not be");
  request.set_session_id("caf\xc3\xa9 \xe6\xbc\xa2 \xf0\x9f\x99\x82");  // 2-, 3- and 4-byte UTF-8
  request.mutable_sampling()->set_temperature(0.7f);
  request.mutable_stop()->add_stop("\n\n");
  request.mutable_stop()->add_stop_token_ids(-1);  // a 10-byte varint
  request.set_max_new_tokens(12);
  const std::string wire = request.SerializeAsString();
  tost::v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseRequest(wire, parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, request));
  EXPECT_TRUE(ParseAndCompare<tost::v1::GenerateRequest>(wire).ok());
  // Empty requests are requests.
  EXPECT_TRUE(ParseAndCompare<tost::v1::ListModelsRequest>("").ok());
  EXPECT_TRUE(ParseAndCompare<tost::v1::GenerateRequest>("").ok());
}

TEST(ParseRequest, KeepsWhatProtobufKeeps) {
  // Unknown fields of every wire type, groups (nested) included; a known string field sent as a
  // varint (kept as unknown); repeated floats unpacked; a repeated int64 packed and unpacked.
  const std::string unknown = Tag(99, 0) + Varint(300) + Tag(98, 1) + std::string(8, 'x') +
                              Tag(97, 5) + std::string(4, 'y') + Delimited(96, "\xff\xff") +
                              Tag(95, 3) + Tag(1, 0) + Varint(1) + Tag(94, 3) + Tag(94, 4) +
                              Tag(95, 4);
  const std::string tensor = Tag(2, 5) + std::string(4, '\0') + Tag(2, 5) + std::string(4, '\0') +
                             Delimited(1, Varint(1) + Varint(32)) + Tag(1, 0) + Varint(32) +
                             unknown;
  const std::string wire = Tag(1, 0) + Varint(7) + Delimited(2, tensor) + unknown;
  EXPECT_TRUE(ParseAndCompare<tost::v1::ClassifyRequest>(wire).ok());
  tost::v1::ClassifyRequest parsed;
  ASSERT_TRUE(ParseRequest(wire, parsed).ok());
  EXPECT_EQ(parsed.tensor().data_size(), 2);
  EXPECT_EQ(parsed.tensor().shape_size(), 3);
}

TEST(ParseRequest, NamesTheStringFieldThatIsNotUtf8) {
  struct Case {
    std::string wire;
    std::string path;
  };
  std::vector<Case> cases;
  {
    tost::v1::ClassifyRequest r;
    r.set_model("tost~digits");
    cases.push_back({r.SerializeAsString(), "ClassifyRequest.model: not valid UTF-8 at byte 4"});
  }
  {
    tost::v1::GenerateRequest r;
    r.set_model("tost-austen");
    r.mutable_stop()->add_stop("a");
    r.mutable_stop()->add_stop("b");
    r.mutable_stop()->add_stop("~c");
    cases.push_back(
        {r.SerializeAsString(), "GenerateRequest.stop.stop[2]: not valid UTF-8 at byte 0"});
  }
  {
    tost::v1::GenerateRequest r;
    r.set_session_id("abc~");
    cases.push_back(
        {r.SerializeAsString(), "GenerateRequest.session_id: not valid UTF-8 at byte 3"});
  }
  {
    tost::v1::SessionRef r;
    r.set_session_id("~");
    cases.push_back({r.SerializeAsString(), "SessionRef.session_id:"});
  }
  {
    tost::v1::CreateSessionRequest r;
    r.mutable_stop()->add_stop("~");
    cases.push_back({r.SerializeAsString(), "CreateSessionRequest.stop.stop[0]:"});
  }
  {
    inference::ModelInferRequest r;
    r.set_model_name("tost-digits");
    r.add_inputs()->set_name("image");
    r.add_inputs()->set_datatype("FP~2");
    cases.push_back({r.SerializeAsString(), "ModelInferRequest.inputs[1].datatype:"});
  }
  {
    inference::ModelInferRequest r;
    (*r.mutable_parameters())["k~y"].set_int64_param(1);
    cases.push_back({r.SerializeAsString(), "ModelInferRequest.parameters[0].key:"});
  }
  {
    inference::ModelInferRequest r;
    (*r.mutable_parameters())["key"].set_string_param("v~lue");
    cases.push_back({r.SerializeAsString(), "ModelInferRequest.parameters[0].value.string_param:"});
  }
  {
    inference::ModelInferRequest r;
    r.add_inputs();
    (*r.add_inputs()->mutable_parameters())["~"].set_bool_param(true);
    cases.push_back({r.SerializeAsString(), "ModelInferRequest.inputs[1].parameters[0].key:"});
  }
  {
    inference::ModelInferRequest r;
    r.add_outputs()->set_name("probabilities");
    r.add_outputs()->set_name("~");
    cases.push_back({r.SerializeAsString(), "ModelInferRequest.outputs[1].name:"});
  }
  {
    inference::ModelMetadataRequest r;
    r.set_name("tost-digits");
    r.set_version("~");
    cases.push_back({r.SerializeAsString(), "ModelMetadataRequest.version:"});
  }
  const auto parse = [](const std::string& type, const std::string& wire) {
    if (type == "ClassifyRequest") return ParseAndCompare<tost::v1::ClassifyRequest>(wire);
    if (type == "GenerateRequest") return ParseAndCompare<tost::v1::GenerateRequest>(wire);
    if (type == "SessionRef") return ParseAndCompare<tost::v1::SessionRef>(wire);
    if (type == "CreateSessionRequest") {
      return ParseAndCompare<tost::v1::CreateSessionRequest>(wire);
    }
    if (type == "ModelInferRequest") return ParseAndCompare<inference::ModelInferRequest>(wire);
    return ParseAndCompare<inference::ModelMetadataRequest>(wire);
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    const std::string type = c.path.substr(0, c.path.find_first_of(".:"));
    const absl::Status status = parse(type, Poison(c.wire));
    ASSERT_FALSE(status.ok());
    EXPECT_THAT(std::string(status.message()), StartsWith(c.path));
    EXPECT_THAT(status.message(), HasSubstr("not valid UTF-8"));
    EXPECT_THAT(status.message(), HasSubstr("\\xff"));  // the bytes, escaped
    // The same request with text there parses.
    EXPECT_TRUE(parse(type, Poison(c.wire, 'x')).ok());
  }
}

TEST(ParseRequest, QuotesALongStringShortAndEscaped) {
  tost::v1::ModelInfoRequest r;
  r.set_model(std::string(100000, 'm') + "~\n");
  tost::v1::ModelInfoRequest parsed;
  const absl::Status status = ParseRequest(Poison(r.SerializeAsString()), parsed);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              StartsWith("ModelInfoRequest.model: not valid UTF-8 at byte 100000"));
  EXPECT_THAT(status.message(), HasSubstr("(100002 bytes)"));
  EXPECT_LT(status.message().size(), 300u);
}

TEST(ParseRequest, NamesWhereTheEncodingIsMalformed) {
  struct Case {
    std::string wire;
    std::string fragment;
  };
  const std::string image = Tag(1, 0) + Varint(1);  // FloatTensor.shape = [1]
  const std::vector<Case> cases = {
      {Tag(1, 2) + Varint(5) + "abc",
       "ClassifyRequest.model: not a valid protobuf encoding at byte 1"},
      {Tag(1, 2), "ClassifyRequest.model: not a valid protobuf encoding"},
      {Tag(3, 0), "ClassifyRequest.top_k: not a valid protobuf encoding"},
      {Tag(3, 0) + std::string(10, '\x80') + '\x01', "ClassifyRequest.top_k:"},  // 11 bytes
      {Tag(2, 2) + Varint(2) + Tag(2, 1) + "x", "ClassifyRequest.tensor.data:"},
      {Delimited(2, Delimited(2, "abc")),
       "ClassifyRequest.tensor.data: not a valid protobuf "
       "encoding at byte 4 of 7: expected a serialized "
       "tost.v1.ClassifyRequest, got packed 32-bit values in 3 "
       "bytes"},
      {Delimited(2, Delimited(1, "\x80")), "ClassifyRequest.tensor.shape[0]:"},
      {Delimited(2, image + Tag(7, 4)), "ClassifyRequest.tensor: not a valid protobuf encoding"},
      {std::string(1, '\0'), "ClassifyRequest: not a valid protobuf encoding at byte 0 of 1"},
      {Tag(0, 2) + Varint(0), "field number 0"},
      {Tag(50, 6), "ClassifyRequest field 50:"},
      {Tag(50, 7), "wire type 7"},
      {Tag(50, 3) + Tag(1, 0) + Varint(1), "ClassifyRequest field 50:"},  // no end-group tag
      {Tag(50, 3) + Tag(51, 4), "an end-group tag of field 51"},
      {Tag(4, 4), "an end-group tag of field 4"},
      {"\x80\x80\x80\x80\x80\x01", "a field tag"},
      {Varint(uint64_t{1} << 35), "a field tag"},
      {Tag(4, 2) + "\x80\x80\x80\x80\x80\x01", "ClassifyRequest.images[0]:"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    const absl::Status status = ParseAndCompare<tost::v1::ClassifyRequest>(c.wire);
    ASSERT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr(c.fragment));
    EXPECT_THAT(status.message(), HasSubstr("expected a serialized tost.v1.ClassifyRequest"));
  }
}

TEST(ParseRequest, RefusesNestingPastProtobufsLimitAsProtobufDoes) {
  for (int depth : {99, 100, 101, 150}) {
    SCOPED_TRACE(depth);
    std::string groups;
    for (int i = 0; i < depth; ++i) groups += Tag(50, 3);
    for (int i = 0; i < depth; ++i) groups += Tag(50, 4);
    const absl::Status status = ParseAndCompare<tost::v1::ListModelsRequest>(groups);
    EXPECT_EQ(status.ok(), depth <= 100) << status;
    if (!status.ok()) {
      EXPECT_THAT(status.message(), HasSubstr("recursion limit"));
    }
  }
}

TEST(ParseRequest, ReadsAByteBufferOfManySlices) {
  tost::v1::GenerateRequest r;
  r.set_model("tost-austen");
  r.set_prompt_bytes(std::string(5000, 'p'));
  r.mutable_stop()->add_stop("~");
  const std::string wire = r.SerializeAsString();
  for (const std::string& bytes : {wire, Poison(wire)}) {
    std::vector<grpc::Slice> slices;
    for (size_t at = 0; at < bytes.size(); at += 1000) {
      slices.emplace_back(bytes.substr(at, 1000));
    }
    const grpc::ByteBuffer buffer(slices.data(), slices.size());
    tost::v1::GenerateRequest parsed;
    const absl::Status status = ParseRequest(buffer, parsed);
    if (bytes == wire) {
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(parsed.prompt_bytes().size(), 5000u);
      EXPECT_EQ(parsed.stop().stop(0), "~");
    } else {
      EXPECT_THAT(std::string(status.message()),
                  StartsWith("GenerateRequest.stop.stop[0]: not valid UTF-8"));
    }
  }
  // An empty message is one slice of nothing, or none at all.
  tost::v1::ListModelsRequest empty;
  EXPECT_TRUE(ParseRequest(grpc::ByteBuffer(nullptr, 0), empty).ok());
}

// `data` compressed as gRPC's gzip, or its deflate (zlib's format).
std::string Compress(const std::string& data, bool gzip) {
  z_stream zs{};
  EXPECT_EQ(
      deflateInit2(&zs, 9, Z_DEFLATED, gzip ? 16 + MAX_WBITS : MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// `bytes` as gRPC hands a request over: in slices (of 100 bytes here, so inflation crosses them).
grpc::ByteBuffer InSlices(const std::string& bytes) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += 100) slices.emplace_back(bytes.substr(at, 100));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(InflateRequest, InflatesGzipAndDeflateAcrossSlices) {
  tost::v1::GenerateRequest r;
  r.set_model("tost-austen");
  r.set_prompt_bytes(std::string(100000, 'p'));
  const std::string wire = r.SerializeAsString();
  for (const auto algorithm : {GRPC_COMPRESS_GZIP, GRPC_COMPRESS_DEFLATE}) {
    const std::string compressed = Compress(wire, algorithm == GRPC_COMPRESS_GZIP);
    ASSERT_LT(compressed.size(), 2000u);
    auto inflated = InflateRequest(InSlices(compressed), algorithm, 1 << 20, *r.GetDescriptor());
    ASSERT_TRUE(inflated.ok()) << inflated.status();
    EXPECT_EQ(*inflated, wire);
    // Exactly at the limit inflates; a byte under it does not.
    EXPECT_TRUE(InflateRequest(InSlices(compressed), algorithm, static_cast<int64_t>(wire.size()),
                               *r.GetDescriptor())
                    .ok());
    EXPECT_EQ(InflateRequest(InSlices(compressed), algorithm, static_cast<int64_t>(wire.size()) - 1,
                             *r.GetDescriptor())
                  .status()
                  .code(),
              absl::StatusCode::kResourceExhausted);
  }
}

TEST(InflateRequest, RefusesABombAtTheLimitWithoutInflatingIt) {
  const std::string zeros(64 << 20, '\0');
  const std::string bomb = Compress(zeros, /*gzip=*/true);
  const auto status = InflateRequest(InSlices(bomb), GRPC_COMPRESS_GZIP, 1 << 20,
                                     *tost::v1::ClassifyRequest::descriptor())
                          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("ClassifyRequest: the gzip-compressed request inflates past "
                         "--max_message_bytes (1048576 bytes)"));
}

TEST(InflateRequest, SaysWhyCorruptDataIsRefused) {
  tost::v1::ListModelsRequest r;
  const auto& type = *r.GetDescriptor();
  const std::string good = Compress(std::string(5000, 'x'), /*gzip=*/true);
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x55;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not gzip at all", "not valid gzip data: zlib stopped at byte"},
      {good.substr(0, good.size() - 10), "end before the end of their gzip stream"},
      {good + "trailing", "8 of its"},
      {flipped, "not valid gzip data"},
  };
  for (const auto& [bytes, expected] : cases) {
    const auto status = InflateRequest(InSlices(bytes), GRPC_COMPRESS_GZIP, 1 << 20, type).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_THAT(std::string(status.message()), HasSubstr(expected));
    EXPECT_THAT(std::string(status.message()), StartsWith("ListModelsRequest: "));
  }
}

TEST(SerializeResponse, WritesWhatTheClientParsesIntoAReusedBuffer) {
  // A stream serialises every message into the buffer of the last one, and messages past gRPC's
  // inline slice size take its writer, which only writes into an empty buffer.
  grpc::ByteBuffer buffer;
  for (int position : {1, 2, 3}) {
    tost::v1::SessionInfo info;
    info.set_session_id("0123456789abcdef0123456789abcdef");
    info.set_model(std::string(10000 * position, 'm'));
    info.set_position(position);
    ASSERT_TRUE(SerializeResponse(info, &buffer).ok());
    tost::v1::SessionInfo parsed;
    ASSERT_TRUE(ParseRequest(buffer, parsed).ok());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, info));
  }
}

}  // namespace
}  // namespace tost::service
