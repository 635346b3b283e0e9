// A Lua script for RedisClient::Eval: its source and the SHA-1 that EVALSHA names it by, computed
// here once so that the common case sends 40 hex digits instead of the whole script.
#pragma once

#include <string>

namespace tost::store {

class RedisScript {
 public:
  explicit RedisScript(std::string lua);

  const std::string& source() const { return source_; }
  const std::string& sha1() const { return sha1_; }  // 40 lowercase hex digits, as Redis names it

 private:
  std::string source_;
  std::string sha1_;
};

}  // namespace tost::store
