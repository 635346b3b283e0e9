#include "service/store/redis_prefix_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/little_endian.h"
#include "base/thread_name.h"

namespace tost::store {
namespace {

constexpr char kPurpose[] = "prefix-state";

// The longest of KEYS that exists, refreshed: {its 1-based index, its record}, or {0}.
const RedisScript& FetchScript() {
  static const RedisScript* script = new RedisScript(R"lua(
for i = 1, #KEYS do
  local record = redis.call('GET', KEYS[i])
  if record then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    return {i, record}
  end
end
return {0}
)lua");
  return *script;
}

void PutU32(std::string& out, uint32_t v) { base::AppendLittleEndian(out, v, 4); }
void PutU64(std::string& out, uint64_t v) { base::AppendLittleEndian(out, v, 8); }

// Reads little-endian fields off the front of a record; any overrun makes ok() false.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  uint64_t Uint(int bytes) {
    if (!Has(bytes)) return 0;
    const uint64_t v = base::ReadLittleEndian(data_.data() + at_, bytes);
    at_ += bytes;
    return v;
  }
  std::string Bytes(size_t n) {
    if (!Has(n)) return "";
    std::string out = data_.substr(at_, n);
    at_ += n;
    return out;
  }
  bool Has(size_t n) {
    ok_ = ok_ && data_.size() - at_ >= n;
    return ok_;
  }
  bool done() const { return ok_ && at_ == data_.size(); }

 private:
  const std::string& data_;
  size_t at_ = 0;
  bool ok_ = true;
};

}  // namespace

RedisPrefixTier::RedisPrefixTier(const service::SessionCodec* codec,
                                 std::unique_ptr<RedisClient> client,
                                 RedisPrefixTierOptions options, service::Clock* clock)
    : codec_(codec), client_(std::move(client)), options_(std::move(options)), clock_(clock) {
  publisher_ = std::thread([this] { PublishLoop(); });
}

RedisPrefixTier::~RedisPrefixTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  publisher_.join();
}

std::string RedisPrefixTier::Key(uint64_t hash) const {
  return absl::StrCat(options_.key_prefix, "p:", absl::Hex(hash, absl::kZeroPad16));
}

bool RedisPrefixTier::Skipping() {
  absl::MutexLock lock(&mu_);
  return clock_->Now() < skip_until_;
}

void RedisPrefixTier::Failed() {
  absl::MutexLock lock(&mu_);
  skip_until_ = clock_->Now() + options_.retry_after_failure;
}

std::string RedisPrefixTier::Encode(const std::string& scope_key, absl::Span<const int32_t> tokens,
                                    const model::SequenceState& state, bool on_grid) const {
  std::string data;
  data.reserve(32 + scope_key.size() + 4 * (tokens.size() + state.stats.size()));
  PutU32(data, static_cast<uint32_t>(scope_key.size()));
  data += scope_key;
  PutU32(data, static_cast<uint32_t>(tokens.size()));
  for (int32_t t : tokens) PutU32(data, static_cast<uint32_t>(t));
  data.push_back(on_grid ? 1 : 0);
  PutU64(data, static_cast<uint64_t>(state.position));
  PutU32(data, static_cast<uint32_t>(state.stats.size()));
  for (float f : state.stats) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    PutU32(data, bits);
  }
  return codec_->Seal(kPurpose, data);
}

std::optional<RedisPrefixTier::Decoded> RedisPrefixTier::Decode(const std::string& record) const {
  auto data = codec_->Unseal(kPurpose, record);
  if (!data.ok()) return std::nullopt;
  Reader in(*data);
  Decoded out;
  out.scope_key = in.Bytes(in.Uint(4));
  const uint64_t tokens = in.Uint(4);
  if (!in.Has(tokens * 4)) return std::nullopt;
  out.tokens.reserve(tokens);
  for (uint64_t i = 0; i < tokens; ++i) out.tokens.push_back(static_cast<int32_t>(in.Uint(4)));
  out.on_grid = in.Uint(1) != 0;
  out.state.position = static_cast<int64_t>(in.Uint(8));
  const uint64_t floats = in.Uint(4);
  if (!in.Has(floats * 4)) return std::nullopt;
  out.state.stats.resize(floats);
  for (uint64_t i = 0; i < floats; ++i) {
    const auto bits = static_cast<uint32_t>(in.Uint(4));
    std::memcpy(&out.state.stats[i], &bits, sizeof(bits));
  }
  if (!in.done()) return std::nullopt;
  return out;
}

std::optional<service::PrefixCacheHit> RedisPrefixTier::Fetch(
    const service::PrefixCacheScope& scope, absl::Span<const int32_t> tokens, int64_t min_tokens,
    int64_t max_tokens, bool on_grid_only) {
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  if (max_tokens <= min_tokens || Skipping()) return std::nullopt;
  const std::string scope_key = service::PrefixStateCache::ScopeKey(scope);
  const std::vector<uint64_t> hashes =
      service::PrefixStateCache::PrefixHashes(scope_key, tokens, max_tokens);
  const int64_t shortest = std::max(min_tokens + 1, max_tokens - options_.max_probed_lengths + 1);
  std::vector<std::string> keys;
  keys.reserve(max_tokens - shortest + 1);
  for (int64_t len = max_tokens; len >= shortest; --len) keys.push_back(Key(hashes[len - 1]));
  auto reply =
      client_->Eval(FetchScript(), keys, {absl::StrCat(absl::ToInt64Milliseconds(options_.ttl))});
  if (!reply.ok()) {
    Failed();
    return std::nullopt;
  }
  if (!reply->is_array() || reply->elements.size() != 2 || !reply->elements[0].is_integer()) {
    return std::nullopt;
  }
  const int64_t len = max_tokens - (reply->elements[0].integer - 1);
  std::optional<Decoded> entry = Decode(reply->elements[1].str);
  // Verified, and exactly this scope's prefix of this length: anything else is a miss.
  if (!entry.has_value() || entry->scope_key != scope_key ||
      static_cast<int64_t>(entry->tokens.size()) != len || entry->state.position != len ||
      !std::equal(entry->tokens.begin(), entry->tokens.end(), tokens.begin()) ||
      (on_grid_only && !entry->on_grid)) {
    return std::nullopt;
  }
  return service::PrefixCacheHit{len, std::move(entry->state), entry->on_grid};
}

void RedisPrefixTier::Publish(const service::PrefixCacheScope& scope,
                              absl::Span<const int32_t> tokens, const model::SequenceState& state,
                              bool on_grid) {
  if (tokens.empty() || Skipping()) return;
  const std::string scope_key = service::PrefixStateCache::ScopeKey(scope);
  const std::vector<uint64_t> hashes = service::PrefixStateCache::PrefixHashes(
      scope_key, tokens, static_cast<int64_t>(tokens.size()));
  Pending p{Key(hashes.back()), Encode(scope_key, tokens, state, on_grid)};
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= options_.max_queued_publishes) return;
  queue_.push_back(std::move(p));
}

void RedisPrefixTier::PublishLoop() {
  NameThisThread("redis-publish");
  const std::string ttl_ms = absl::StrCat(absl::ToInt64Milliseconds(options_.ttl));
  for (;;) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](RedisPrefixTier* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      if (stopping_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    if (Skipping()) continue;
    if (!client_->Command({"SET", p.key, p.record, "PX", ttl_ms}).ok()) Failed();
  }
}

}  // namespace tost::store
