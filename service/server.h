// Wiring: loads the model repository (service/runtime), builds the engine over it
// (service/engine), puts the tost.v1 and KServe v2 front ends (service/api), grpc.health.v1 and
// server reflection on one port (0 picks a free one) with the metrics interceptor
// (service/observability), starts the HTTP front end (service/http) on another, and drains and
// shuts both down.
//
// Listeners and what they ask of a caller. Every listener binds `host` unless its own address is
// set (http_address, metrics.address), so one flag keeps the whole server local. With API keys
// (api_keys_file) every route of every listener needs one, except:
//   - grpc.health.v1.Health (Check, Watch) on the gRPC port, and GET /v1/health/live and
//     GET /v1/health/ready on the HTTP port: the probes a kubelet (or a load balancer) calls,
//     which carry no key; they tell only whether the server is up and ready;
//   - GET /metrics on the metrics port unless metrics.require_api_key: a Prometheus without
//     credentials keeps scraping (metrics.h).
// While the models load, the gRPC port's responder answers health NOT_SERVING and refuses every
// other call UNAVAILABLE, key or not (loading_responder.h). Start logs one line per listener: its
// address, port, TLS, whether it needs a key, and what it serves without one.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "service/api/auth.h"
#include "service/api/handler_pool.h"
#include "service/api/kserve_service.h"
#include "service/api/reflection_service.h"
#include "service/api/tost_service.h"
#include "service/engine/engine.h"
#include "service/engine/record_store.h"
#include "service/http/http_server.h"
#include "service/observability/metrics.h"
#include "service/runtime/torch_models.h"

namespace tost::service {

struct ServerOptions {
  // The address of every listener whose own address (http_address, metrics.address) is empty.
  std::string host = "0.0.0.0";
  int port = 8500;  // 0: the kernel picks a free port (tests)
  std::string model_repository = "models";
  int max_message_bytes = 64 << 20;   // receive and send limit per message
  int keepalive_time_ms = 30'000;     // server pings idle connections this often
  int keepalive_timeout_ms = 10'000;  // and drops them if no ack arrives in time
  // HTTP/2 limits per connection, so one client cannot hold the server (rapid reset, ping floods,
  // a connection that never moves to another replica):
  int max_concurrent_streams = 1024;          // streams open at once on one connection
  int min_client_ping_interval_ms = 10'000;   // client pings more often than this are strikes;
  int max_ping_strikes = 2;                   // ... past this many the connection is closed
  int max_connection_age_ms = 1'800'000;      // then GOAWAY, so clients re-resolve (0: never)
  int max_connection_age_grace_ms = 600'000;  // streams open at GOAWAY get this long to end
  // The kernel receive buffer (SO_RCVBUF) of each accepted connection; 0 leaves the kernel's
  // autotuning (up to net.ipv4.tcp_rmem's maximum, 6 MiB by default). Bounded, a client that
  // floods streams is held back by TCP flow control at the rate gRPC parses them, instead of
  // megabytes of its frames being parsed in one go while other connections wait. The window it
  // gives a connection (the kernel doubles the value) caps one connection's upload rate at about
  // 2 x this / round-trip time.
  int connection_receive_buffer_bytes = 65'536;
  int intra_op_threads = 1;  // LibTorch threads; 0 = one per core
  // Where models run (model/config/device.h): auto (the first CUDA device, else the CPU), cpu,
  // cuda, cuda:N; config.json "serving" overrides per model. dtype: fp32, bf16 or fp16 anywhere,
  // int8 on the CPU only (device.h).
  std::string device = "auto";
  std::string dtype = "fp32";
  // CUDA language models: decode steps replayed from CUDA graphs captured per batch bucket (each
  // checked bit for bit against the eager step when captured); false: eager at the same shapes.
  bool cuda_graphs = true;
  ServiceLimits limits;
  GenerationSchedulerOptions generation;  // per language model
  DynamicBatcherOptions batching;         // per vision model (model_name is filled in per model)
  SessionStoreOptions sessions;
  PrefixCacheOptions prefix_cache;
  ConstraintCompilerOptions constraints;
  std::string session_key_file;  // key or key list for state blobs; empty = random per process
  // Where server-held sessions live: "memory" (this process) or
  // redis://[user:password@]host:port[/db], shared by every replica that names it and has the same
  // session key (service/store/redis_session_store.h).
  std::string session_store = "memory";
  std::string session_store_password_file;   // the store's password, instead of the URL's
  int64_t session_store_timeout_ms = 1'000;  // connecting to the store, and each command
  int64_t session_lease_ms = 10'000;         // a dead replica's sessions stay busy this long
  std::string session_store_key_prefix = "tost:";
  std::string api_keys_file;  // "name key" lines; empty = no API keys
  // "name [field=value ...]" lines (service/engine/tenants.h); empty = none. Its tenants, and those
  // of api_keys_file's lines, fill tenants.table at start-up.
  std::string tenants_file;
  TenantOptions tenants;      // the priority range and the token window
  std::string tls_cert_file;  // PEM certificate chain; with tls_key_file turns TLS on
  std::string tls_key_file;   // PEM private key
  std::string
      tls_client_ca_file;  // PEM CA; when set, clients must present a certificate it signed (mTLS)
  int64_t session_reap_interval_ms = 10'000;  // how often idle sessions are evicted
  int64_t session_blob_ttl_s = 0;             // state blobs expire this long after export; 0: never
  // Stored responses and conversations of the Responses API (service/openai_http/
  // responses_routes.h), in the session store: this process's memory, or the shared store.
  RecordStoreOptions responses;
  // Prometheus endpoint (port -1: none; address empty: `host`'s) and access logs.
  MetricsOptions metrics;
  // The HTTP front end: health routes and the OpenAI-compatible API (service/openai_http). Same
  // TLS files and API keys as the gRPC port. Port 0: a free one; -1: none. Address empty: `host`'s.
  std::string http_address;
  int http_port = 8501;
  // How often the heap's freed memory is checked and, after a burst freed enough, given back to
  // the system (service/heap_trim.h); 0: never.
  int64_t heap_trim_interval_ms = 5'000;
};

absl::Status ValidateServerOptions(const ServerOptions& options);

// `options` with every listener's address filled in: an empty http_address or metrics.address
// becomes `host`. Start resolves its options itself; a caller needs this to report the addresses.
ServerOptions ResolveListenerAddresses(ServerOptions options);

class Server {
 public:
  // Loads the repository and starts serving. Models that fail to load are reported (ListModels,
  // logs) while the others serve; a repository that cannot be read is an error.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }                   // 0: no metrics endpoint
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }  // 0: no HTTP front end
  Engine& engine() { return *engine_; }

  // Graceful stop: readiness off (health NOT_SERVING), no new generations, in-flight ones get up to
  // `drain_timeout_ms` to finish; those still running then end with FINISH_REASON_DRAINED and their
  // resumable state; finally the gRPC server and the HTTP front end stop (each request in flight on
  // them gets one more second).
  void Drain(int drain_timeout_ms);
  // Immediate stop (in-flight calls get `grace_ms`).
  void Shutdown(int grace_ms);
  void Wait();

 private:
  Server() = default;
  void StopBackground();
  absl::Status StartHttp(const ServerOptions& options);

  std::unique_ptr<Metrics>
      metrics_;  // first: the schedulers and batchers report to it until they die
  std::unique_ptr<LoadedRepository> repository_;  // before engine_: the engine's models live here
  std::unique_ptr<Engine> engine_;
  Authenticator auth_;
  ServiceLimits limits_;  // the OpenAI routes' (the gRPC services keep their own copy)
  // Both front ends' admissions (Generate's, the OpenAI routes'), off gRPC's callback threads and
  // the HTTP I/O threads, on two pools: calls that need no shared store on admission_, those that
  // wait on it (and the session RPCs, the stored responses' routes) on store_admission_
  // (handler_pool.h, AdmissionPools). After engine_ (their tasks use it), before service_ and http_
  // (gone before them, so nothing schedules on them once they run their last tasks).
  std::unique_ptr<HandlerPool> admission_;
  std::unique_ptr<HandlerPool> store_admission_;
  AdmissionPools admission_pools() { return {*admission_, *store_admission_}; }
  // Stored responses and conversations; before http_ (its routes use it), after metrics_ (which
  // reads its stats).
  std::unique_ptr<RecordStore> records_;
  std::unique_ptr<TostService> service_;
  std::unique_ptr<KServeService> kserve_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Readiness of the HTTP front end (GET /v1/health/ready), as gRPC health's SERVING: set once
  // serving, cleared when draining or stopping.
  std::atomic<bool> ready_{false};
  // What the OpenAI routes serve with: null while the models load (they answer 503), the engine
  // from readiness on.
  std::atomic<Engine*> serving_engine_{nullptr};
  std::unique_ptr<http::HttpServer> http_;  // after auth_ and engine_: its routes use them
  absl::Notification stop_reaper_;
  std::thread reaper_;
};

}  // namespace tost::service
