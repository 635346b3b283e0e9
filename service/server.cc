#include "service/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "base/error_detail.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "kserve/v2/grpc_service.grpc.pb.h"
#include "model/config/device.h"
#include "model/device/device_memory.h"
#include "model/nets/torch_threads.h"
#include "service/engine/memory_record_store.h"
#include "service/http/http_errors.h"
#include "service/loading_responder.h"
#include "service/observability/logging.h"
#include "service/openai_http/openai_routes.h"
#include "service/openai_http/responses_routes.h"
#include "service/port_probe.h"
#include "service/store/shared_store_flags.h"
#include "tost/v1/tost.grpc.pb.h"

namespace tost::service {
namespace {

// Sets SO_RCVBUF on this process's listening TCP sockets bound to `port`, which the connections
// they accept inherit (gRPC 1.51 has no channel argument for it, and its socket mutator is not part
// of its installed API). Returns how many it set.
int SetListenersReceiveBuffer(int port, int bytes) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int set = 0;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        listening == 0) {
      continue;
    }
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0)
      continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6)
      bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound != port) continue;
    if (setsockopt(static_cast<int>(fd), SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)) == 0) ++set;
  }
  closedir(dir);
  return set;
}

}  // namespace

ServerOptions ResolveListenerAddresses(ServerOptions options) {
  if (options.http_address.empty()) options.http_address = options.host;
  if (options.metrics.address.empty()) options.metrics.address = options.host;
  return options;
}

absl::Status ValidateServerOptions(const ServerOptions& given) {
  const ServerOptions o = ResolveListenerAddresses(given);
  if (o.host.empty()) {
    return absl::InvalidArgumentError(
        "--host must name an address (0.0.0.0: every IPv4 interface, 127.0.0.1: this machine "
        "only), got an empty one");
  }
  if (o.port < 0 || o.port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", o.port));
  if (o.max_concurrent_streams < 1 || o.min_client_ping_interval_ms < 0 || o.max_ping_strikes < 0 ||
      o.max_connection_age_ms < 0 || o.max_connection_age_grace_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_concurrent_streams must be >= 1 and --min_client_ping_interval_ms, "
        "--max_ping_strikes, --max_connection_age_ms, --max_connection_age_grace_ms >= 0; got ",
        o.max_concurrent_streams, ", ", o.min_client_ping_interval_ms, ", ", o.max_ping_strikes,
        ", ", o.max_connection_age_ms, ", ", o.max_connection_age_grace_ms));
  }
  if (o.connection_receive_buffer_bytes < 0 || o.connection_receive_buffer_bytes > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--connection_receive_buffer_bytes must be in [0, 1073741824] (0: the "
                     "kernel's autotuning), got ",
                     o.connection_receive_buffer_bytes));
  }
  if (o.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes must be >= 1024, got ", o.max_message_bytes));
  }
  if (o.intra_op_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--intra_op_threads must be >= 0, got ", o.intra_op_threads));
  }
  if (o.model_repository.empty())
    return absl::InvalidArgumentError("--model_repository must name a directory");
  TOST_RETURN_IF_ERROR(model::ParseDeviceSpec(o.device, "--device").status());
  TOST_RETURN_IF_ERROR(model::ParseComputeDtype(o.dtype, "--dtype").status());
  if (o.limits.image.max_encoded_bytes < 1 || o.limits.image.max_decoded_pixels < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_image_bytes and --max_decoded_pixels must be >= 1, got ",
                     o.limits.image.max_encoded_bytes, " and ", o.limits.image.max_decoded_pixels));
  }
  if (o.session_blob_ttl_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--session_blob_ttl_s must be >= 0 (0: blobs do not expire), got ", o.session_blob_ttl_s));
  }
  if (o.heap_trim_interval_ms < 0 || o.heap_trim_interval_ms > 3'600'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heap_trim_interval_ms must be in [0, 3600000] (0: never), got ",
                     o.heap_trim_interval_ms));
  }
  if (o.session_reap_interval_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--session_reap_interval_ms must be >= 1, got ", o.session_reap_interval_ms));
  }
  if (o.limits.max_images_per_request > o.batching.max_batch_images) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_images_per_request (images per request, ", o.limits.max_images_per_request,
        ") must not exceed --max_batch_images (images per batch, ", o.batching.max_batch_images,
        "): a request never splits"));
  }
  TOST_RETURN_IF_ERROR(ValidateGenerationSchedulerOptions(o.generation));
  TOST_RETURN_IF_ERROR(ValidateSessionStoreOptions(o.sessions));
  TOST_RETURN_IF_ERROR(ValidateRecordStoreOptions(o.responses));
  // A stored response continues through its state blob: one that expired first would be kept
  // only to be refused.
  if (o.session_blob_ttl_s > 0 && o.responses.ttl > absl::Seconds(o.session_blob_ttl_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--response_ttl_s (", absl::ToInt64Seconds(o.responses.ttl),
                     ") must not exceed --session_blob_ttl_s (", o.session_blob_ttl_s,
                     "): a stored response would outlive the state blob it continues from"));
  }
  TOST_RETURN_IF_ERROR(ValidateMetricsOptions(o.metrics));
  if (o.metrics.require_api_key && o.api_keys_file.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_require_api_key needs --api_keys_file: it makes scrapes carry one of its keys, "
        "and no key file was given");
  }
  if (o.http_port < -1 || o.http_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_port must be in [-1, 65535] (-1: no HTTP front end, 0 picks a free port), got ",
        o.http_port));
  }
  return absl::OkStatus();
}

namespace {

constexpr int kFinalMessagesGraceMs = 1000;

// Each admission pool's threads (handler_pool.h, AdmissionPools: calls that need no shared store
// on one, calls that wait on it on the other, so that a store that stops answering holds up only
// the second). Stateless admissions compute (parse, tokenise) and at times wait for a compile
// (bounded by --max_compile_ms); store-bound ones mostly wait for the store, whose client has 8
// connections: a few dozen each serve any number of cores. Past them calls wait in order, and past
// the queue they are refused RESOURCE_EXHAUSTED (HTTP 429 with Retry-After).
constexpr int kMaxAdmissionThreads = 32;
constexpr int kMaxQueuedAdmissions = 4096;

// tost_model_info's backend label: the LibTorch backend the model's placement runs it on, so a
// dashboard tells the models on a GPU from those on the CPU.
const char* ModelBackend(const model::Placement& placement) {
  return placement.cuda ? "libtorch_cuda" : "libtorch_cpu";
}

absl::StatusOr<SessionCodec> MakeCodec(const std::string& key_file, int64_t blob_ttl_s) {
  const SessionCodecOptions codec_options{.ttl = absl::Seconds(blob_ttl_s),
                                          .clock = RealClock::Get()};
  if (key_file.empty()) {
    Log(LogLevel::kWarning,
        "no --session_key_file: exported session blobs verify only on this process");
    return SessionCodec::WithRandomKey(codec_options);
  }
  TOST_ASSIGN_OR_RETURN(std::string contents, model::ReadFileToString(key_file));
  // One key (the whole file, as before key lists) or a "tost-session-keys" list: the first signs,
  // all verify, so keys rotate without refusing the blobs already handed out.
  auto keys = ParseSessionKeys(contents);
  if (!keys.ok())
    return absl::InvalidArgumentError(absl::StrCat(key_file, ": ", keys.status().message()));
  const size_t count = keys->size();
  auto codec = SessionCodec::Create(*std::move(keys), codec_options);
  if (!codec.ok())
    return absl::InvalidArgumentError(absl::StrCat(key_file, ": ", codec.status().message()));
  Log(LogLevel::kInfo, "session keys loaded",
      {{"file", key_file}, {"keys", static_cast<int64_t>(count)}, {"blob_ttl_s", blob_ttl_s}});
  return codec;
}

// The session store of --session_store (null for "memory") and, with a shared store, the shared
// tier of the prefix-state cache. Checked before any model loads, the shared store's credentials
// included: a store that refuses them stops the start (a replica that started would be ready,
// take traffic and fail every session call, and a restart reads the password file again), while
// one that cannot be reached does not (the store may be down at start-up).
absl::StatusOr<store::SharedStoreFactories> MakeSharedStore(const ServerOptions& o,
                                                            store::RedisClientObserver* observer) {
  if (o.session_store != "memory" && o.session_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--session_store names a shared store, which needs --session_key_file: every replica "
        "sharing the store must seal and verify its sessions with the same key (a per-process "
        "random key would make every other replica's sessions unreadable)");
  }
  store::SharedStoreFlags flags;
  flags.url = o.session_store;
  flags.password_file = o.session_store_password_file;
  flags.timeout = absl::Milliseconds(o.session_store_timeout_ms);
  flags.redis.lease = absl::Milliseconds(o.session_lease_ms);
  flags.redis.key_prefix = o.session_store_key_prefix;
  flags.prefix_ttl = o.sessions.idle_timeout;
  flags.observer = observer;
  if (o.session_store != "memory") {
    TOST_RETURN_IF_ERROR(store::ValidateRedisSessionStoreOptions(flags.redis, o.sessions));
  }
  TOST_ASSIGN_OR_RETURN(store::SharedStoreFactories factories,
                        store::MakeSharedStoreFactories(flags));
  if (factories.check_credentials) {
    const absl::Status reached = factories.check_credentials();
    if (absl::IsFailedPrecondition(reached)) return reached;
    if (reached.ok()) {
      // No field: --session_store may hold the password.
      Log(LogLevel::kInfo, "session store reached; it took the credentials");
    } else {
      Log(LogLevel::kWarning,
          "session store not reached at start-up; starting anyway: session calls answer "
          "UNAVAILABLE until it is",
          {{"error", FullErrorText(reached)}});
    }
  }
  return factories;
}

// Plaintext, TLS, or mutual TLS (the client certificate's identity then owns its sessions).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(const ServerOptions& o) {
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file must be given together");
  }
  if (o.tls_cert_file.empty()) {
    if (!o.tls_client_ca_file.empty())
      return absl::InvalidArgumentError("--tls_client_ca_file needs --tls_cert_file");
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  TOST_ASSIGN_OR_RETURN(std::string cert, model::ReadFileToString(o.tls_cert_file));
  TOST_ASSIGN_OR_RETURN(std::string key, model::ReadFileToString(o.tls_key_file));
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!o.tls_client_ca_file.empty()) {
    TOST_ASSIGN_OR_RETURN(ssl.pem_root_certs, model::ReadFileToString(o.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// What one listener asks of a caller, for its start-up line.
struct ListenerAuth {
  std::string_view tls;      // "off", "on", or "mutual" (client certificates required)
  std::string_view api_key;  // "required", or "not required" and why
  std::string_view open;     // with a key required: what it serves without one
};

// The start-up line of one listener: where it listens and what a caller must present, so that an
// operator sees at once what --host, an address flag or --api_keys_file left open.
void LogListener(std::string_view listener, const std::string& address, int port,
                 const ListenerAuth& auth) {
  Log(LogLevel::kInfo, "listening",
      {{"listener", listener},
       {"address", address},
       {"port", port},
       {"tls", auth.tls},
       {"api_key", auth.api_key},
       {"served_without_key", auth.open}});
}

// The gRPC and HTTP listeners': the same TLS files and keys, with the probes open.
ListenerAuth FrontEndAuth(const ServerOptions& o, bool keys, std::string_view probes) {
  return {.tls = o.tls_cert_file.empty()        ? "off"
                 : o.tls_client_ca_file.empty() ? "on"
                                                : "mutual",
          .api_key = keys ? "required" : "not required (no --api_keys_file)",
          .open = keys ? probes : "everything"};
}

ListenerAuth MetricsAuth(const ServerOptions& o, bool keys) {
  if (!keys) {
    return {.tls = "off", .api_key = "not required (no --api_keys_file)", .open = "everything"};
  }
  if (o.metrics.require_api_key) return {.tls = "off", .api_key = "required", .open = "nothing"};
  return {.tls = "off",
          .api_key = "not required (--metrics_require_api_key=false)",
          .open = "GET /metrics"};
}

constexpr std::string_view kGrpcProbes = "grpc.health.v1.Health";
constexpr std::string_view kHttpProbes = "GET /v1/health/live, GET /v1/health/ready";

// The compile worker for the engine, or "" for compiles in the server's threads: a configured
// --constraint_compiler that does not run refuses the start; without one, tost_constraint_compiler
// beside this binary, and where that does not run the log says compiles cannot be stopped.
absl::StatusOr<std::string> ResolveConstraintCompiler(const std::string& configured) {
  absl::StatusOr<std::string> found = FindConstraintCompiler(configured);
  if (found.ok()) return found;
  if (!configured.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--constraint_compiler=", configured, ": ", found.status().message()));
  }
  Log(LogLevel::kWarning,
      "constraint compiles run in the server's threads: one past --constraint_compile_kill_ms or "
      "--constraint_compile_memory_mb cannot be stopped",
      {{"reason", found.status().message()}});
  return std::string();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& given) {
  TOST_RETURN_IF_ERROR(ValidateServerOptions(given));
  const ServerOptions options = ResolveListenerAddresses(given);
  model::SetTorchThreads(options.intra_op_threads);
  model::DisableTf32();
  // The server's own --device must be available (a per-model override that is not fails that
  // model only): asking for CUDA where there is none stops the server with the reason.
  model::ServingOptions serving;
  TOST_ASSIGN_OR_RETURN(serving.device, model::ParseDeviceSpec(options.device, "--device"));
  TOST_ASSIGN_OR_RETURN(serving.dtype, model::ParseComputeDtype(options.dtype, "--dtype"));
  serving.decode_graphs = options.cuda_graphs;
  serving.cuda_device_count = model::CudaDeviceCount();
  TOST_ASSIGN_OR_RETURN(const model::Placement server_placement,
                        model::ResolvePlacement(serving.device, serving.dtype, std::nullopt,
                                                std::nullopt, serving.cuda_device_count, ""));
  TOST_ASSIGN_OR_RETURN(SessionCodec codec,
                        MakeCodec(options.session_key_file, options.session_blob_ttl_s));
  auto metrics = std::make_unique<Metrics>();
  TOST_ASSIGN_OR_RETURN(store::SharedStoreFactories shared_store,
                        MakeSharedStore(options, metrics.get()));
  Authenticator auth;
  TenantOptions tenants = options.tenants;
  if (!options.api_keys_file.empty()) {
    TOST_ASSIGN_OR_RETURN(auth, Authenticator::FromFile(options.api_keys_file));
    TOST_ASSIGN_OR_RETURN(
        tenants.table, TenantTable::FromFile(options.api_keys_file, TenantLineForm::kApiKeysFile));
  }
  if (!options.tenants_file.empty()) {
    TOST_ASSIGN_OR_RETURN(TenantTable named, TenantTable::FromFile(options.tenants_file,
                                                                   TenantLineForm::kTenantsFile));
    TOST_ASSIGN_OR_RETURN(tenants.table, TenantTable::Merge(tenants.table, named));
  }
  TOST_RETURN_IF_ERROR(ValidateTenantOptions(tenants));
  TOST_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        MakeCredentials(options));
  // Before any model loads, like the ports below: a --constraint_compiler that cannot run is
  // refused now.
  TOST_ASSIGN_OR_RETURN(const std::string constraint_compiler,
                        ResolveConstraintCompiler(options.constraints.compiler_path));
  // Before any model loads: a port another server holds is refused now, not after minutes of
  // loading (and gRPC's SO_REUSEPORT would otherwise share it silently).
  TOST_RETURN_IF_ERROR(CheckPortFree(options.host, options.port, "--port"));
  if (options.metrics.port > 0) {
    TOST_RETURN_IF_ERROR(
        CheckPortFree(options.metrics.address, options.metrics.port, "--metrics_port"));
  }
  if (options.http_port > 0) {
    TOST_RETURN_IF_ERROR(CheckPortFree(options.http_address, options.http_port, "--http_port"));
  }
  // The port answers from here on: NOT_SERVING (health) and UNAVAILABLE (everything else) while
  // the models load and warm up.
  TOST_ASSIGN_OR_RETURN(std::unique_ptr<LoadingResponder> loading,
                        LoadingResponder::Start(options.host, options.port, credentials));
  const bool keys = auth.keys_configured();
  LogListener("grpc", options.host, loading->port(), FrontEndAuth(options, keys, kGrpcProbes));
  std::unique_ptr<Server> server(new Server());
  server->metrics_ = std::move(metrics);
  if (shared_store.records) {
    TOST_ASSIGN_OR_RETURN(server->records_, shared_store.records(options.responses));
  } else {
    server->records_ = std::make_unique<MemoryRecordStore>(options.responses, RealClock::Get());
  }
  server->metrics_->WatchRecords(server->records_.get());
  server->auth_ = std::move(auth);
  server->limits_ = options.limits;
  server->admission_ =
      std::make_unique<HandlerPool>("admit", kMaxAdmissionThreads, kMaxQueuedAdmissions);
  server->store_admission_ =
      std::make_unique<HandlerPool>("admit-store", kMaxAdmissionThreads, kMaxQueuedAdmissions);
  if (server->metrics_ != nullptr) {
    server->metrics_->WatchAdmission(server->admission_.get(), server->store_admission_.get());
  }
  // The HTTP front end listens from here on too: health/live 200, health/ready and the API 503
  // while the models load.
  TOST_RETURN_IF_ERROR(server->StartHttp(options));
  if (server->http_ != nullptr) {
    LogListener("http", options.http_address, server->http_port(),
                FrontEndAuth(options, keys, kHttpProbes));
  }
  Log(LogLevel::kInfo, "loading models",
      {{"repository", options.model_repository},
       {"port", loading->port()},
       {"http_port", server->http_port()},
       {"device", server_placement.DeviceString()},
       {"dtype", model::ComputeDtypeName(server_placement.dtype)},
       {"cpu_precision_flags", model::CpuPrecisionFlags()},
       {"cuda_devices", serving.cuda_device_count}});
  // Loaded and warmed up before readiness: SERVING only once every model has run once.
  TOST_ASSIGN_OR_RETURN(server->repository_,
                        LoadedRepository::Load(options.model_repository, serving));
  for (const auto& m : server->repository_->models()) {
    if (m.status.ok()) {
      Log(LogLevel::kInfo, "model loaded",
          {{"model", m.name},
           {"architecture", model::ArchitectureName(m.config.architecture)},
           {"version", m.config.version},
           {"trained", m.config.trained},
           {"device", m.placement.DeviceString()},
           {"dtype", model::ComputeDtypeName(m.placement.dtype)},
           // Which product path the CPU's instructions gave the weights' precision.
           {"cpu_products",
            m.placement.cuda ? "cuda" : model::CpuProductsName(m.placement.CpuProductsUsed())},
           // A language model's lean CPU decode step: the memory its packed weights take.
           {"lean_decode_bytes", m.language != nullptr ? m.language->LeanDecodeBytes() : 0},
           // ... and the most rows it takes, chosen for this CPU's class (AVX2, AVX-512, AMX).
           {"lean_decode_max_rows", m.language != nullptr ? m.language->LeanDecodeMaxRows() : 0}});
      server->metrics_->RegisterModel(m.name, m.config.version, ModelBackend(m.placement),
                                      m.language != nullptr);
    } else {
      Log(LogLevel::kError, "model failed to load",
          {{"model", m.name}, {"error", FullErrorText(m.status)}});
    }
  }
  EngineOptions engine_options;
  engine_options.generation = options.generation;
  engine_options.generation.observer = server->metrics_.get();
  engine_options.batching = options.batching;
  engine_options.batching.observer = server->metrics_.get();
  engine_options.sessions = options.sessions;
  engine_options.sessions.observer = server->metrics_.get();
  engine_options.prefix_cache = options.prefix_cache;
  engine_options.constraints = options.constraints;
  engine_options.constraints.compiler_path = constraint_compiler;
  engine_options.tenants = std::move(tenants);
  engine_options.session_store = std::move(shared_store.sessions);
  engine_options.prefix_cache_tier = std::move(shared_store.prefix_tier);
  TOST_ASSIGN_OR_RETURN(server->engine_,
                        Engine::Create(server->repository_->Entries(), engine_options,
                                       std::move(codec), RealClock::Get()));
  server->service_ =
      std::make_unique<TostService>(*server->engine_, server->auth_, options.limits,
                                    server->admission_pools(), model::CudaDeviceMemory);
  server->kserve_ = std::make_unique<KServeService>(
      *server->engine_, server->auth_.keys_configured() ? &server->auth_ : nullptr, options.limits);

  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{tost::v1::Tost::service_full_name(),
                               inference::GRPCInferenceService::service_full_name(),
                               "grpc.health.v1.Health",
                               grpc::reflection::v1alpha::ServerReflection::service_full_name()},
      server->auth_, options.max_message_bytes);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // The same port as the loading responder (its own when --port=0), bound while the responder still
  // listens: gRPC sets SO_REUSEPORT, so connections never find the port closed in between.
  builder.AddListeningPort(absl::StrCat(options.host, ":", loading->port()), credentials,
                           &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options.min_client_ping_interval_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, options.max_ping_strikes);
  // Requests reach the services as the client compressed them, and RawService inflates them
  // (raw_request.h says why: gRPC 1.51 inflates in full before its size check).
  builder.AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options.max_connection_age_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               options.max_connection_age_grace_ms);
  }
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->kserve_.get());
  builder.RegisterService(server->reflection_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(server->metrics_->InterceptorFactory(options.metrics.log_requests));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("could not listen on ", options.host, ":",
                                               options.port,
                                               " (address in use or not permitted?)"));
  }
  auto* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  for (const char* service : kHealthCheckedServices) health->SetServingStatus(service, true);
  loading->Stop();
  if (options.connection_receive_buffer_bytes > 0 &&
      SetListenersReceiveBuffer(server->port_, options.connection_receive_buffer_bytes) == 0) {
    Log(LogLevel::kWarning, "could not set the receive buffer of the listening sockets",
        {{"port", server->port_},
         {"connection_receive_buffer_bytes", options.connection_receive_buffer_bytes}});
  }
  server->metrics_->WatchEngine(server->engine_.get());
  ScrapeAuthenticator scrape_auth;
  if (options.metrics.require_api_key) {
    scrape_auth = [raw = server.get()](const http::HttpRequest& r) {
      // The metrics port has no TLS, so no client certificate: a key or nothing.
      return raw->auth_.Identify(CallerCredentials{.api_key = r.Header("x-api-key"),
                                                   .authorization = r.Header("authorization"),
                                                   .tls_identity = {}});
    };
  }
  TOST_RETURN_IF_ERROR(server->metrics_->Serve(options.metrics, std::move(scrape_auth)));
  if (server->metrics_port() > 0) {
    LogListener("metrics", options.metrics.address, server->metrics_port(),
                MetricsAuth(options, keys));
  }
  server->serving_engine_ = server->engine_.get();
  server->ready_ = true;

  Server* raw = server.get();
  const absl::Duration reap_every = absl::Milliseconds(options.session_reap_interval_ms);
  server->reaper_ = std::thread([raw, reap_every] {
    NameThisThread("session-reaper");
    while (!raw->stop_reaper_.WaitForNotificationWithTimeout(reap_every)) {
      raw->engine_->ReapIdleSessions();
      if (auto* memory = dynamic_cast<MemoryRecordStore*>(raw->records_.get()))
        memory->ReapExpired();
    }
  });
  return server;
}

absl::Status Server::StartHttp(const ServerOptions& options) {
  if (options.http_port < 0) return absl::OkStatus();
  http::HttpServerOptions o;
  o.name = "http";
  o.address = options.http_address;
  o.port = options.http_port;
  o.tls_cert_file = options.tls_cert_file;
  o.tls_key_file = options.tls_key_file;
  o.tls_client_ca_file = options.tls_client_ca_file;
  o.log_requests = options.metrics.log_requests;
  o.observer = metrics_.get();
  o.error_response = [](int status, std::string_view message) {
    return http::ErrorResponse(status, message);
  };
  http::HttpRouter router;
  // The probes carry no API key: public, as grpc.health.v1 is.
  router.Handle("GET", "/v1/health/live",
                [](std::shared_ptr<http::HttpExchange> exchange) {
                  exchange->Respond(http::MakeResponse(200, R"({"status":"live"})"));
                },
                {.is_public = true});
  router.Handle(
      "GET", "/v1/health/ready",
      [this](std::shared_ptr<http::HttpExchange> exchange) {
        if (ready_.load()) {
          exchange->Respond(http::MakeResponse(200, R"({"status":"ready"})"));
        } else {
          exchange->Respond(http::ErrorResponse(absl::UnavailableError(
              "not ready: the server is loading its models or draining (readiness is on once "
              "every model is loaded and off from the drain's start)")));
        }
      },
      {.is_public = true});
  // The OpenAI-compatible API, on the engine's schedulers (as tost.v1 Generate).
  AddOpenAiRoutes([this] { return serving_engine_.load(); }, limits_, admission_pools(), router);
  AddResponsesRoutes([this] { return serving_engine_.load(); }, limits_, admission_pools(),
                     *records_, metrics_.get(), router);
  router.SetAuthenticator([this](const http::HttpRequest& r) {
    return auth_.Identify(CallerCredentials{.api_key = r.Header("x-api-key"),
                                            .authorization = r.Header("authorization"),
                                            .tls_identity = r.tls_client_identity});
  });
  auto started = http::HttpServer::Start(std::move(o), std::move(router));
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("--http_port/--http_address: ", started.status().message()));
  }
  http_ = *std::move(started);
  return absl::OkStatus();
}

Server::~Server() { Shutdown(0); }

void Server::StopBackground() {
  if (metrics_ != nullptr) metrics_->StopServing();  // its scrapes read engine_
  if (!stop_reaper_.HasBeenNotified()) stop_reaper_.Notify();
  if (reaper_.joinable()) reaper_.join();
}

void Server::Drain(int drain_timeout_ms) {
  if (server_ == nullptr) return;
  ready_ = false;
  server_->GetHealthCheckService()->SetServingStatus(false);
  // New generations and classifications are refused (UNAVAILABLE); queued classification requests
  // run now; admitted generations get until the deadline.
  engine_->StopAdmitting();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(drain_timeout_ms);
  while (engine_->generations_in_flight() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Whatever still runs ends now with FINISH_REASON_DRAINED and its state blob.
  engine_->Shutdown();
  // What is left are final messages (the drained streams' state blobs) and unary calls already
  // running: one second for them, so the whole drain stays within --drain_timeout_s + 1 s, inside
  // the orchestrator's grace period.
  Shutdown(kFinalMessagesGraceMs);
}

void Server::Shutdown(int grace_ms) {
  ready_ = false;
  StopBackground();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(grace_ms);
  // Both front ends stop taking requests now; what is in flight on either gets until `deadline`.
  if (http_ != nullptr) http_->StartDrain();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    // The engine first: its jobs end (drained), so the Generate streams finish.
    if (engine_ != nullptr) engine_->Shutdown();
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
    server_.reset();
  }
  if (http_ != nullptr) {
    http_->Drain(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    http_.reset();
  }
  if (metrics_ != nullptr) metrics_->WatchAdmission(nullptr, nullptr);
  // Each runs what is still queued (answering nobody) and joins its threads; the stateless pool
  // first, since its tasks hand calls over to the store pool.
  admission_.reset();
  store_admission_.reset();
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace tost::service
