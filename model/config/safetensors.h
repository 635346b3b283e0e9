// A safetensors reader that executes nothing: an 8-byte little-endian header length, a JSON header
// mapping names to {dtype, shape, data_offsets}, then raw little-endian tensor bytes. Every field
// is bounds-checked; a malformed or truncated file is an error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::model {

enum class StDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

const char* StDtypeName(StDtype d);
size_t StDtypeSize(StDtype d);

struct StTensor {
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  std::string_view bytes;  // points into the owning SafetensorsFile's buffer

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Parses a complete file image. `source` names the file in error messages.
  static absl::StatusOr<SafetensorsFile> Parse(std::string contents, const std::string& source);
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& source() const { return source_; }
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor called `name`, or NOT_FOUND naming the file.
  absl::StatusOr<const StTensor*> Find(const std::string& name) const;

 private:
  std::string source_;
  std::shared_ptr<const std::string> buffer_;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Serialises tensors into the safetensors format (used by tests and tools that write models).
struct StTensorToWrite {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  std::string_view bytes;
};
std::string SerializeSafetensors(const std::vector<StTensorToWrite>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace tost::model
