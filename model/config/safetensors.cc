#include "model/config/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "model/config/json_utf8.h"

namespace tost::model {
namespace {

using nlohmann::json;

// A header larger than this is refused before parsing: real headers are kilobytes.
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;

struct DtypeEntry {
  const char* name;
  StDtype dtype;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", StDtype::kF64, 8},   {"F32", StDtype::kF32, 4}, {"F16", StDtype::kF16, 2},
    {"BF16", StDtype::kBF16, 2}, {"I64", StDtype::kI64, 8}, {"I32", StDtype::kI32, 4},
    {"I16", StDtype::kI16, 2},   {"I8", StDtype::kI8, 1},   {"U8", StDtype::kU8, 1},
    {"BOOL", StDtype::kBool, 1},
};

absl::Status Corrupt(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": malformed safetensors file: ", what));
}

}  // namespace

const char* StDtypeName(StDtype d) {
  for (const auto& e : kDtypes) {
    if (e.dtype == d) return e.name;
  }
  return "?";
}

size_t StDtypeSize(StDtype d) {
  for (const auto& e : kDtypes) {
    if (e.dtype == d) return e.size;
  }
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string contents,
                                                       const std::string& source) {
  SafetensorsFile file;
  file.source_ = source;
  if (contents.size() < 8) {
    return Corrupt(source, absl::StrCat("expected at least 8 bytes of header length, file has ",
                                        contents.size()));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(contents[i]);
  if (header_len > kMaxHeaderBytes || header_len > contents.size() - 8) {
    return Corrupt(source,
                   absl::StrCat("header length ", header_len, " exceeds the file's remaining ",
                                contents.size() - 8, " bytes (truncated file?)"));
  }
  const std::string_view header_text(contents.data() + 8, header_len);
  TOST_RETURN_IF_ERROR(CheckJsonUtf8(
      header_text, absl::StrCat(source,
                                ": malformed safetensors file: JSON header (offsets from "
                                "its start)")));
  json header;
  try {
    header = json::parse(contents.begin() + 8,
                         contents.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception& e) {  // a syntax error, or a number out of double's range
    return Corrupt(source, absl::StrCat("header is not valid JSON: ", EscapeInvalidUtf8(e.what())));
  }
  if (!header.is_object()) return Corrupt(source, "header must be a JSON object");

  file.buffer_ = std::make_shared<const std::string>(std::move(contents));
  const std::string& buf = *file.buffer_;
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = buf.size() - data_start;
  // [begin, end) of every tensor that holds bytes, checked for overlaps once all are read.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> extents;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt(source, "__metadata__ must be an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          return Corrupt(source, absl::StrCat("__metadata__ value of \"", k, "\" is not a string"));
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor \"", name, "\"");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return Corrupt(source, absl::StrCat(where, " needs dtype, shape and data_offsets"));
    }
    StTensor t;
    const json& dt = entry["dtype"];
    const DtypeEntry* found = nullptr;
    if (dt.is_string()) {
      for (const auto& e : kDtypes) {
        if (dt.get<std::string>() == e.name) found = &e;
      }
    }
    if (found == nullptr)
      return Corrupt(source, absl::StrCat(where, " has unsupported dtype ", dt.dump()));
    t.dtype = found->dtype;
    const json& shape = entry["shape"];
    if (!shape.is_array()) return Corrupt(source, absl::StrCat(where, " shape must be a list"));
    uint64_t numel = 1;
    for (const json& s : shape) {
      if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<int64_t>() >= 0)) {
        return Corrupt(source, absl::StrCat(where, " has a bad dimension ", s.dump()));
      }
      const uint64_t dim = s.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim)) {
        return Corrupt(source, absl::StrCat(where, " has a shape too large to address"));
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return Corrupt(source, absl::StrCat(where, " data_offsets must be [begin, end]"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Corrupt(source,
                     absl::StrCat(where, " data_offsets [", begin, ", ", end, ") fall outside the ",
                                  data_size, " data bytes (truncated file?)"));
    }
    if (end - begin != numel * found->size) {
      return Corrupt(source, absl::StrCat(where, " holds ", end - begin, " bytes but shape [",
                                          absl::StrJoin(t.shape, ","), "] of ", found->name,
                                          " needs ", numel * found->size));
    }
    t.bytes = std::string_view(buf.data() + data_start + begin, end - begin);
    file.tensors_.emplace(name, t);
    if (end > begin) extents.emplace_back(begin, end, name);
  }
  // Two tensors sharing bytes would alias: a file that does this is not one a writer produced.
  // Sorted by begin, a tensor overlaps an earlier one exactly when it begins before the furthest
  // end so far.
  std::sort(extents.begin(), extents.end());
  size_t furthest = 0;
  for (size_t i = 1; i < extents.size(); ++i) {
    const auto& [prev_begin, prev_end, prev_name] = extents[furthest];
    const auto& [begin, end, name] = extents[i];
    if (begin < prev_end) {
      return Corrupt(source,
                     absl::StrCat("tensor \"", name, "\" data_offsets [", begin, ", ", end,
                                  ") overlap tensor \"", prev_name, "\" data_offsets [", prev_begin,
                                  ", ", prev_end, "); every tensor must have bytes of its own"));
    }
    if (end > prev_end) furthest = i;
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  TOST_ASSIGN_OR_RETURN(std::string contents,
                        ReadRegularFile(path, MaxWeightsFileBytes(), "weights file"));
  return Parse(std::move(contents), path);
}

absl::StatusOr<const StTensor*> SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return absl::NotFoundError(absl::StrCat(source_, ": missing tensor \"", name, "\""));
  return &it->second;
}

std::string SerializeSafetensors(const std::vector<StTensorToWrite>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", StDtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0)
    h.push_back(' ');  // align the data section, as the reference writer does
  std::string out(8, '\0');
  uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += h;
  for (const auto& t : tensors) out.append(t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace tost::model
