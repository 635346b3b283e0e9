#include "service/store/redis_script.h"

#include <openssl/evp.h>

#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace tost::store {

RedisScript::RedisScript(std::string lua) : source_(std::move(lua)) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // SHA-1 is how Redis names scripts (SCRIPT LOAD, EVALSHA), not a security choice here.
  EVP_Digest(source_.data(), source_.size(), digest, &len, EVP_sha1(), nullptr);
  sha1_ = absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

}  // namespace tost::store
