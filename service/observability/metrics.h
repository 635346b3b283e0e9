// Prometheus metrics of the server. Every family is defined in metrics.cc, and the table of
// docs/metrics.md lists the same ones; tests/integration/test_metrics.py
// checks both against a real Prometheus server.
//
// Where the numbers come from:
//  - requests, request latency, rejections and the access log: a gRPC server interceptor (one
//    place for every RPC of every service, with the status code the client receives), and the
//    HTTP server's HttpObserver for the HTTP front end (route and HTTP status code);
//  - classification queue/compute time, batch sizes, images: DynamicBatcher's BatchObserver;
//  - generation batch sizes, prompt/generated tokens, TTFT, inter-token latency: the
//    GenerationScheduler's GenerationObserver (once per step);
//  - sessions, state bytes, budget, evictions, queue depths, resident and CUDA memory, whether
//    decode graphs run: read from their owners when Prometheus scrapes, so they are exact at that
//    instant and cost nothing between scrapes.
// Labels are bounded: model, rpc (methods of the registered services, else "other"), code,
// reason, state, workload, device; never a session or request id.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/support/server_interceptor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/api/handler_pool.h"
#include "service/engine/dynamic_batcher.h"
#include "service/engine/generation_scheduler.h"
#include "service/engine/record_store.h"
#include "service/engine/session_store.h"
#include "service/http/http_server.h"
#include "service/store/redis_client.h"

namespace tost::service {

class Engine;

struct MetricsOptions {
  // Where the /metrics HTTP endpoint listens. Empty: the server's --host (Server::Start fills it
  // in; Serve needs an address).
  std::string address;
  int port = 8502;  // 0: the kernel picks a free port; -1: no endpoint
  // With API keys (--api_keys_file), whether a scrape must carry one. Off by default: /metrics, on
  // its own port, is then the one route served without a key, so that a Prometheus without
  // credentials keeps scraping; keep it off the network with --metrics_address, or turn this on.
  bool require_api_key = false;
  // One access-log line per RPC (service/observability/logging.h).
  bool log_requests = true;
  // Also export the model server protocol's gauges under vLLM's names (vllm:num_requests_waiting,
  // ...: serving_protocol_metrics.h), so that an endpoint picker configured for vLLM reads them.
  bool vllm_names = false;
};

// Checks a scrape's credentials: an error (UNAUTHENTICATED: 401, PERMISSION_DENIED: 403) refuses
// it. Null: every scrape is served.
using ScrapeAuthenticator = std::function<absl::StatusOr<std::string>(const http::HttpRequest&)>;

absl::Status ValidateMetricsOptions(const MetricsOptions& options);

// The endpoint Prometheus scrapes: GET (or HEAD) /metrics answers `render()` in the text exposition
// format, other paths 404, other methods 405, on an HTTP server of service/http.
//
// Why not prometheus::Exposer (prometheus-cpp-pull): it runs CivetWeb, whose threads are created
// with a fixed small stack; in tost_server the loaded libraries' static TLS (LibTorch, ...) exceeds
// it and pthread_create fails with EINVAL. Nor a thread per connection: a server that times out
// each read rather than each request lets a few clients trickling a byte at a time hold every
// thread. The HTTP server's options below give each connection one deadline for its whole request
// header and another for its whole response, cap connections (dropping a slow sender for a new
// scrape) and header size, and close each connection after its answer, so no client can keep a
// scrape from being answered.
http::HttpServerOptions MetricsHttpOptions(const std::string& address, int port);
// `render` is called on the server's thread, once per complete GET (or HEAD) /metrics that
// `authenticate` (when set) admits; it is asked before the 404 of any other path too.
absl::StatusOr<std::unique_ptr<http::HttpServer>> StartMetricsHttpServer(
    std::function<std::string()> render, http::HttpServerOptions options,
    ScrapeAuthenticator authenticate = {});

class Metrics final : public BatchObserver,
                      public GenerationObserver,
                      public SessionStoreObserver,
                      public store::RedisClientObserver,
                      public ResponsesObserver,
                      public http::HttpObserver {
 public:
  Metrics();
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Starts the HTTP endpoint (GET /metrics) at options.address:options.port; nothing for port -1
  // (options.vllm_names applies to Render() either way).
  // Each scrape must pass `authenticate` when it is set (the server sets it for
  // options.require_api_key). UNAVAILABLE if the address cannot be bound.
  absl::Status Serve(const MetricsOptions& options, ScrapeAuthenticator authenticate = {});
  // Stops the endpoint (joins its threads). Idempotent. Call before whatever WatchCore() reads
  // dies.
  void StopServing();
  // The bound port; 0 when not serving.
  int port() const;

  // tost_model_info{model,version,backend} = 1, and the model's series (generation ones for a
  // language model, classification ones otherwise) start at zero.
  void RegisterModel(const std::string& name, const std::string& version,
                     const std::string& backend, bool generates);
  // Sessions and queue depths are read from `engine` at each scrape. Not owned; must outlive
  // serving.
  void WatchEngine(const Engine* engine);
  // Admissions running and queued (tost_admissions) are read from the two admission pools
  // (handler_pool.h, AdmissionPools) at each scrape, labelled pool="stateless" and pool="store".
  // Not owned; null stops reading one (before it goes).
  void WatchAdmission(const HandlerPool* stateless, const HandlerPool* store);
  // Stored responses and conversations held (tost_response_store_*) are read from `records` at
  // each scrape. Not owned; must outlive serving (null stops reading it).
  void WatchRecords(const RecordStore* records);

  // Counts every RPC (tost_requests_total, tost_request_duration_seconds, tost_rejections_total),
  // tags it with a request id (the client's x-request-id if valid, else a new one, echoed in the
  // response's initial metadata) and writes the access log line. Calls that end before their
  // handler for want of a request (api/before_handler.h: reset streams, calls without a message)
  // get no line each: one line a second at most counts them and names their first peers.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory(
      bool log_requests);

  // One finished RPC; `rpc` is a method name such as "Classify". What the interceptor calls.
  void ObserveRpc(std::string_view rpc, grpc::StatusCode code, absl::Duration elapsed);

  // BatchObserver (classification), GenerationObserver (generation) and SessionStoreObserver.
  // Refusals are counted by the component that refused, with its own reason
  // (tost_rejections_total): queue_full, draining, sessions_full; unauthenticated by the
  // interceptor.
  void OnBatch(const BatchRecord& record) override;
  void OnDropped(std::string_view model_name, BatchDropReason reason, int64_t images) override;
  void OnStep(const GenerationStepRecord& record) override;
  void OnRefused(std::string_view model, GenerationRefusal reason) override;
  // A WARNING log line naming the model and why its decode graphs were turned off (the gauge
  // tost_decode_graphs_enabled reads the mode from the engine at each scrape).
  void OnDecodeGraphsOff(std::string_view model, std::string_view decode_mode) override;
  void OnStoreFull() override;
  // The shared session store's client (tost_session_store_commands_total{outcome},
  // tost_session_store_command_duration_seconds, tost_session_store_reconnects_total).
  void OnCommand(absl::Duration latency, bool ok) override;
  void OnReconnect() override;
  // The Responses API (tost_responses_stored_total, tost_responses_stored_bytes_total,
  // tost_response_continuations_total, tost_previous_response_lookups_total{result}).
  void OnResponseStored(int64_t bytes) override;
  void OnPreviousResponseLookup(bool found) override;
  void OnContinuation() override;
  // The HTTP front end (tost_http_requests_total{route,code}, tost_http_request_duration_seconds
  // {route}): the route is the matched path, "other" for none, so the labels stay bounded.
  void OnRequestStarted(const http::HttpRequest& request) override;
  void OnRequestFinished(const http::HttpRequest& request, int status,
                         absl::Duration elapsed) override;

  // The text exposition format, exactly what GET /metrics returns.
  std::string Render() const;

 private:
  struct Impl;
  class EndedBeforeHandlerLog;
  class RpcInterceptor;
  class RpcInterceptorFactory;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tost::service
