// Metrics families fed by their sources (scheduler observer with a fake clock, batch records, RPC
// outcomes), the structured log format, and the /metrics HTTP endpoint (a route on service/http).
#include "service/observability/metrics.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <grpc/support/log.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "service/api/before_handler.h"
#include "service/engine/engine.h"
#include "service/observability/grpc_log_bridge.h"
#include "service/observability/logging.h"
#include "tests/service/engine/fake_models.h"
#include "tests/service/socket_test_util.h"

namespace tost::service {
namespace {

using ::tost::testing::Connect;
using ::tost::testing::ReadAll;
using ::tost::testing::SendAll;

// The value of the sample line that starts with `series` (name and labels exactly as rendered).
double Value(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  size_t at = text.find("\n" + key);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no sample " << series << " in\n" << text;
    return -1;
  }
  at += 1 + key.size();
  return std::stod(text.substr(at, text.find('\n', at) - at));
}

TEST(MetricsTest, SchedulerObserverCountsTokensAndLatenciesOnTheSchedulersClock) {
  // A deterministic stand-in that never says end of text: every job yields all its tokens.
  const testing::FakeLanguageModel lm;
  FakeClock clock;
  Metrics metrics;
  metrics.RegisterModel(lm.config().name, lm.config().version, "libtorch_cpu", /*generates=*/true);
  GenerationSchedulerOptions options;
  options.observer = &metrics;
  auto scheduler = GenerationScheduler::Create(lm, options, &clock);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  for (const std::string prompt : {"Hello", "Hi"}) {
    GenerationRequest r;
    r.state = (*scheduler)->NewState({});
    r.prompt.assign(prompt.begin(), prompt.end());
    r.max_new_tokens = 4;
    auto job = (*scheduler)->Submit(std::move(r));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.push_back(*job);
  }
  // Step 1 (at +10 ms) prefills both prompts and decodes both first tokens; later steps (+1 ms
  // each) decode the rest.
  clock.Advance(absl::Milliseconds(10));
  int steps = 0;
  while ((*scheduler)->in_flight() > 0 && steps < 100) {
    ASSERT_TRUE((*scheduler)->StepOnce());
    clock.Advance(absl::Milliseconds(1));
    ++steps;
  }
  int64_t tokens = 0;
  for (auto& job : jobs) {
    while (auto e = job->Next(absl::ZeroDuration()))
      tokens += e->kind == GenerationEvent::Kind::kToken ? 1 : 0;
  }
  ASSERT_GE(tokens, 2);  // each job's first token at least (EOS may end one early)
  const GenerationSchedulerStats stats = (*scheduler)->stats();
  const std::string text = metrics.Render();
  const std::string model = absl::StrCat("model=\"", lm.config().name, "\"");
  EXPECT_EQ(Value(text, absl::StrCat("tost_prompt_tokens_total{", model, "}")),
            7);  // "Hello" + "Hi"
  EXPECT_EQ(Value(text, absl::StrCat("tost_generated_tokens_total{", model, "}")), tokens);
  // Both first tokens came out of step 1, 10 ms after Submit; every later token 1 ms after its
  // predecessor.
  EXPECT_EQ(Value(text, absl::StrCat("tost_time_to_first_token_seconds_count{", model, "}")), 2);
  EXPECT_NEAR(Value(text, absl::StrCat("tost_time_to_first_token_seconds_sum{", model, "}")), 0.020,
              1e-9);
  EXPECT_EQ(Value(text, absl::StrCat("tost_time_to_first_token_seconds_bucket{", model,
                                     ",le=\"0.005\"}")),
            0);
  EXPECT_EQ(
      Value(text, absl::StrCat("tost_time_to_first_token_seconds_bucket{", model, ",le=\"0.01\"}")),
      2);
  EXPECT_EQ(Value(text, absl::StrCat("tost_inter_token_latency_seconds_count{", model, "}")),
            tokens - 2);
  EXPECT_NEAR(Value(text, absl::StrCat("tost_inter_token_latency_seconds_sum{", model, "}")),
              0.001 * (tokens - 2), 1e-9);
  EXPECT_EQ(Value(text, absl::StrCat("tost_batch_size_count{", model, ",workload=\"generate\"}")),
            stats.decode_steps);
  EXPECT_EQ(Value(text, absl::StrCat("tost_batch_size_sum{", model, ",workload=\"generate\"}")),
            tokens);
  EXPECT_EQ(Value(text, absl::StrCat("tost_batch_size_bucket{", model,
                                     ",workload=\"generate\",le=\"2\"}")),
            stats.decode_steps);
}

// tost_decode_graphs_enabled is read from the engine at each scrape, from the decode mode
// ServerStatus shows: 1 while a model's decode steps replay CUDA graphs, 0 where they never did
// (the CPU) and from the step that turned them off, which also writes one WARNING line naming the
// model and why.
TEST(MetricsTest, DecodeGraphsGaugeFollowsTheDecodeModeAndTheirEndIsLogged) {
  testing::FakeLanguageModel cpu_lm({.name = "cpu-lm"});
  testing::FakeLanguageModel gpu_lm({.name = "gpu-lm"});
  gpu_lm.SetDecodeMode("cuda graphs");
  std::vector<ModelEntry> models;
  for (const testing::FakeLanguageModel* lm : {&cpu_lm, &gpu_lm}) {
    ModelEntry e;
    e.name = lm->config().name;
    e.config = lm->config();
    e.generator = lm;
    e.weights_sha256 = std::string(32, 'w');
    models.push_back(std::move(e));
  }
  Metrics metrics;
  EngineOptions options;
  options.start_threads = false;
  options.generation.observer = &metrics;
  FakeClock clock;
  auto engine = Engine::Create(std::move(models), options, SessionCodec::WithRandomKey(), &clock);
  ASSERT_TRUE(engine.ok()) << engine.status();
  metrics.WatchEngine(engine->get());
  const auto enabled = [&](const std::string& model) {
    return Value(metrics.Render(), "tost_decode_graphs_enabled{model=\"" + model + "\"}");
  };
  EXPECT_EQ(enabled("cpu-lm"), 0);
  EXPECT_EQ(enabled("gpu-lm"), 1);

  const std::string off =
      "eager: capturing batch 2 failed: operation not permitted when stream is capturing";
  gpu_lm.SetDecodeMode(off);
  auto scheduler = (*engine)->Scheduler("gpu-lm");
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  GenerationRequest r;
  r.state = (*scheduler)->NewState({});
  r.prompt = {'H', 'i'};
  r.max_new_tokens = 3;
  auto job = (*scheduler)->Submit(std::move(r));
  ASSERT_TRUE(job.ok()) << job.status();
  SetLogFormat(LogFormat::kText);
  ::testing::internal::CaptureStderr();
  for (int steps = 0; (*scheduler)->in_flight() > 0 && steps < 100; ++steps) {
    (*scheduler)->StepOnce();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << log;
  EXPECT_NE(lines[0].find(" WARN decode graphs off: decode steps run eagerly model=gpu-lm "
                          "reason=\"capturing batch 2 failed: operation not permitted when stream "
                          "is capturing\""),
            std::string::npos)
      << lines[0];
  EXPECT_EQ(enabled("gpu-lm"), 0);
  EXPECT_EQ(enabled("cpu-lm"), 0);
  metrics.WatchEngine(nullptr);
}

TEST(MetricsTest, AdmissionsGaugeShowsCallsRunningAndQueuedForAThreadOfEachPool) {
  Metrics metrics;
  HandlerPool stateless("test-admit", /*max_threads=*/1, /*max_queued=*/8);
  HandlerPool store("test-store", /*max_threads=*/1, /*max_queued=*/8);
  metrics.WatchAdmission(&stateless, &store);
  const auto admissions = [&](const std::string& pool, const std::string& state) {
    return Value(metrics.Render(),
                 "tost_admissions{pool=\"" + pool + "\",state=\"" + state + "\"}");
  };
  for (const char* pool : {"stateless", "store"}) {
    EXPECT_EQ(admissions(pool, "running"), 0) << pool;
    EXPECT_EQ(admissions(pool, "queued"), 0) << pool;
  }
  // One admission holds the store pool's only thread (as one waiting for a shared store would);
  // two wait for it, and the stateless pool is not counted for them.
  absl::Notification started, release;
  ASSERT_TRUE(store.Schedule([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  ASSERT_TRUE(store.Schedule([] {}));
  ASSERT_TRUE(store.Schedule([] {}));
  EXPECT_EQ(admissions("store", "running"), 1);
  EXPECT_EQ(admissions("store", "queued"), 2);
  EXPECT_EQ(admissions("stateless", "running"), 0);
  EXPECT_EQ(admissions("stateless", "queued"), 0);
  release.Notify();
  metrics.WatchAdmission(nullptr, nullptr);
  EXPECT_EQ(metrics.Render().find("tost_admissions"), std::string::npos);
}

TEST(MetricsTest, BatchRecordsFeedQueueComputeBatchSizeAndSuccessfulImages) {
  Metrics metrics;
  metrics.RegisterModel("digits", "v1", "libtorch_cpu", /*generates=*/false);
  BatchRecord ok;
  ok.model_name = "digits";
  ok.images = 5;
  ok.requests = 2;
  ok.queue_delay = absl::Microseconds(1500);
  ok.compute_time = absl::Milliseconds(4);
  BatchRecord failed = ok;
  failed.images = 3;
  failed.code = absl::StatusCode::kInternal;
  metrics.OnBatch(ok);
  metrics.OnBatch(failed);
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "tost_images_classified_total{model=\"digits\"}"), 5);
  EXPECT_EQ(Value(text, "tost_queue_duration_seconds_count{model=\"digits\"}"), 2);
  EXPECT_NEAR(Value(text, "tost_queue_duration_seconds_sum{model=\"digits\"}"), 0.003, 1e-12);
  EXPECT_EQ(Value(text, "tost_queue_duration_seconds_bucket{model=\"digits\",le=\"0.001\"}"), 0);
  EXPECT_EQ(Value(text, "tost_queue_duration_seconds_bucket{model=\"digits\",le=\"0.002\"}"), 2);
  EXPECT_NEAR(Value(text, "tost_compute_duration_seconds_sum{model=\"digits\"}"), 0.008, 1e-12);
  EXPECT_EQ(Value(text, "tost_batch_size_sum{model=\"digits\",workload=\"classify\"}"), 8);
  EXPECT_EQ(
      Value(text, "tost_model_info{backend=\"libtorch_cpu\",model=\"digits\",version=\"v1\"}"), 1);
  EXPECT_EQ(text.find("workload=\"generate\""), std::string::npos)
      << "a vision model has no generation series";
}

TEST(MetricsTest, RpcOutcomesCountByCodeAndRejectionsByTheReasonTheirSourceGives) {
  Metrics metrics;
  metrics.ObserveRpc("Classify", grpc::StatusCode::OK, absl::Milliseconds(3));
  metrics.ObserveRpc("Classify", grpc::StatusCode::RESOURCE_EXHAUSTED, absl::Microseconds(50));
  metrics.ObserveRpc("Generate", grpc::StatusCode::UNAVAILABLE, absl::Microseconds(50));
  metrics.ObserveRpc("ListModels", grpc::StatusCode::UNAUTHENTICATED, absl::Microseconds(50));
  metrics.ObserveRpc("Classify", grpc::StatusCode::INVALID_ARGUMENT, absl::Microseconds(50));
  // A status code alone says nothing of why: only the refusing components count reasons.
  std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "tost_requests_total{code=\"OK\",rpc=\"Classify\"}"), 1);
  EXPECT_EQ(Value(text, "tost_requests_total{code=\"RESOURCE_EXHAUSTED\",rpc=\"Classify\"}"), 1);
  EXPECT_EQ(Value(text, "tost_request_duration_seconds_count{rpc=\"Classify\"}"), 3);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"queue_full\"}"), 0);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"draining\"}"), 0);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"unauthenticated\"}"), 1);

  metrics.OnDropped("digits", BatchDropReason::kQueueFull, 2);
  metrics.OnRefused("lm", GenerationRefusal::kQueueFull);
  metrics.OnDropped("digits", BatchDropReason::kShutdown, 1);
  metrics.OnRefused("lm", GenerationRefusal::kDraining);
  metrics.OnDropped("digits", BatchDropReason::kDeadlineExceeded, 1);  // accepted, then expired
  metrics.OnStoreFull();
  text = metrics.Render();
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"queue_full\"}"), 2);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"draining\"}"), 2);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"sessions_full\"}"), 1);
  EXPECT_EQ(Value(text, "tost_rejections_total{reason=\"unauthenticated\"}"), 1);
}

TEST(MetricsTest, CallsEndedBeforeTheirHandlerAreRecognisedByTheirAnswerOnly) {
  using grpc::StatusCode;
  EXPECT_STREQ(EndedBeforeHandlerReason(StatusCode::INVALID_ARGUMENT,
                                        "ClassifyRequest: expected a request message, got none"),
               "no_request");
  EXPECT_STREQ(EndedBeforeHandlerReason(
                   StatusCode::CANCELLED,
                   "/tost.v1.Tost/Classify: the call was cancelled before its handler ran"),
               "cancelled");
  // Any other answer, or the same words under another code, keeps its access-log line.
  EXPECT_EQ(EndedBeforeHandlerReason(StatusCode::INVALID_ARGUMENT, "ClassifyRequest: field x"),
            nullptr);
  EXPECT_EQ(EndedBeforeHandlerReason(StatusCode::CANCELLED, "the client cancelled"), nullptr);
  EXPECT_EQ(EndedBeforeHandlerReason(StatusCode::INTERNAL,
                                     "ClassifyRequest: expected a request message, got none"),
            nullptr);
  EXPECT_EQ(EndedBeforeHandlerReason(StatusCode::INVALID_ARGUMENT, ""), nullptr);
}

TEST(MetricsTest, OptionsRejectPortsOutOfRange) {
  MetricsOptions o;
  o.port = -2;
  EXPECT_FALSE(ValidateMetricsOptions(o).ok());
  o.port = 65536;
  EXPECT_FALSE(ValidateMetricsOptions(o).ok());
  o.port = -1;
  EXPECT_TRUE(ValidateMetricsOptions(o).ok());
}

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string HttpGet(int port, const std::string& request) {
  const int fd = Connect(port);
  SendAll(fd, request);
  std::string response = ReadAll(fd);
  close(fd);
  return response;
}

// True while the server has neither closed nor reset `fd` (on which it never sends anything).
bool IsOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// How long until the server closes `fd`, sending one more byte of `trickle` every `interval`
// meanwhile (none if `trickle` is empty); `limit` if it is still open then.
SteadyClock::duration TimeUntilClosed(int fd, const std::string& trickle, milliseconds interval,
                                      SteadyClock::duration limit) {
  const auto start = SteadyClock::now();
  for (size_t i = 0; SteadyClock::now() - start < limit; ++i) {
    if (!trickle.empty()) send(fd, &trickle[i % trickle.size()], 1, MSG_NOSIGNAL);
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(interval.count())) == 1) {
      char buf[4096];
      if (read(fd, buf, sizeof(buf)) <= 0) return SteadyClock::now() - start;
    }
  }
  return limit;
}

// `count` connections that each send one byte of a request header that never ends, every
// `interval`, the first at once.
class Tricklers {
 public:
  Tricklers(int port, int count, milliseconds interval) {
    for (int i = 0; i < count; ++i) fds_.push_back(Connect(port));
    thread_ = std::thread([this, interval] {
      const std::string header = "GET /metrics HTTP/1.1\r\nX-Slow: ";
      std::unique_lock<std::mutex> lock(mu_);
      for (size_t i = 0; !stop_; ++i) {
        const char byte = i < header.size() ? header[i] : 'a';
        for (int fd : fds_) send(fd, &byte, 1, MSG_NOSIGNAL);
        cv_.wait_for(lock, interval, [this] { return stop_; });
      }
    });
  }
  ~Tricklers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (int fd : fds_) close(fd);
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

constexpr char kScrape[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

TEST(MetricsHttpTest, ServesMetricsOnAFreePortAndNothingElse) {
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); },
                                       MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string ok = HttpGet((*server)->port(), kScrape);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("Content-Length: 9\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 9), "tost_x 1\n");
  const std::string head = HttpGet((*server)->port(), "HEAD /metrics?x=1 HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "HEAD has no body";
  EXPECT_EQ(HttpGet((*server)->port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(HttpGet((*server)->port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0),
            0u);
  EXPECT_EQ(HttpGet((*server)->port(), "nonsense\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  // The same port cannot be bound twice.
  auto second = StartMetricsHttpServer([] { return std::string(); },
                                       MetricsHttpOptions("127.0.0.1", (*server)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  http::HttpServerOptions bad = MetricsHttpOptions("127.0.0.1", 0);
  bad.max_connections = 0;
  EXPECT_EQ(StartMetricsHttpServer([] { return std::string(); }, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --metrics_require_api_key: a scrape passes the authenticator or is refused 401 (unknown paths
// too, before their 404), and the render runs only for admitted scrapes.
TEST(MetricsHttpTest, WithAnAuthenticatorRefusesScrapesWithoutTheKey) {
  std::atomic<int> renders{0};
  auto server = StartMetricsHttpServer(
      [&renders] {
        ++renders;
        return std::string("tost_x 1\n");
      },
      MetricsHttpOptions("127.0.0.1", 0),
      [](const http::HttpRequest& r) -> absl::StatusOr<std::string> {
        if (r.Header("authorization") == "Bearer scrape-key-0123456789") return std::string("prom");
        return absl::UnauthenticatedError("missing API key");
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string refused = HttpGet(port, kScrape);
  EXPECT_EQ(refused.rfind("HTTP/1.1 401", 0), 0u) << refused;
  EXPECT_NE(refused.find("WWW-Authenticate: Bearer"), std::string::npos) << refused;
  EXPECT_NE(refused.find("missing API key"), std::string::npos) << refused;
  EXPECT_EQ(HttpGet(port, "GET /elsewhere HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(renders.load(), 0);
  const std::string ok =
      HttpGet(port, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer scrape-key-0123456789\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 9), "tost_x 1\n");
  EXPECT_EQ(renders.load(), 1);
}

TEST(MetricsHttpTest, AnswersARequestThatArrivesInPieces) {
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); },
                                       MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  // The last cut falls inside the blank line that ends the header.
  for (const std::string piece : {"GET /met", "rics HTTP/1.1\r\nHost: x\r\n\r", "\n"}) {
    SendAll(fd, piece);
    std::this_thread::sleep_for(milliseconds(50));
  }
  const std::string response = ReadAll(fd);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
  EXPECT_EQ(response.substr(response.size() - 9), "tost_x 1\n");
}

// The acceptance scenario, with real 2 s trickles: 16 clients each sending a byte every 2 s hold
// connections open (a server that reads one connection at a time would wait on the first for as
// long as it trickles), and a scrape, at any point of their trickling, answers within 1 s.
TEST(MetricsHttpTest, ScrapeAnswersWithinOneSecondWhileSixteenClientsTrickle) {
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); },
                                       MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  Tricklers tricklers((*server)->port(), 16, milliseconds(2000));
  // Once between the first bytes and the second, once just after the second (at 2 s).
  for (const auto wait : {milliseconds(300), milliseconds(1800)}) {
    std::this_thread::sleep_for(wait);
    const auto start = SteadyClock::now();
    const std::string response = HttpGet((*server)->port(), kScrape);
    const auto took = SteadyClock::now() - start;
    EXPECT_LT(took, milliseconds(1000));
    EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
    EXPECT_EQ(response.substr(response.size() - 9), "tost_x 1\n");
  }
  // Still within their 5 s request deadline: the server held all 16 while answering the scrapes.
  for (int fd : tricklers.fds()) EXPECT_TRUE(IsOpen(fd));
}

TEST(MetricsHttpTest, ClosesARequestNotCompleteByItsDeadlineHoweverSteadilyItTrickles) {
  http::HttpServerOptions options = MetricsHttpOptions("127.0.0.1", 0);
  options.read_header_timeout_ms = 500;
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); }, options);
  ASSERT_TRUE(server.ok()) << server.status();
  // One sends part of a request line and stops; the other sends a byte every 50 ms, so no single
  // read ever waits long.
  const int silent = Connect((*server)->port());
  SendAll(silent, "GET /met");
  const auto silent_lasted = TimeUntilClosed(silent, "", milliseconds(50), std::chrono::seconds(5));
  close(silent);
  const int trickling = Connect((*server)->port());
  SendAll(trickling, "GET /metrics HTTP/1.1\r\nX-Slow: ");
  const auto trickling_lasted =
      TimeUntilClosed(trickling, "a", milliseconds(50), std::chrono::seconds(5));
  close(trickling);
  // The deadline runs from accept, which follows connect: never closed early. The upper bound is
  // generous for a loaded machine but far below the 5 s the helper waits.
  for (const auto lasted : {silent_lasted, trickling_lasted}) {
    EXPECT_GE(lasted, milliseconds(450));
    EXPECT_LT(lasted, milliseconds(3000));
  }
  EXPECT_EQ(HttpGet((*server)->port(), kScrape).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
}

TEST(MetricsHttpTest, RefusesAnOversizedHeaderWith431) {
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); },
                                       MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string big =
      absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(16384, 'a'), "\r\n\r\n");
  const std::string refused = HttpGet((*server)->port(), big);
  EXPECT_EQ(refused.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << refused;
  // A large header within the default 8 KiB is served.
  const std::string fits =
      absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(7000, 'a'), "\r\n\r\n");
  EXPECT_EQ(HttpGet((*server)->port(), fits).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
}

TEST(MetricsHttpTest, ServesManyConcurrentScrapes) {
  std::atomic<int> renders = 0;
  // Larger than a socket buffer's first send, so responses go out in several writes.
  const std::string body = absl::StrCat(std::string(256 * 1024, '#'), "\ntost_x 1\n");
  auto server = StartMetricsHttpServer(
      [&] {
        ++renders;
        return body;
      },
      MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kClients = 32;
  constexpr int kScrapesEach = 4;
  std::atomic<int> served = 0;
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      for (int j = 0; j < kScrapesEach; ++j) {
        const std::string response = HttpGet((*server)->port(), kScrape);
        if (response.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 && response.size() > body.size() &&
            response.compare(response.size() - body.size(), body.size(), body) == 0) {
          ++served;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(served.load(), kClients * kScrapesEach);
  EXPECT_EQ(renders.load(), kClients * kScrapesEach);
}

TEST(MetricsHttpTest, DropsTheOldestSlowConnectionToAcceptOneMoreAtTheCap) {
  http::HttpServerOptions options = MetricsHttpOptions("127.0.0.1", 0);
  options.max_connections = 4;
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); }, options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    slow.push_back(Connect((*server)->port()));
    SendAll(slow.back(), "G");
    std::this_thread::sleep_for(milliseconds(20));  // so that the first is the oldest
  }
  const auto start = SteadyClock::now();
  EXPECT_EQ(HttpGet((*server)->port(), kScrape).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
  // The scrape took the oldest one's place, long before the 5 s request deadline.
  EXPECT_LT(TimeUntilClosed(slow[0], "", milliseconds(50), std::chrono::seconds(5)),
            std::chrono::seconds(2));
  for (size_t i = 1; i < slow.size(); ++i) EXPECT_TRUE(IsOpen(slow[i])) << i;
  for (int fd : slow) close(fd);
}

TEST(MetricsHttpTest, CutsOffAClientThatReadsTooSlowlyWithoutDelayingOthers) {
  http::HttpServerOptions options = MetricsHttpOptions("127.0.0.1", 0);
  options.write_timeout_ms = 500;
  // Far more than the kernel buffers between the server and a client that does not read.
  const std::string body(32 << 20, '#');
  auto server = StartMetricsHttpServer([&] { return body; }, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int stalled = socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;
  setsockopt(stalled, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const timeval timeout{10, 0};
  setsockopt(stalled, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(stalled, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SendAll(stalled, kScrape);
  std::this_thread::sleep_for(milliseconds(100));  // its response is now being written
  // Another client is served in full meanwhile (a generous bound: it moves 32 MiB).
  const auto start = SteadyClock::now();
  const std::string response = HttpGet((*server)->port(), kScrape);
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_GT(response.size(), body.size());
  // Past its response deadline, the stalled client finds its connection ended short.
  std::this_thread::sleep_for(milliseconds(1500));
  const std::string partial = ReadAll(stalled);
  close(stalled);
  EXPECT_LT(partial.size(), body.size());
}

TEST(MetricsHttpTest, StopReturnsPromptlyWithTricklingConnectionsOpen) {
  auto server = StartMetricsHttpServer([] { return std::string("tost_x 1\n"); },
                                       MetricsHttpOptions("127.0.0.1", 0));
  ASSERT_TRUE(server.ok()) << server.status();
  Tricklers tricklers((*server)->port(), 16, milliseconds(2000));
  std::this_thread::sleep_for(milliseconds(300));  // accepted, and mid-request
  const auto start = SteadyClock::now();
  (*server)->Stop();
  // Far below the 5 s request deadline that a server waiting on its connections would take.
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
  for (int fd : tricklers.fds())
    EXPECT_LT(TimeUntilClosed(fd, "", milliseconds(50), std::chrono::seconds(5)),
              milliseconds(1000));
  (*server)->Stop();  // idempotent; the destructor calls it again
}

TEST(LoggingTest, JsonLinesAreOneObjectWithTypedFields) {
  const std::string line = FormatLogLine(LogFormat::kJson, LogLevel::kWarning, "rpc",
                                         {{"request_id", "abc"},
                                          {"code", "OK"},
                                          {"n", 3},
                                          {"ms", 1.5},
                                          {"ok", true},
                                          {"error", "quote \" newline \n bad utf8 \xff"}});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["msg"], "rpc");
  EXPECT_EQ(j["n"], 3);
  EXPECT_EQ(j["ms"], 1.5);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["error"], "quote \" newline \n bad utf8 \xef\xbf\xbd");
  EXPECT_TRUE(j.contains("ts"));
}

TEST(LoggingTest, TextLinesQuoteOnlyAmbiguousValues) {
  const std::string line = FormatLogLine(LogFormat::kText, LogLevel::kInfo, "rpc",
                                         {{"rpc", "Classify"}, {"error", "two words"}, {"n", 7}});
  EXPECT_NE(line.find(" INFO rpc rpc=Classify error=\"two words\" n=7"), std::string::npos) << line;
  EXPECT_FALSE(ParseLogFormat("yaml").ok());
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
}

// No raw control character (C0, DEL, C1 as UTF-8) and nothing that is not UTF-8: what a terminal
// or a log shipper gets of a line.
void ExpectOneSafeLine(const std::string& line) {
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  for (size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    EXPECT_FALSE(c < 0x20 || c == 0x7f) << "raw control 0x" << std::hex << int{c} << " in " << line;
    EXPECT_FALSE(c == 0xc2 && i + 1 < line.size() &&
                 static_cast<unsigned char>(line[i + 1]) <= 0x9f)
        << "raw C1 control in " << line;
  }
  // nlohmann's strict serializer throws on bytes that are not UTF-8.
  EXPECT_NO_THROW(nlohmann::json(line).dump()) << line;
}

TEST(LoggingTest, EscapeForLogEscapesEveryControlAndInvalidByte) {
  struct Case {
    std::string in, text, json;
  };
  const Case cases[] = {
      {"plain ascii", "plain ascii", "plain ascii"},
      {"q\"b\\", "q\\\"b\\\\", "q\\\"b\\\\"},
      {"a\nb\rc\td", "a\\nb\\rc\\td", "a\\nb\\rc\\td"},
      {std::string("nul") + '\0' + "esc\x1b[31mdel\x7f", "nul\\x00esc\\x1b[31mdel\\x7f",
       "nul\\u0000esc\\u001b[31mdel\\u007f"},
      {"\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
       "\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
       "\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},  // valid UTF-8 is kept
      {"csi\xc2\x9bJ ls\xe2\x80\xa8 rlo\xe2\x80\xae", "csi\\u009bJ ls\\u2028 rlo\\u202e",
       "csi\\u009bJ ls\\u2028 rlo\\u202e"},
      // A stray continuation, a lone lead, an overlong '/', a surrogate, a sequence cut short.
      {"\x80 \xff \xc0\xaf \xed\xa0\x80 \xe2\x82",
       "\\x80 \\xff \\xc0\\xaf \\xed\\xa0\\x80 \\xe2\\x82",
       "\\ufffd \\ufffd \\ufffd\\ufffd \\ufffd\\ufffd\\ufffd \\ufffd\\ufffd"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(EscapeForLog(c.in, LogFormat::kText), c.text);
    EXPECT_EQ(EscapeForLog(c.in, LogFormat::kJson), c.json);
    EXPECT_TRUE(nlohmann::json::accept("\"" + c.json + "\"")) << c.json;
  }
}

TEST(LoggingTest, EveryStringOfALineIsEscapedInBothFormats) {
  const std::string hostile = "m\n2026-01-01 00:00:00 INFO fake line \x1b[31m=\"x\" \xc2\x9b\xff";
  for (LogFormat format : {LogFormat::kText, LogFormat::kJson}) {
    const std::string line = FormatLogLine(format, LogLevel::kError, hostile,
                                           {{hostile, hostile}, {"n", 1}, {"ms", 2.0}});
    ExpectOneSafeLine(line);
    if (format == LogFormat::kJson) {
      const auto j = nlohmann::json::parse(line);
      const std::string decoded =
          "m\n2026-01-01 00:00:00 INFO fake line \x1b[31m=\"x\" \xc2\x9b\xef\xbf\xbd";
      EXPECT_EQ(j["msg"], decoded);
      EXPECT_EQ(j[decoded], decoded);
      EXPECT_TRUE(j["ms"].is_number_float());
    } else {
      // A message that could be read as fields is quoted like a value.
      const std::string quoted =
          "\"m\\n2026-01-01 00:00:00 INFO fake line \\x1b[31m=\\\"x\\\" \\u009b\\xff\"";
      EXPECT_NE(line.find(" ERROR " + quoted + " " + quoted + "=" + quoted + " n=1 ms=2"),
                std::string::npos)
          << line;
    }
  }
}

// gRPC core logs through gpr_log, from any of its threads; the bridge makes those lines the
// server's: escaped, JSON in JSON mode, with gRPC's file:line, and only what gRPC's verbosity lets
// through.
TEST(LoggingTest, GrpcCoreLinesGoThroughTheServerLog) {
  const std::string value =
      "1S\n2026-01-01 00:00:00 INFO fake line \x1b[31mred\x1b[0m \xff\xfe end";
  RouteGrpcLogsToServerLog();
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);  // gRPC's default (GRPC_VERBOSITY unset)
  for (LogFormat format : {LogFormat::kText, LogFormat::kJson}) {
    SetLogFormat(format);
    ::testing::internal::CaptureStderr();
    gpr_log(GPR_ERROR, "Error parsing metadata: error=invalid value key=grpc-timeout value=%s",
            value.c_str());
    gpr_log(GPR_INFO, "below the verbosity: %s", "not written");
    const std::string out = ::testing::internal::GetCapturedStderr();
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    const std::vector<std::string> lines = absl::StrSplit(out.substr(0, out.size() - 1), '\n');
    ASSERT_EQ(lines.size(), 1u) << out;
    const std::string& line = lines[0];
    ExpectOneSafeLine(line);
    if (format == LogFormat::kJson) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["level"], "error");
      EXPECT_EQ(j["msg"],
                "Error parsing metadata: error=invalid value key=grpc-timeout value=1S\n2026-01-01 "
                "00:00:00 INFO fake line \x1b[31mred\x1b[0m \xef\xbf\xbd\xef\xbf\xbd end");
      EXPECT_EQ(j["component"], "grpc");
      EXPECT_TRUE(j["source"].get<std::string>().starts_with("metrics_test.cc:")) << line;
    } else {
      EXPECT_NE(line.find(" ERROR \"Error parsing metadata: error=invalid value key=grpc-timeout "
                          "value=1S\\n2026-01-01 00:00:00 INFO fake line \\x1b[31mred\\x1b[0m "
                          "\\xff\\xfe end\" source=metrics_test.cc:"),
                std::string::npos)
          << line;
      EXPECT_NE(line.find(" component=grpc"), std::string::npos) << line;
    }
  }
  SetLogFormat(LogFormat::kText);
  gpr_set_log_function(nullptr);  // gRPC's own logger again for the other tests
}

// gRPC 1.51's listener logs this line and never accepts again; the server must hear it once.
std::atomic<int> listener_failures{0};
void CountListenerFailure(std::string_view message) {
  EXPECT_EQ(message, "Failed accept4: Too many open files");
  listener_failures.fetch_add(1);
}

TEST(GrpcLogBridgeTest, AListenerThatStoppedAcceptingIsReportedOnce) {
  EXPECT_TRUE(IsListenerFailureLine("/build/grpc-1.51.1/src/core/lib/iomgr/tcp_server_posix.cc",
                                    "Failed accept4: Too many open files"));
  EXPECT_TRUE(
      IsListenerFailureLine("tcp_server_posix.cc", "Failed accept4: Cannot allocate memory"));
  EXPECT_FALSE(IsListenerFailureLine("tcp_posix.cc", "Failed accept4: Too many open files"));
  EXPECT_FALSE(IsListenerFailureLine("tcp_server_posix.cc", "Failed to add port to server"));
  EXPECT_FALSE(IsListenerFailureLine("my_tcp_server_posix.cc.h", "Failed accept4: x"));

  SetListenerFailureHandler(&CountListenerFailure);
  RouteGrpcLogsToServerLog();
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);  // gRPC's default (GRPC_VERBOSITY unset)
  ::testing::internal::CaptureStderr();
  gpr_log("src/core/lib/iomgr/tcp_server_posix.cc", 216, GPR_LOG_SEVERITY_ERROR,
          "Failed to prepare server socket: %s", "x");
  EXPECT_EQ(listener_failures.load(), 0);
  for (int i = 0; i < 3; ++i) {
    gpr_log("src/core/lib/iomgr/tcp_server_posix.cc", 216, GPR_LOG_SEVERITY_ERROR,
            "Failed accept4: %s", "Too many open files");
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(listener_failures.load(), 1);  // one drain, however often gRPC repeats itself
  // Still written as gRPC's line, each time.
  EXPECT_NE(out.find("Failed accept4: Too many open files"), std::string::npos) << out;
  SetListenerFailureHandler(nullptr);
  gpr_set_log_function(nullptr);
}

TEST(LoggingTest, RequestIds) {
  EXPECT_TRUE(IsValidRequestId("trace-1.2_3:x"));
  EXPECT_FALSE(IsValidRequestId(""));
  EXPECT_FALSE(IsValidRequestId("has space"));
  EXPECT_FALSE(IsValidRequestId("inject\"quote"));
  EXPECT_FALSE(IsValidRequestId(std::string(65, 'a')));
  const std::string id = NewRequestId();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_TRUE(IsValidRequestId(id));
  EXPECT_NE(id, NewRequestId());
}

}  // namespace
}  // namespace tost::service
