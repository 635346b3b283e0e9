// The model server protocol's gauges (service/observability/serving_protocol_metrics.h), scraped
// over HTTP from a Metrics endpoint watching an engine whose scheduler the test steps by hand: the
// scheduler runs no thread, so nothing moves between the moment the test places its requests and
// the scrape, and the queued and running gauges must read exactly what the test placed.
#include "service/observability/serving_protocol_metrics.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "service/engine/clock.h"
#include "service/engine/engine.h"
#include "service/engine/prefix_cache.h"
#include "service/engine/session_codec.h"
#include "service/observability/metrics.h"
#include "tests/service/engine/fake_models.h"
#include "tests/service/socket_test_util.h"

namespace tost::service {
namespace {

using ::tost::testing::Connect;
using ::tost::testing::ReadAll;
using ::tost::testing::SendAll;

// GET /metrics on 127.0.0.1:port, the body only.
std::string Scrape(int port) {
  const int fd = Connect(port);
  SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string response = ReadAll(fd);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

// The value of the one sample line that starts with `series` (name and labels as rendered); -1 and
// a failure when there is none or more than one.
double Sample(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos || text.find(key, at + 1) != std::string::npos) {
    ADD_FAILURE() << "expected one sample " << series << " in\n" << text;
    return -1;
  }
  const size_t value = at + key.size();
  return std::stod(text.substr(value, text.find('\n', value) - value));
}

// The TYPE line of `family`.
std::string TypeOf(const std::string& text, const std::string& family) {
  const std::string key = "# TYPE " + family + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  const size_t value = at + key.size();
  return text.substr(value, text.find('\n', value) - value);
}

struct Served {
  testing::FakeLanguageModel lm;
  FakeClock clock;  // idle sessions never time out: time only moves when a test says
  std::unique_ptr<Engine> engine;
  GenerationScheduler* scheduler = nullptr;
  int64_t state_bytes = 0;  // one fresh session's GenerationState::ByteSize
};

// An engine over the fake language model with `max_active` places and `max_queued` queue places,
// no threads, and a session budget of `budget_states` fresh states.
std::unique_ptr<Served> Serve(int32_t max_active, int32_t max_queued, int64_t budget_states,
                              int64_t prefix_cache_bytes) {
  auto s = std::make_unique<Served>();
  const auto entry = [&] {
    ModelEntry e;
    e.name = s->lm.config().name;
    e.config = s->lm.config();
    e.generator = &s->lm;
    e.weights_sha256 = std::string(32, 'w');
    std::vector<ModelEntry> models;
    models.push_back(std::move(e));
    return models;
  };
  // The bytes of one fresh state, from an engine of the same model.
  {
    EngineOptions probe;
    probe.start_threads = false;
    auto engine = Engine::Create(entry(), probe, SessionCodec::WithRandomKey(), RealClock::Get());
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return nullptr;
    s->state_bytes = (*engine)->Stats().generators.at(0).state_bytes_per_session;
  }
  EngineOptions options;
  options.start_threads = false;
  options.generation.max_active_jobs = max_active;
  options.generation.max_queued_jobs = max_queued;
  options.sessions.max_state_bytes = budget_states * s->state_bytes;
  options.prefix_cache.max_bytes = prefix_cache_bytes;
  auto engine = Engine::Create(entry(), options, SessionCodec::WithRandomKey(), &s->clock);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  s->engine = std::move(*engine);
  auto scheduler = s->engine->Scheduler(s->lm.config().name);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  if (!scheduler.ok()) return nullptr;
  s->scheduler = *scheduler;
  return s;
}

std::shared_ptr<GenerationJob> Submit(GenerationScheduler& scheduler, int32_t priority = 0) {
  GenerationRequest r;
  r.priority = priority;
  r.state = scheduler.NewState({});
  r.prompt = {'H', 'i'};
  r.max_new_tokens = 400;  // far more than the test's few steps produce
  auto job = scheduler.Submit(std::move(r));
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

TEST(ServingProtocolMetricsTest, GaugesReadExactlyTheRequestsHeldQueuedAndRunning) {
  constexpr int kRunning = 3, kQueued = 5;
  auto s = Serve(/*max_active=*/kRunning, /*max_queued=*/16, /*budget_states=*/64, 64 << 10);
  ASSERT_NE(s, nullptr);
  Metrics metrics;
  metrics.WatchEngine(s->engine.get());
  ASSERT_TRUE(metrics.Serve({.address = "127.0.0.1", .port = 0, .vllm_names = true}).ok());
  const std::string model = "{model=\"fake-lm\"}";
  const std::string vllm = "{model_name=\"fake-lm\"}";

  std::string text = Scrape(metrics.port());
  EXPECT_EQ(TypeOf(text, "tost_generation_requests_waiting"), "gauge");
  EXPECT_EQ(TypeOf(text, "tost_generation_requests_running"), "gauge");
  EXPECT_EQ(TypeOf(text, "tost_state_budget_utilization"), "gauge");
  EXPECT_EQ(TypeOf(text, "tost_prefix_cache_config_info"), "gauge");
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), 0);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), 0);
  EXPECT_EQ(Sample(text, "tost_state_budget_utilization" + model), 0);

  // kRunning + kQueued requests; one step gives the kRunning places to the first ones, and the
  // scheduler, which runs no thread, holds everything there while the test scrapes.
  std::vector<std::shared_ptr<GenerationJob>> jobs;
  for (int i = 0; i < kRunning + kQueued; ++i) jobs.push_back(Submit(*s->scheduler));
  ASSERT_TRUE(s->scheduler->StepOnce());
  text = Scrape(metrics.port());
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), kQueued);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), kRunning);
  EXPECT_EQ(Sample(text, "vllm:num_requests_waiting" + vllm), kQueued);
  EXPECT_EQ(Sample(text, "vllm:num_requests_running" + vllm), kRunning);
  EXPECT_EQ(TypeOf(text, "vllm:num_requests_waiting"), "gauge");
  // Every active place is taken: the state budget is full whatever the sessions hold.
  EXPECT_EQ(Sample(text, "tost_state_budget_utilization" + model), 1);
  EXPECT_EQ(Sample(text, "vllm:kv_cache_usage_perc" + vllm), 1);
  EXPECT_EQ(Sample(text, "vllm:gpu_cache_usage_perc" + vllm), 1);
  // The existing queue gauge agrees.
  EXPECT_EQ(Sample(text, "tost_queue_depth{model=\"fake-lm\",workload=\"generate\"}"), kQueued);

  // Two running requests cancelled: a step drops them, and the next gives their places to two
  // queued ones.
  jobs[0]->Cancel();
  jobs[1]->Cancel();
  ASSERT_TRUE(s->scheduler->StepOnce());
  text = Scrape(metrics.port());
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), kQueued);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), kRunning - 2);
  ASSERT_TRUE(s->scheduler->StepOnce());
  text = Scrape(metrics.port());
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), kQueued - 2);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), kRunning);
  for (auto& job : jobs) job->Cancel();
  for (int i = 0; i < 10 && s->scheduler->in_flight() > 0; ++i) s->scheduler->StepOnce();
  text = Scrape(metrics.port());
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), 0);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), 0);
  metrics.StopServing();
  metrics.WatchEngine(nullptr);
}

// A running request that gives its place up to a higher priority is parked with its state: it
// waits again, and counts as waiting until it resumes (tost_queue_depth counts the queue only).
TEST(ServingProtocolMetricsTest, AParkedRequestCountsAsWaiting) {
  auto s = Serve(/*max_active=*/2, /*max_queued=*/4, /*budget_states=*/8, 64 << 10);
  ASSERT_NE(s, nullptr);
  Metrics metrics;
  metrics.WatchEngine(s->engine.get());
  const std::string model = "{model=\"fake-lm\"}";
  std::vector<std::shared_ptr<GenerationJob>> jobs = {Submit(*s->scheduler, /*priority=*/5),
                                                      Submit(*s->scheduler, /*priority=*/5)};
  ASSERT_TRUE(s->scheduler->StepOnce());
  std::string text = metrics.Render();
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), 0);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), 2);
  jobs.push_back(Submit(*s->scheduler, /*priority=*/0));  // served first: one of the 5s is parked
  ASSERT_TRUE(s->scheduler->StepOnce());
  const GenerationSchedulerStats stats = s->scheduler->stats();
  ASSERT_EQ(stats.parked, 1);
  ASSERT_EQ(stats.queued, 0);
  text = metrics.Render();
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), 1);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), 2);
  EXPECT_EQ(Sample(text, "tost_queue_depth{model=\"fake-lm\",workload=\"generate\"}"), 0);
  for (auto& job : jobs) job->Cancel();
  for (int i = 0; i < 10 && s->scheduler->in_flight() > 0; ++i) s->scheduler->StepOnce();
  text = metrics.Render();
  EXPECT_EQ(Sample(text, "tost_generation_requests_waiting" + model), 0);
  EXPECT_EQ(Sample(text, "tost_generation_requests_running" + model), 0);
  metrics.WatchEngine(nullptr);
}

TEST(ServingProtocolMetricsTest, UtilizationFollowsSessionsCreatedAndClosedAndTheActivePlaces) {
  constexpr int64_t kBudgetStates = 8;
  auto s = Serve(/*max_active=*/4, /*max_queued=*/4, kBudgetStates, 64 << 10);
  ASSERT_NE(s, nullptr);
  Metrics metrics;
  metrics.WatchEngine(s->engine.get());
  const std::string model = "{model=\"fake-lm\"}";
  const auto utilization = [&] {
    const std::string text = metrics.Render();
    const double u = Sample(text, "tost_state_budget_utilization" + model);
    // The sessions' share is exactly the two existing gauges' ratio.
    EXPECT_DOUBLE_EQ(u, std::max(Sample(text, "tost_session_state_bytes") /
                                     Sample(text, "tost_session_budget_bytes"),
                                 Sample(text, "tost_generation_requests_running" + model) / 4));
    return u;
  };
  EXPECT_EQ(utilization(), 0);
  std::vector<std::string> ids;
  double last = 0;
  for (int i = 1; i <= 6; ++i) {
    auto id = s->engine->sessions().Add("alice", s->scheduler->NewState({}));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    const double u = utilization();
    EXPECT_NEAR(u, static_cast<double>(i) / kBudgetStates, 1e-12) << i << " sessions";
    EXPECT_GT(u, last);
    last = u;
  }
  // One running generation of four places (0.25) is below the six sessions' 0.75 ...
  auto job = Submit(*s->scheduler);
  ASSERT_TRUE(s->scheduler->StepOnce());
  EXPECT_NEAR(utilization(), 6.0 / kBudgetStates, 1e-12);
  // ... and above what two sessions hold once four are closed.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->engine->sessions().Close(ids[i], "alice").ok());
  EXPECT_NEAR(utilization(), 0.25, 1e-12);
  job->Cancel();
  for (int i = 0; i < 10 && s->scheduler->in_flight() > 0; ++i) s->scheduler->StepOnce();
  EXPECT_NEAR(utilization(), 2.0 / kBudgetStates, 1e-12);
  for (int i = 4; i < 6; ++i) ASSERT_TRUE(s->engine->sessions().Close(ids[i], "alice").ok());
  EXPECT_EQ(utilization(), 0);
  metrics.WatchEngine(nullptr);
}

// tost_prefix_cache_config_info: block size 1, and as many blocks as the positions that entries as
// long as the context, each costing what the cache counts for it, fill: exactly that many such
// entries fit in a cache of that budget, and one more evicts one.
TEST(ServingProtocolMetricsTest, CacheInfoGivesBlockSizeOneAndThePositionsTheBudgetHolds) {
  constexpr int64_t kCacheBytes = 48 << 10;
  auto s = Serve(/*max_active=*/2, /*max_queued=*/2, /*budget_states=*/8, kCacheBytes);
  ASSERT_NE(s, nullptr);
  Metrics metrics;
  metrics.WatchEngine(s->engine.get());
  const std::string text = metrics.Render();
  const std::string prefix = "tost_prefix_cache_config_info{block_size=\"1\",model=\"fake-lm\",";
  const size_t at = text.find("\n" + prefix + "num_gpu_blocks=\"");
  ASSERT_NE(at, std::string::npos) << text;
  const size_t value = at + 1 + prefix.size() + std::string("num_gpu_blocks=\"").size();
  const int64_t blocks = std::stoll(text.substr(value, text.find('"', value) - value));
  EXPECT_EQ(Sample(text, prefix + "num_gpu_blocks=\"" + std::to_string(blocks) + "\"}"), 1);
  EXPECT_EQ(text.find("vllm:"), std::string::npos) << "vLLM's names only when asked for";

  const model::ModelConfig& config = s->lm.config();
  const int64_t context = config.language.context_length;
  ASSERT_GT(blocks, 0);
  ASSERT_EQ(blocks % context, 0) << "whole entries of the context's length";
  const int64_t fit = blocks / context;
  PrefixStateCache cache({.max_bytes = kCacheBytes});
  const PrefixCacheScope scope{
      .model = config.name, .weights_sha256 = std::string(32, 'w'), .owner = kAnonymousCaller};
  for (int64_t i = 0; i <= fit; ++i) {
    std::vector<int32_t> tokens(static_cast<size_t>(context), 7);
    tokens[0] = static_cast<int32_t>(i);  // a distinct key each
    model::SequenceState state = s->lm.NewSequence();
    state.position = context;
    cache.Insert(scope, tokens, state, /*on_grid=*/false);
    EXPECT_EQ(cache.entries(), std::min(i + 1, fit)) << "entry " << i;
  }
  EXPECT_EQ(cache.stats(config.name).evictions, 1);

  // No budget, no blocks.
  auto off = Serve(/*max_active=*/2, /*max_queued=*/2, /*budget_states=*/8, /*prefix_cache=*/0);
  ASSERT_NE(off, nullptr);
  Metrics off_metrics;
  off_metrics.WatchEngine(off->engine.get());
  EXPECT_EQ(Sample(off_metrics.Render(), prefix + "num_gpu_blocks=\"0\"}"), 1);
  off_metrics.WatchEngine(nullptr);
  metrics.WatchEngine(nullptr);
}

}  // namespace
}  // namespace tost::service
