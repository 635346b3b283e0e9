// A Redis reply as plain values, copied out of hiredis' reply object so that callers never see
// hiredis (and never free anything).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tost::store {

struct RedisReply {
  enum class Type { kNil, kInteger, kString, kStatus, kError, kArray };

  Type type = Type::kNil;
  int64_t integer = 0;               // kInteger
  std::string str;                   // kString (binary-safe), kStatus ("OK"), kError (the message)
  std::vector<RedisReply> elements;  // kArray

  bool is_nil() const { return type == Type::kNil; }
  bool is_integer() const { return type == Type::kInteger; }
  bool is_string() const { return type == Type::kString; }
  bool is_status() const { return type == Type::kStatus; }
  bool is_error() const { return type == Type::kError; }
  bool is_array() const { return type == Type::kArray; }

  // For messages and test failures: the type and a bounded, printable rendering of the value.
  std::string DebugString() const;
};

absl::string_view RedisReplyTypeName(RedisReply::Type type);

}  // namespace tost::store
