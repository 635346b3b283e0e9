#include "service/store/redis_reply.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tost::store {
namespace {

constexpr size_t kMaxShownBytes = 64;    // of a string value
constexpr size_t kMaxShownElements = 8;  // of an array

std::string Bounded(absl::string_view s) {
  std::string shown = absl::CHexEscape(s.substr(0, kMaxShownBytes));
  if (s.size() > kMaxShownBytes) absl::StrAppend(&shown, "... (", s.size(), " bytes)");
  return shown;
}

}  // namespace

absl::string_view RedisReplyTypeName(RedisReply::Type type) {
  switch (type) {
    case RedisReply::Type::kNil:
      return "nil";
    case RedisReply::Type::kInteger:
      return "integer";
    case RedisReply::Type::kString:
      return "string";
    case RedisReply::Type::kStatus:
      return "status";
    case RedisReply::Type::kError:
      return "error";
    case RedisReply::Type::kArray:
      return "array";
  }
  return "unknown";
}

std::string RedisReply::DebugString() const {
  switch (type) {
    case Type::kNil:
      return "nil";
    case Type::kInteger:
      return absl::StrCat("integer ", integer);
    case Type::kString:
    case Type::kStatus:
    case Type::kError:
      return absl::StrCat(RedisReplyTypeName(type), " \"", Bounded(str), "\"");
    case Type::kArray: {
      std::string out = absl::StrCat("array of ", elements.size(), " [");
      for (size_t i = 0; i < elements.size() && i < kMaxShownElements; ++i) {
        absl::StrAppend(&out, i ? ", " : "", elements[i].DebugString());
      }
      absl::StrAppend(&out, elements.size() > kMaxShownElements ? ", ...]" : "]");
      return out;
    }
  }
  return "unknown";
}

}  // namespace tost::store
