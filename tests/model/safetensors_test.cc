#include "model/config/safetensors.h"

#include <gtest/gtest.h>

namespace tost::model {
namespace {

std::string TwoTensorFile() {
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const int64_t b[2] = {7, -8};
  return SerializeSafetensors(
      {{"a", StDtype::kF32, {2, 3}, std::string_view(reinterpret_cast<const char*>(a), sizeof(a))},
       {"b", StDtype::kI64, {2}, std::string_view(reinterpret_cast<const char*>(b), sizeof(b))}},
      {{"format", "pt"}});
}

TEST(Safetensors, RoundTrip) {
  auto f = SafetensorsFile::Parse(TwoTensorFile(), "t.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 2u);
  const StTensor* a = *f->Find("a");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->numel(), 6);
  float v[6];
  std::memcpy(v, a->bytes.data(), sizeof(v));
  EXPECT_EQ(v[5], 6.f);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->Find("zzz").status().code(), absl::StatusCode::kNotFound);
}

void ExpectCorrupt(const std::string& contents, const std::string& fragment) {
  auto f = SafetensorsFile::Parse(contents, "bad.safetensors");
  ASSERT_FALSE(f.ok()) << "accepted a corrupt file (expected: " << fragment << ")";
  EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find(fragment), std::string::npos) << f.status();
}

TEST(Safetensors, EveryTruncationIsRefused) {
  const std::string good = TwoTensorFile();
  for (size_t len = 0; len < good.size(); ++len) {
    auto f = SafetensorsFile::Parse(good.substr(0, len), "cut.safetensors");
    EXPECT_FALSE(f.ok()) << "accepted a file truncated to " << len << " of " << good.size()
                         << " bytes";
  }
}

std::string WithHeader(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedHeadersNameTheTensor) {
  ExpectCorrupt("abc", "at least 8 bytes");
  ExpectCorrupt(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header length");
  ExpectCorrupt(WithHeader("{not json", 0), "not valid JSON");
  ExpectCorrupt(WithHeader("[1,2]", 0), "JSON object");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"F32","shape":[2]}})", 8), "tensor \"w\" needs");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8),
                "unsupported dtype");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                "bad dimension");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                "needs 12");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
                "outside");
  ExpectCorrupt(WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                "outside");
  ExpectCorrupt(
      WithHeader(
          R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
          8),
      "too large");
  ExpectCorrupt(WithHeader(R"({"__metadata__":{"k":1}})", 0), "__metadata__");
}

// Two tensors sharing bytes would alias each other's weights: no writer produces that, so a file
// that does is refused, naming both tensors (sorted by offset, the nested and the later ones too).
TEST(Safetensors, OverlappingTensorsAreRefused) {
  ExpectCorrupt(WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                "tensor \"b\" data_offsets [4, 12) overlap tensor \"a\" data_offsets [0, 8)");
  ExpectCorrupt(WithHeader(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                           R"("c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                           16),
                "overlap tensor \"a\"");
  ExpectCorrupt(WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           8),
                "overlap");
  // Adjacent tensors and empty ones (which hold no bytes) are fine.
  EXPECT_TRUE(
      SafetensorsFile::Parse(WithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                        16),
                             "ok.safetensors")
          .ok());
}

TEST(Safetensors, InvalidUtf8InTheHeaderIsRefusedNamingTheTensor) {
  ExpectCorrupt(
      WithHeader("{\"w\":{\"dtype\":\"F3\xff\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
      "invalid UTF-8 at byte offset 17 (line 1, column 18) in the value of field \"w.dtype\"");
}

}  // namespace
}  // namespace tost::model
