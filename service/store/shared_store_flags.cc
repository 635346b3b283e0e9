#include "service/store/shared_store_flags.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/error_detail.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "service/engine/clock.h"
#include "service/store/redis_prefix_tier.h"
#include "service/store/redis_record_store.h"

namespace tost::store {

absl::StatusOr<SharedStoreFactories> MakeSharedStoreFactories(const SharedStoreFlags& flags) {
  if (flags.url == "memory") {
    if (!flags.password_file.empty()) {
      return absl::InvalidArgumentError(
          "--session_store_password_file is set but --session_store is \"memory\"; give "
          "--session_store=redis://host:port to use it");
    }
    return SharedStoreFactories{};
  }
  TOST_ASSIGN_OR_RETURN(RedisEndpoint endpoint, ParseRedisUrl(flags.url));
  if (!flags.password_file.empty()) {
    TOST_ASSIGN_OR_RETURN(std::string password, model::ReadFileToString(flags.password_file));
    while (!password.empty() && (password.back() == '\n' || password.back() == '\r')) {
      password.pop_back();
    }
    if (password.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--session_store_password_file ", flags.password_file, " is empty"));
    }
    endpoint.password = std::move(password);
  }
  RedisClientOptions sessions_client;
  sessions_client.endpoint = std::move(endpoint);
  sessions_client.connect_timeout = flags.timeout;
  sessions_client.command_timeout = flags.timeout;
  sessions_client.observer = flags.observer;
  TOST_RETURN_IF_ERROR(ValidateRedisClientOptions(sessions_client));
  // The prefix tier is a cache in front of a prefill: it waits less than a session call would.
  RedisClientOptions tier_client = sessions_client;
  tier_client.connect_timeout = std::min(flags.timeout, absl::Milliseconds(200));
  tier_client.command_timeout = tier_client.connect_timeout;
  tier_client.max_connections = 4;

  SharedStoreFactories out;
  const RedisSessionStoreOptions redis = flags.redis;
  out.sessions = [sessions_client, redis](service::SessionStoreContext context)
      -> absl::StatusOr<std::unique_ptr<service::SessionStore>> {
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client,
                          RedisClient::Create(sessions_client));
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisSessionStore> store,
                          RedisSessionStore::Create(std::move(context), std::move(client), redis));
    return std::unique_ptr<service::SessionStore>(std::move(store));
  };
  const std::string key_prefix = flags.redis.key_prefix;
  out.records = [sessions_client, key_prefix](service::RecordStoreOptions records)
      -> absl::StatusOr<std::unique_ptr<service::RecordStore>> {
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client,
                          RedisClient::Create(sessions_client));
    RedisRecordStoreOptions options;
    options.key_prefix = key_prefix;
    options.records = records;
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisRecordStore> store,
                          RedisRecordStore::Make(std::move(client), std::move(options)));
    return std::unique_ptr<service::RecordStore>(std::move(store));
  };
  const std::string password_file = flags.password_file;
  out.check_credentials = [sessions_client, password_file]() -> absl::Status {
    // A client of its own, uncounted: the store's metrics are the served calls'.
    RedisClientOptions probe = sessions_client;
    probe.max_connections = 1;
    probe.observer = nullptr;
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client, RedisClient::Create(probe));
    absl::StatusOr<RedisReply> pong = client->Command({"PING"});
    if (pong.ok() || !IsCredentialsRefused(pong.status())) return pong.status();
    // The message says where the password came from: the URL, or the file that overrides it.
    const std::string source =
        password_file.empty()
            ? std::string()
            : absl::StrCat(" (the password is the one in --session_store_password_file ",
                           password_file, ")");
    return absl::FailedPreconditionError(absl::StrCat(
        "the store refused this server's credentials at start-up, so every session call would "
        "fail; not starting: ",
        FullErrorText(pong.status()), source));
  };
  RedisPrefixTierOptions tier;
  tier.key_prefix = flags.redis.key_prefix;
  tier.ttl = flags.prefix_ttl;
  out.prefix_tier = [tier_client, tier](const service::SessionCodec* codec)
      -> absl::StatusOr<std::unique_ptr<service::PrefixCacheTier>> {
    TOST_ASSIGN_OR_RETURN(std::unique_ptr<RedisClient> client, RedisClient::Create(tier_client));
    return std::unique_ptr<service::PrefixCacheTier>(std::make_unique<RedisPrefixTier>(
        codec, std::move(client), tier, service::RealClock::Get()));
  };
  return out;
}

}  // namespace tost::store
