// tost_server: serves every model of a repository over gRPC, and over HTTP (service/http).
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/error_detail.h"
#include "base/status_macros.h"
#include "model/device/device_failure.h"
#include "service/flag_ranges.h"
#include "service/heap_trim.h"
#include "service/observability/grpc_log_bridge.h"
#include "service/observability/logging.h"
#include "service/open_files_limit.h"
#include "service/server.h"

namespace {
// Exit status of a replica whose CUDA device failed (EX_SOFTWARE-like, distinct from a start
// failure's 1), and how long its drain waits: the device answers nothing, so the streams' last good
// state is all there is to hand back, and the replacement should start soon.
constexpr int kExitDeviceLost = 70;
constexpr int kDeviceLostDrainMs = 2000;

// Exit status of a replica whose gRPC listener stopped accepting (EX_TEMPFAIL: a replacement will
// do). Set by gRPC's logging thread, read by main after SIGUSR2 woke it.
constexpr int kExitListenerFailed = 75;
std::atomic<bool> grpc_listener_failed{false};

void OnGrpcListenerFailure(std::string_view /*message: logged by the bridge itself*/) {
  grpc_listener_failed.store(true);
  kill(getpid(), SIGUSR2);
}
}  // namespace

ABSL_FLAG(std::string, model_repository, "models", "Directory with one sub-directory per model");
ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address every listener binds (gRPC, and HTTP and /metrics unless --http_address or "
          "--metrics_address say otherwise): 127.0.0.1 keeps the whole server on this machine");
ABSL_FLAG(int, port, 8500, "gRPC port; 0 picks a free port (printed on stdout)");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest gRPC message received or sent, in bytes; a compressed request may inflate to "
          "at most this many bytes too");
ABSL_FLAG(int, keepalive_time_ms, 30000, "Interval of server keepalive pings on idle connections");
ABSL_FLAG(int, keepalive_timeout_ms, 10000, "Time to wait for a keepalive ack before closing");
ABSL_FLAG(int, max_concurrent_streams, 1024, "HTTP/2 streams open at once on one connection");
ABSL_FLAG(int, min_client_ping_interval_ms, 10000,
          "Client pings closer together than this (without data) are strikes");
ABSL_FLAG(int, max_ping_strikes, 2, "Ping strikes after which a connection is closed");
ABSL_FLAG(int, max_connection_age_ms, 1800000,
          "Connections older than this get GOAWAY, so clients re-resolve and rebalance; 0 = never");
ABSL_FLAG(int, max_connection_age_grace_ms, 600000,
          "Streams open at a connection's GOAWAY get this long to finish");
ABSL_FLAG(int, connection_receive_buffer_bytes, 65536,
          "Kernel receive buffer (SO_RCVBUF) of each accepted connection: a client flooding "
          "streams is held back by TCP flow control instead of being read megabytes at a time "
          "while other connections wait; caps one connection's upload at about 2 x this / RTT. "
          "0 = the kernel's autotuning");
ABSL_FLAG(std::string, device, "auto",
          "Where models run: auto (the first CUDA device, else the CPU), cpu, cuda or cuda:N; a "
          "model's config.json \"serving\": {\"device\": ...} overrides it. Asking for CUDA where "
          "there is none stops the server");
ABSL_FLAG(
    std::string, dtype, "fp32",
    "Model precision: fp32, bf16, fp16 or int8 (the CPU only). On CUDA the weights and "
    "activations; on the CPU the dense weights and embeddings, stored in that precision at load "
    "(int8: the dense weights quantised per output channel, the tied embedding bf16; "
    "activations, norms and TSSA statistics stay fp32 everywhere, so state blobs move between "
    "precisions); config.json \"serving\": {\"dtype\": ...} overrides it per model");
ABSL_FLAG(bool, cuda_graphs, true,
          "CUDA language models: replay decode steps from CUDA graphs captured per batch bucket "
          "(each checked against the eager step when captured; ServerStatus decode_mode says which "
          "runs); false runs them eagerly at the same padded batch sizes");
ABSL_FLAG(int, intra_op_threads, 1,
          "LibTorch intra-op threads per model thread; 0 = one per core. The generation scheduler "
          "and the classification batcher are the parallelism: 1 keeps 2 cores from "
          "oversubscription");
ABSL_FLAG(int, drain_timeout_s, 30,
          "On SIGTERM/SIGINT: readiness off, in-flight generations get this long to "
          "finish, then end with FINISH_REASON_DRAINED and a resumable state blob");
ABSL_FLAG(int64_t, max_images_per_request, 8,
          "Classification: most images in one Classify or ModelInfer request (at most "
          "--max_batch_images, since a request is never split across batches)");
// The old name of --max_images_per_request. It read as the batched forward's size, which is
// --max_batch_images; accepted so existing deployments keep starting, with a warning.
ABSL_FLAG(std::optional<int64_t>, max_batch_size, std::nullopt,
          "Deprecated: the old name of --max_images_per_request (it never set the batch size; "
          "--max_batch_images does). Accepted with a warning; giving both with different values "
          "stops the start");
ABSL_FLAG(int64_t, max_tensor_elements, 64LL << 20, "Most float32 values in one Classify tensor");
ABSL_FLAG(int64_t, max_image_bytes, 16LL << 20,
          "Most bytes of one encoded PNG/JPEG image (Classify images, KServe BYTES)");
ABSL_FLAG(int64_t, max_decoded_pixels, 40000000,
          "Most pixels (width x height, from the image header) one encoded image may declare; "
          "checked before decoding");
ABSL_FLAG(int64_t, max_prompt_bytes, 1 << 20, "Most bytes (or token ids) in one Generate prompt");
ABSL_FLAG(int, max_new_tokens, 4096, "Largest max_new_tokens a Generate request may ask for");
ABSL_FLAG(int64_t, max_batch_images, 8,
          "Classification: images per batched forward (per vision model)");
ABSL_FLAG(int64_t, max_queue_delay_us, 2000,
          "Classification: longest a request waits for its batch to fill");
ABSL_FLAG(int64_t, max_queue_size, 64,
          "Classification: requests waiting per vision model; more get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, classify_timeout_us, 10000000,
          "Classification: default deadline of a request without one");
ABSL_FLAG(int, max_active_generations, 64,
          "Sequences decoded together per language model (one batched step)");
ABSL_FLAG(int, max_queued_generations, 256,
          "Generations admitted and waiting to become active (see --max_active_generations), per "
          "language model");
ABSL_FLAG(int, prefill_chunk_tokens, 128,
          "Prompt tokens per prefill chunk (interleaved with decode steps)");
ABSL_FLAG(int, prefill_yield_tokens, 16,
          "While calls of another tenant (or more urgent ones) have been arriving, prefill runs in "
          "pieces of this many tokens and stops between them to admit such a call, which then "
          "waits for one piece, not a whole chunk; 0 = whole chunks, never stopped");
ABSL_FLAG(int, prefill_yield_window_s, 60,
          "How recent another tenant's (or a more urgent) call must be for "
          "--prefill_yield_tokens' short pieces: its next call will not wait for a chunk, but the "
          "first after a quiet window may; 0 = only stop for arrivals, never shorten pieces");
ABSL_FLAG(bool, batch_invariant_decode, false,
          "Decode each sequence with a fixed shape so its tokens are bit-identical under any "
          "concurrent load "
          "(slower); default: batched products, identical for the same batch composition");
ABSL_FLAG(int, stream_stall_timeout_ms, 30000,
          "A Generate stream whose client has left 8 tokens unread for this long is cancelled, its "
          "state kept for its session; 0 = never");
ABSL_FLAG(int64_t, max_sessions, 4096,
          "Server-held sessions at once (LRU eviction of idle ones beyond); with a shared "
          "--session_store: the sessions kept hot in this replica's memory (the store holds all)");
ABSL_FLAG(int64_t, session_budget_bytes, 256LL << 20,
          "Bytes of session state held at once (LRU eviction beyond); with a shared "
          "--session_store: of the sessions kept hot in this replica's memory");
ABSL_FLAG(std::string, session_store, "memory",
          "Where server-held sessions live: memory (this process; they end with it) or "
          "redis://[user:password@]host:port[/db] (Redis 7 or Valkey, shared by every replica "
          "with the same --session_key_file: any replica continues any session by id, and "
          "sessions survive restarts)");
ABSL_FLAG(std::string, session_store_password_file, "",
          "File holding the session store's password (trailing newline ignored), instead of "
          "putting it in the --session_store URL");
ABSL_FLAG(int64_t, session_store_timeout_ms, 1000,
          "Connecting to the session store, and each command to it: past this a session call "
          "answers UNAVAILABLE");
ABSL_FLAG(int64_t, session_lease_ms, 10000,
          "With a shared --session_store: how long a replica's claim on a session it is "
          "generating on outlives the replica (renewed while the call runs)");
ABSL_FLAG(std::string, session_store_key_prefix, "tost:",
          "With a shared --session_store: the prefix of every key, so deployments can share a "
          "store");
ABSL_FLAG(int64_t, prefix_cache_bytes, 64LL << 20,
          "Bytes of the prefix-state cache: sequence statistics at exact prompt and reply ends, "
          "so a client resending a conversation prefills only its new tokens (per owner; LRU "
          "beyond); 0 disables it");
ABSL_FLAG(int64_t, constraint_cache_entries, 256,
          "Compiled constraints (JSON schemas, regexes, grammars, choices) kept per language "
          "model, least recently used evicted first; a request with a cached one skips its "
          "compile");
ABSL_FLAG(int64_t, constraint_cache_bytes, 256LL << 20,
          "Bytes the compiled constraints of one language model may hold (grammars and their "
          "token masks, least recently used evicted first); a constraint whose compiled form "
          "takes more than an eighth of this is refused (INVALID_ARGUMENT)");
ABSL_FLAG(int64_t, constraint_mask_threads, 2,
          "Threads per language model computing constrained rows' token masks while a decode "
          "step's forward runs (in parallel over rows), at most the CPUs the server may run on "
          "less one; 0 (or one CPU): after the forward, on the scheduler's thread");
ABSL_FLAG(int64_t, constraint_compile_timeout_ms, 2000,
          "How long a constrained request waits for its constraint's compile before it is refused "
          "(RESOURCE_EXHAUSTED); the compile goes on and enters the cache, so a retry may find it");
ABSL_FLAG(int64_t, constraint_compile_kill_ms, 10000,
          "A constraint compile still running this long after it started is stopped (its worker "
          "process killed) and its constraint refused from then on (INVALID_ARGUMENT); more than "
          "--constraint_compile_timeout_ms");
ABSL_FLAG(int64_t, constraint_compile_memory_mb, 256,
          "Address space of each constraint compile's worker process: a compile that needs more "
          "is stopped and its constraint refused from then on (INVALID_ARGUMENT)");
ABSL_FLAG(int64_t, constraint_compile_slots, 4,
          "Constraint compiles running at once per language model; a request that would start "
          "one more waits for one to end, within --constraint_compile_timeout_ms, else is refused "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, constraint_compile_slots_per_caller, 2,
          "Of --constraint_compile_slots, the most that one caller's requests may hold (a caller: "
          "an API key's name or a TLS client identity; callers without either are one), so that "
          "one caller's slow compiles leave the others slots");
ABSL_FLAG(std::string, constraint_compiler, "",
          "The constraint compile worker executable; empty: tost_constraint_compiler beside "
          "tost_server, and when that is missing compiles run in the server's threads, where one "
          "past --constraint_compile_kill_ms or --constraint_compile_memory_mb cannot be stopped "
          "(logged at startup)");
ABSL_FLAG(int64_t, session_idle_timeout_s, 1800, "Sessions unused this long are evicted");
ABSL_FLAG(std::string, session_key_file, "",
          "Secret (>= 16 bytes) authenticating exported session blobs; replicas that share it "
          "continue each other's sessions. The whole file is the key, or, when its first line is "
          "\"tost-session-keys\", one key per line (literal or base64:...; # comments): the first "
          "signs, all verify (rotation). Empty: a random key, blobs verify only on this process");
ABSL_FLAG(
    int64_t, session_blob_ttl_s, 0,
    "Exported session blobs are refused this many seconds after export (FAILED_PRECONDITION); "
    "0 = they do not expire");
ABSL_FLAG(int64_t, response_ttl_s, 30 * 24 * 3600,
          "Stored responses and conversations of the Responses API (POST /v1/responses, "
          "/v1/conversations) expire this many seconds after their last write (OpenAI keeps "
          "them 30 days); at most --session_blob_ttl_s when that is set, since a response "
          "continues through its state blob");
ABSL_FLAG(int64_t, response_store_max_bytes, int64_t{256} << 20,
          "With --session_store=memory: bytes of stored responses and conversations this process "
          "holds; the least recently used are evicted past it (a shared store is bounded by its "
          "own memory policy)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain: with --tls_key_file, serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA: require client certificates it signed (mTLS); the certificate's identity owns "
          "its sessions");
ABSL_FLAG(std::string, api_keys_file, "",
          "\"name key\" lines; when set, every call on every port needs one of the keys "
          "(x-api-key, or authorization: Bearer <key>) except the health probes (grpc.health.v1, "
          "GET /v1/health/live and /v1/health/ready) and, without --metrics_require_api_key, "
          "GET /metrics");
ABSL_FLAG(std::string, tenants_file, "",
          "\"name [weight=W] [max_concurrent=N] [tokens_per_minute=N] [max_sessions=N] "
          "[max_session_bytes=N] [highest_priority=P]\" lines: each tenant (an API key's name, "
          "tls:<identity>, or anonymous) with its share of generation slots, its quotas and the "
          "lowest priority it may ask for (docs/deploying.md); the same fields may follow the key "
          "on --api_keys_file's lines. Empty: every tenant weighs 1 with no quota");
ABSL_FLAG(int, max_priority, 100,
          "Generation requests' priority must be in [-max_priority, max_priority]; lower runs "
          "sooner, and preempts (parks) the highest-valued running generation when every slot is "
          "taken");
ABSL_FLAG(int, tenant_token_window_s, 60,
          "Seconds over which tokens_per_minute quotas are counted (the quota scales with it: 10 "
          "counts a sixth of the per-minute figure); 60 but for tests");
ABSL_FLAG(int, metrics_port, 8502,
          "Prometheus /metrics HTTP port; 0 picks a free port (printed on stdout), -1 disables it");
ABSL_FLAG(std::string, metrics_address, "",
          "Address the /metrics endpoint listens on; empty: --host's");
ABSL_FLAG(bool, metrics_require_api_key, false,
          "With --api_keys_file, scrapes of /metrics need a key too (x-api-key, or authorization: "
          "Bearer <key>); off, /metrics is served to anyone who reaches --metrics_address");
ABSL_FLAG(bool, metrics_vllm_names, false,
          "Also export the model server protocol's gauges (tost_generation_requests_waiting, "
          "tost_generation_requests_running, tost_state_budget_utilization, "
          "tost_prefix_cache_config_info) under vLLM's names (vllm:num_requests_waiting, "
          "vllm:num_requests_running, vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc, "
          "vllm:cache_config_info), so that an inference gateway's endpoint picker configured for "
          "vLLM reads them unchanged");
ABSL_FLAG(int, http_port, 8501,
          "HTTP front end port (health routes, the OpenAI-compatible API), beside gRPC's; same TLS "
          "files and API keys (Authorization: Bearer <key>). 0 picks a free port (printed on "
          "stdout), -1 disables it");
ABSL_FLAG(std::string, http_address, "", "Address the HTTP front end listens on; empty: --host's");
ABSL_FLAG(std::string, log_format, "text",
          "Logs on stderr: \"text\", or \"json\" (one JSON object per line)");
ABSL_FLAG(int64_t, heap_trim_interval_ms, 5000,
          "How often the server checks the memory its heap holds freed and, when more than 64 MiB "
          "is (after a burst: a flood of reset streams, a surge of large requests), returns it "
          "to the system (malloc_trim); in [0, 3600000], 0 = never");
ABSL_FLAG(bool, log_requests, true,
          "One access-log line per RPC (method, code, duration, request id) and per HTTP request "
          "(method, path, status, duration, request id)");

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kDayS = 24 * 3600;

// Every numeric flag's accepted range, checked before anything starts.
absl::Status CheckNumericFlags() {
  using tost::service::FlagRange;
  const FlagRange ranges[] = {
      {"port", absl::GetFlag(FLAGS_port), 0, 65535, "0 picks a free port"},
      {"max_message_bytes", absl::GetFlag(FLAGS_max_message_bytes), 1024, kInt32Max},
      {"keepalive_time_ms", absl::GetFlag(FLAGS_keepalive_time_ms), 1, kInt32Max},
      {"keepalive_timeout_ms", absl::GetFlag(FLAGS_keepalive_timeout_ms), 1, kInt32Max},
      {"max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams), 1, 1 << 20},
      {"min_client_ping_interval_ms", absl::GetFlag(FLAGS_min_client_ping_interval_ms), 0,
       kInt32Max},
      {"max_ping_strikes", absl::GetFlag(FLAGS_max_ping_strikes), 0, kInt32Max,
       "0 = any number of bad pings"},
      {"max_connection_age_ms", absl::GetFlag(FLAGS_max_connection_age_ms), 0, kInt32Max,
       "0 = never"},
      {"max_connection_age_grace_ms", absl::GetFlag(FLAGS_max_connection_age_grace_ms), 0,
       kInt32Max},
      {"connection_receive_buffer_bytes", absl::GetFlag(FLAGS_connection_receive_buffer_bytes), 0,
       1 << 30, "0 = the kernel's autotuning"},
      {"intra_op_threads", absl::GetFlag(FLAGS_intra_op_threads), 0, 1024, "0 = one per core"},
      {"drain_timeout_s", absl::GetFlag(FLAGS_drain_timeout_s), 0, kDayS},
      {"max_images_per_request", absl::GetFlag(FLAGS_max_images_per_request), 1, 4096},
      {"max_batch_size", absl::GetFlag(FLAGS_max_batch_size).value_or(1), 1, 4096},
      {"max_tensor_elements", absl::GetFlag(FLAGS_max_tensor_elements), 1, int64_t{1} << 31},
      {"max_image_bytes", absl::GetFlag(FLAGS_max_image_bytes), 1, int64_t{1} << 31},
      {"max_decoded_pixels", absl::GetFlag(FLAGS_max_decoded_pixels), 1, int64_t{1} << 34},
      {"max_prompt_bytes", absl::GetFlag(FLAGS_max_prompt_bytes), 1, int64_t{1} << 30},
      {"max_new_tokens", absl::GetFlag(FLAGS_max_new_tokens), 1, 1 << 24},
      {"max_batch_images", absl::GetFlag(FLAGS_max_batch_images), 1, 4096},
      {"max_queue_delay_us", absl::GetFlag(FLAGS_max_queue_delay_us), 0, 60'000'000},
      {"max_queue_size", absl::GetFlag(FLAGS_max_queue_size), 1, 1 << 20},
      {"classify_timeout_us", absl::GetFlag(FLAGS_classify_timeout_us), 0, kDayS * 1'000'000,
       "0 = no default deadline"},
      {"max_active_generations", absl::GetFlag(FLAGS_max_active_generations), 1, 4096},
      {"max_queued_generations", absl::GetFlag(FLAGS_max_queued_generations), 0, 1 << 20},
      {"max_priority", absl::GetFlag(FLAGS_max_priority), 0, 1'000'000},
      {"tenant_token_window_s", absl::GetFlag(FLAGS_tenant_token_window_s), 1, 3600},
      {"prefill_chunk_tokens", absl::GetFlag(FLAGS_prefill_chunk_tokens), 1, 1 << 20},
      {"prefill_yield_tokens", absl::GetFlag(FLAGS_prefill_yield_tokens), 0, 1 << 20,
       "0 = whole chunks, never stopped"},
      {"prefill_yield_window_s", absl::GetFlag(FLAGS_prefill_yield_window_s), 0, kDayS},
      {"stream_stall_timeout_ms", absl::GetFlag(FLAGS_stream_stall_timeout_ms), 0, kDayS * 1000,
       "0 = never"},
      {"max_sessions", absl::GetFlag(FLAGS_max_sessions), 1, int64_t{1} << 32},
      {"session_budget_bytes", absl::GetFlag(FLAGS_session_budget_bytes), 1, int64_t{1} << 48},
      {"session_idle_timeout_s", absl::GetFlag(FLAGS_session_idle_timeout_s), 1, 365 * kDayS},
      {"session_store_timeout_ms", absl::GetFlag(FLAGS_session_store_timeout_ms), 10, 60'000},
      {"session_lease_ms", absl::GetFlag(FLAGS_session_lease_ms), 100, kDayS * 1000},
      {"prefix_cache_bytes", absl::GetFlag(FLAGS_prefix_cache_bytes), 0, int64_t{1} << 48,
       "0 = no prefix cache"},
      {"constraint_cache_entries", absl::GetFlag(FLAGS_constraint_cache_entries), 1, 1 << 20},
      {"constraint_cache_bytes", absl::GetFlag(FLAGS_constraint_cache_bytes), 1 << 16,
       int64_t{1} << 40},
      {"constraint_mask_threads", absl::GetFlag(FLAGS_constraint_mask_threads), 0, 256},
      {"constraint_compile_timeout_ms", absl::GetFlag(FLAGS_constraint_compile_timeout_ms), 0,
       600'000, "0 = only constraints already compiled"},
      {"constraint_compile_kill_ms", absl::GetFlag(FLAGS_constraint_compile_kill_ms), 1, 600'000},
      {"constraint_compile_memory_mb", absl::GetFlag(FLAGS_constraint_compile_memory_mb), 16,
       1 << 20},
      {"constraint_compile_slots", absl::GetFlag(FLAGS_constraint_compile_slots), 1, 256},
      {"constraint_compile_slots_per_caller",
       absl::GetFlag(FLAGS_constraint_compile_slots_per_caller), 1, 256},
      {"session_blob_ttl_s", absl::GetFlag(FLAGS_session_blob_ttl_s), 0, 10 * 365 * kDayS,
       "0 = blobs do not expire"},
      {"response_ttl_s", absl::GetFlag(FLAGS_response_ttl_s), 1, 10 * 365 * kDayS},
      {"response_store_max_bytes", absl::GetFlag(FLAGS_response_store_max_bytes), 1 << 20,
       int64_t{1} << 48},
      {"heap_trim_interval_ms", absl::GetFlag(FLAGS_heap_trim_interval_ms), 0, 3'600'000,
       "0 = never"},
      {"metrics_port", absl::GetFlag(FLAGS_metrics_port), -1, 65535,
       "-1 = no endpoint, 0 picks a free port"},
      {"http_port", absl::GetFlag(FLAGS_http_port), -1, 65535,
       "-1 = no HTTP front end, 0 picks a free port"},
  };
  TOST_RETURN_IF_ERROR(tost::service::CheckFlagRanges(ranges));
  // A compile is stopped only after its request stopped waiting for it.
  if (absl::GetFlag(FLAGS_constraint_compile_kill_ms) <=
      absl::GetFlag(FLAGS_constraint_compile_timeout_ms)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--constraint_compile_kill_ms=", absl::GetFlag(FLAGS_constraint_compile_kill_ms),
        ": expected more than --constraint_compile_timeout_ms (",
        absl::GetFlag(FLAGS_constraint_compile_timeout_ms), ")"));
  }
  if (absl::GetFlag(FLAGS_constraint_compile_slots_per_caller) >
      absl::GetFlag(FLAGS_constraint_compile_slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--constraint_compile_slots_per_caller=",
                     absl::GetFlag(FLAGS_constraint_compile_slots_per_caller),
                     ": expected at most --constraint_compile_slots (",
                     absl::GetFlag(FLAGS_constraint_compile_slots), ")"));
  }
  const std::pair<const char*, int> ports[] = {{"port", absl::GetFlag(FLAGS_port)},
                                               {"metrics_port", absl::GetFlag(FLAGS_metrics_port)},
                                               {"http_port", absl::GetFlag(FLAGS_http_port)}};
  for (size_t i = 0; i < std::size(ports); ++i) {
    for (size_t j = i + 1; j < std::size(ports); ++j) {
      if (ports[i].second > 0 && ports[i].second == ports[j].second) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", ports[i].first, " and --", ports[j].first, " are both ",
                         ports[i].second, ": give each its own port"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves ToST models over gRPC. Example: tost_server --model_repository=models --port=8500");
  absl::ParseCommandLine(argc, argv);
  // Debian builds Abseil without NDEBUG, so by default every absl::Mutex lock, gRPC's included,
  // records its lock order in one process-wide graph behind one global lock, and every destroyed
  // mutex is removed from it. Under a flood of calls that serialises gRPC's threads on bookkeeping
  // a release build does not do; the unit tests keep the detection.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const auto log_format = tost::service::ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!log_format.ok()) {
    std::cerr << "tost_server: " << log_format.status().message() << "\n";
    return 1;
  }
  tost::service::SetLogFormat(*log_format);
  tost::service::RouteGrpcLogsToServerLog();  // before any gRPC object: gRPC core's lines too
  if (absl::Status ranges = CheckNumericFlags(); !ranges.ok()) {
    std::cerr << "tost_server: " << ranges.message() << "\n";
    return 1;
  }

  // Block the stop signals in every thread (gRPC's and LibTorch's inherit the mask); main waits for
  // them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  // Raised by the process itself when a CUDA error has lost the device, or gRPC's listener has
  // stopped accepting (see below).
  sigaddset(&stop_signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  tost::service::SetListenerFailureHandler(&OnGrpcListenerFailure);

  if (auto files = tost::service::RaiseOpenFilesLimit(); files.ok()) {
    tost::service::Log(
        files->soft < 4096 ? tost::service::LogLevel::kWarning : tost::service::LogLevel::kInfo,
        "open files limit",
        {{"soft", files->soft}, {"hard", files->hard}, {"soft_at_start", files->soft_before}});
  } else {
    tost::service::Log(tost::service::LogLevel::kWarning, "open files limit left as it was",
                       {{"error", std::string(files.status().message())}});
  }

  // Debian's Abseil keeps IsSpecifiedOnCommandLine() private: the current name counts as given
  // when it differs from its default, the old one (optional, no default) when it has a value.
  const std::optional<int64_t> old_images_per_request = absl::GetFlag(FLAGS_max_batch_size);
  const int64_t images_per_request_flag = absl::GetFlag(FLAGS_max_images_per_request);
  const auto images_per_request = tost::service::ResolveRenamedFlag(
      {"max_images_per_request", images_per_request_flag,
       absl::GetFlagReflectionHandle(FLAGS_max_images_per_request).CurrentValue() !=
           absl::GetFlagReflectionHandle(FLAGS_max_images_per_request).DefaultValue(),
       "max_batch_size", old_images_per_request.value_or(0), old_images_per_request.has_value()});
  if (!images_per_request.ok()) {
    std::cerr << "tost_server: " << images_per_request.status().message() << "\n";
    return 1;
  }
  if (!images_per_request->warning.empty()) {
    tost::service::Log(tost::service::LogLevel::kWarning, images_per_request->warning);
  }

  tost::service::ServerOptions options;
  options.model_repository = absl::GetFlag(FLAGS_model_repository);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  // The same limit for a compressed request once inflated (the services inflate it themselves).
  options.limits.max_request_bytes = options.max_message_bytes;
  options.keepalive_time_ms = absl::GetFlag(FLAGS_keepalive_time_ms);
  options.keepalive_timeout_ms = absl::GetFlag(FLAGS_keepalive_timeout_ms);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.min_client_ping_interval_ms = absl::GetFlag(FLAGS_min_client_ping_interval_ms);
  options.max_ping_strikes = absl::GetFlag(FLAGS_max_ping_strikes);
  options.max_connection_age_ms = absl::GetFlag(FLAGS_max_connection_age_ms);
  options.max_connection_age_grace_ms = absl::GetFlag(FLAGS_max_connection_age_grace_ms);
  options.connection_receive_buffer_bytes = absl::GetFlag(FLAGS_connection_receive_buffer_bytes);
  options.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  options.device = absl::GetFlag(FLAGS_device);
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.limits.max_images_per_request = images_per_request->value;
  options.limits.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.limits.image.max_encoded_bytes = absl::GetFlag(FLAGS_max_image_bytes);
  options.limits.image.max_decoded_pixels = absl::GetFlag(FLAGS_max_decoded_pixels);
  options.limits.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes);
  options.limits.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.batching.max_batch_images = absl::GetFlag(FLAGS_max_batch_images);
  options.batching.max_queue_delay_us = absl::GetFlag(FLAGS_max_queue_delay_us);
  options.batching.max_queue_size = absl::GetFlag(FLAGS_max_queue_size);
  options.batching.timeout_us = absl::GetFlag(FLAGS_classify_timeout_us);
  options.generation.max_active_jobs = absl::GetFlag(FLAGS_max_active_generations);
  options.generation.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_generations);
  options.generation.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  options.generation.prefill_yield_tokens = absl::GetFlag(FLAGS_prefill_yield_tokens);
  options.generation.prefill_yield_window =
      absl::Seconds(absl::GetFlag(FLAGS_prefill_yield_window_s));
  options.generation.batch_invariant = absl::GetFlag(FLAGS_batch_invariant_decode);
  options.generation.mask_threads =
      static_cast<int32_t>(absl::GetFlag(FLAGS_constraint_mask_threads));
  options.generation.stream_stall_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_stream_stall_timeout_ms));
  options.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.sessions.max_state_bytes = absl::GetFlag(FLAGS_session_budget_bytes);
  options.sessions.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_session_idle_timeout_s));
  options.prefix_cache.max_bytes = absl::GetFlag(FLAGS_prefix_cache_bytes);
  options.constraints.max_entries = absl::GetFlag(FLAGS_constraint_cache_entries);
  options.constraints.max_compile_ms = absl::GetFlag(FLAGS_constraint_compile_timeout_ms);
  options.constraints.max_bytes = absl::GetFlag(FLAGS_constraint_cache_bytes);
  options.constraints.kill_ms = absl::GetFlag(FLAGS_constraint_compile_kill_ms);
  options.constraints.memory_bytes = absl::GetFlag(FLAGS_constraint_compile_memory_mb) << 20;
  options.constraints.max_compiles = absl::GetFlag(FLAGS_constraint_compile_slots);
  options.constraints.max_compiles_per_caller =
      absl::GetFlag(FLAGS_constraint_compile_slots_per_caller);
  // The server looks for the worker (Server::Start): empty is "beside tost_server".
  options.constraints.compiler_path = absl::GetFlag(FLAGS_constraint_compiler);
  options.session_key_file = absl::GetFlag(FLAGS_session_key_file);
  options.session_blob_ttl_s = absl::GetFlag(FLAGS_session_blob_ttl_s);
  options.responses.ttl = absl::Seconds(absl::GetFlag(FLAGS_response_ttl_s));
  if (options.session_blob_ttl_s > 0) {
    options.responses.ttl =
        std::min(options.responses.ttl, absl::Seconds(options.session_blob_ttl_s));
  }
  options.responses.max_bytes = absl::GetFlag(FLAGS_response_store_max_bytes);
  options.responses.max_record_bytes =
      std::min(options.responses.max_record_bytes, options.responses.max_bytes);
  options.session_store = absl::GetFlag(FLAGS_session_store);
  options.session_store_password_file = absl::GetFlag(FLAGS_session_store_password_file);
  options.session_store_timeout_ms = absl::GetFlag(FLAGS_session_store_timeout_ms);
  options.session_lease_ms = absl::GetFlag(FLAGS_session_lease_ms);
  options.session_store_key_prefix = absl::GetFlag(FLAGS_session_store_key_prefix);
  options.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  options.tenants_file = absl::GetFlag(FLAGS_tenants_file);
  options.tenants.max_priority = absl::GetFlag(FLAGS_max_priority);
  options.tenants.token_window = absl::Seconds(absl::GetFlag(FLAGS_tenant_token_window_s));
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.metrics.port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics.address = absl::GetFlag(FLAGS_metrics_address);
  options.metrics.require_api_key = absl::GetFlag(FLAGS_metrics_require_api_key);
  options.metrics.log_requests = absl::GetFlag(FLAGS_log_requests);
  options.metrics.vllm_names = absl::GetFlag(FLAGS_metrics_vllm_names);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.http_address = absl::GetFlag(FLAGS_http_address);
  options.heap_trim_interval_ms = absl::GetFlag(FLAGS_heap_trim_interval_ms);
  // The addresses printed below are the ones bound: --host's where a listener's own flag is empty.
  options = tost::service::ResolveListenerAddresses(std::move(options));

  auto server = tost::service::Server::Start(options);
  if (!server.ok()) {
    tost::service::Log(tost::service::LogLevel::kError, "tost_server failed to start",
                       {{"error", tost::FullErrorText(server.status())}});
    return 1;
  }
  // Tests and scripts read the bound port from this line.
  std::printf("tost_server listening on %s:%d\n", options.host.c_str(), (*server)->port());
  // Printed second (tests read it after the line above); absent with --metrics_port=-1.
  if ((*server)->metrics_port() > 0) {
    std::printf("tost_server metrics on %s:%d\n", options.metrics.address.c_str(),
                (*server)->metrics_port());
  }
  // Third; absent with --http_port=-1.
  if ((*server)->http_port() > 0) {
    std::printf("tost_server http on %s:%d\n", options.http_address.c_str(),
                (*server)->http_port());
  }
  std::fflush(stdout);
  const tost::service::HeapTrimmer heap_trimmer(absl::Milliseconds(options.heap_trim_interval_ms));

  // A sticky CUDA error leaves the device unusable for this process: every model call would fail
  // from now on. The thread that saw it wakes this one, which turns health NOT_SERVING (the drain's
  // first act), ends the streams with their last good state, and exits non-zero so the
  // orchestrator replaces the replica instead of routing traffic to a dead one.
  tost::model::SetDeviceLostHandler([](const std::string&) { kill(getpid(), SIGUSR2); });

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  if (signal_number == SIGUSR2 && grpc_listener_failed.load()) {
    // The connections already open keep working, so their calls get the whole drain.
    tost::service::Log(tost::service::LogLevel::kError,
                       "the gRPC listener stopped accepting connections and does not recover in "
                       "this process: draining and exiting for a replacement (raise the open files "
                       "limit, or put a proxy that bounds connections in front)");
    (*server)->Drain(absl::GetFlag(FLAGS_drain_timeout_s) * 1000);
    return kExitListenerFailed;
  }
  if (signal_number == SIGUSR2) {
    tost::service::Log(tost::service::LogLevel::kError,
                       "the CUDA device failed; no request can succeed in this process: draining "
                       "and exiting for a replacement",
                       {{"error", tost::model::DeviceLostReason()}});
    (*server)->Drain(kDeviceLostDrainMs);
    return kExitDeviceLost;
  }
  tost::service::Log(tost::service::LogLevel::kInfo, "draining", {{"signal", signal_number}});
  (*server)->Drain(absl::GetFlag(FLAGS_drain_timeout_s) * 1000);
  tost::service::Log(tost::service::LogLevel::kInfo, "stopped");
  return 0;
}
