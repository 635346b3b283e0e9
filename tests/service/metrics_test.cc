// Metrics families fed by their sources (scheduler observer with a fake clock, batch records, RPC
// outcomes), the structured log format, and the /metrics HTTP endpoint.
#include "service/observability/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "service/observability/logging.h"
#include "service/observability/metrics_http.h"
#include "tests/service/engine/fake_models.h"

namespace tost::service {
namespace {

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

TEST(MetricsTest, OptionsRejectPortsOutOfRange) {
  MetricsOptions o;
  o.port = -2;
  EXPECT_FALSE(ValidateMetricsOptions(o).ok());
  o.port = 65536;
  EXPECT_FALSE(ValidateMetricsOptions(o).ok());
  o.port = -1;
  EXPECT_TRUE(ValidateMetricsOptions(o).ok());
}

std::string HttpGet(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
    response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST(MetricsHttpServerTest, ServesMetricsOnAFreePortAndNothingElse) {
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("tost_x 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string ok = HttpGet((*server)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("Content-Length: 9\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 9), "tost_x 1\n");
  EXPECT_EQ(HttpGet((*server)->port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(HttpGet((*server)->port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0),
            0u);
  // The same port cannot be bound twice.
  auto second =
      MetricsHttpServer::Start("127.0.0.1", (*server)->port(), [] { return std::string(); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
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
