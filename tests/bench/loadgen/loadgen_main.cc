// tost_loadgen: drives a tost.v1 server with classify and generate calls, open loop (a fixed rate
// of Poisson or uniform arrivals) or closed loop (a fixed number of calls in flight), and reports
// latency, time to first token, inter-token latency, throughput and errors by gRPC code.
//
// One thread and one completion queue drive every call, so the generator fits on one core (--cpu
// pins it there, gRPC's own threads included) and leaves the rest of the machine to the server.
// Open-loop latencies are measured from each call's scheduled send time, not from when it was
// actually sent: a generator that falls behind then shows up as latency instead of hiding it.
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/npy.h"
#include "proto/grpc_code_name.h"
#include "tests/bench/loadgen/loadgen_stats.h"
#include "tost/v1/tost.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:8500", "Server address (host:port)");
ABSL_FLAG(double, rate_per_s, 0,
          "Open loop: calls started per second (> 0). 0: closed loop at --concurrency");
ABSL_FLAG(int, concurrency, 1, "Closed loop: calls kept in flight (each ends, the next starts)");
ABSL_FLAG(std::string, arrivals, "poisson", "Open loop: \"poisson\" or \"uniform\" arrivals");
ABSL_FLAG(double, duration_s, 10, "Seconds of measured load after --warmup_s (0: no time bound)");
ABSL_FLAG(double, warmup_s, 1, "Seconds of load before measuring (not counted)");
ABSL_FLAG(int64_t, requests, 0, "Measured calls to start at most (0: no count bound)");
ABSL_FLAG(int64_t, max_in_flight, 4096,
          "Open loop: arrivals finding this many calls outstanding are skipped (and counted)");
ABSL_FLAG(double, timeout_s, 60, "Deadline of each call");
ABSL_FLAG(std::string, workload, "classify",
          "\"classify\", \"generate\", or a weighted mix like \"classify:3,generate:1\"");
ABSL_FLAG(uint64_t, seed, 1, "Seed of arrivals, mix choices, random inputs and sampling");
ABSL_FLAG(int, channels, 1, "gRPC connections the calls are spread over (round robin)");
ABSL_FLAG(int, cpu, -1, "Pin the whole load generator (gRPC threads too) to this core; -1: no pin");
ABSL_FLAG(double, ready_timeout_s, 120, "How long to wait for the models to report ready");
ABSL_FLAG(std::string, json, "", "Write the results as JSON to this file");
ABSL_FLAG(std::string, classify_model, "", "Vision model (default: the first ready one)");
ABSL_FLAG(int, batch_size, 1, "Images per Classify call");
ABSL_FLAG(std::string, input_npy, "",
          "float32 .npy of [C,H,W] or [N,C,H,W] images (the model's input shape) to send; default "
          "random normal values");
ABSL_FLAG(int, top_k, 1, "Labels asked per image");
ABSL_FLAG(std::string, generate_model, "", "Language model (default: the first ready one)");
ABSL_FLAG(std::string, prompt_text, "Once upon a time", "Prompt bytes (when --prompt_tokens is 0)");
ABSL_FLAG(int, prompt_tokens, 0, "Send this many random token ids as the prompt instead of text");
ABSL_FLAG(int, max_new_tokens, 64, "Tokens generated per Generate call");
ABSL_FLAG(double, temperature, 1.0, "Sampling temperature (0 = greedy); seeds differ per call");
ABSL_FLAG(std::string, json_schema, "",
          "Constrain every Generate call to this JSON schema (the schema's text; empty: none)");

namespace tost::loadgen {
namespace {

using Clock = std::chrono::steady_clock;
using tost::v1::Tost;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// gRPC takes system-clock time points or gpr_timespec; our clock is steady (immune to clock steps).
gpr_timespec ToGpr(Clock::time_point t) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t - Clock::now()).count();
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_nanos(std::max<int64_t>(0, ns), GPR_TIMESPAN));
}

struct Usage {
  double cpu_s = 0;
  int64_t involuntary_switches = 0;
};

Usage ReadUsage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec),
          u.ru_nivcsw};
}

// One call in flight. The completion-queue tag is the call itself: each has at most one operation
// outstanding at a time.
class Call {
 public:
  // The deadline is set here, before the subclass starts the call (a started call's context must
  // not change).
  Call(Workload workload, Clock::time_point scheduled, bool measured, Clock::duration timeout)
      : workload(workload), scheduled(scheduled), measured(measured) {
    context.set_deadline(std::chrono::system_clock::now() + timeout);
  }
  virtual ~Call() = default;
  // Handles the completion of the outstanding operation; false once the call has ended.
  virtual bool Proceed(bool ok) = 0;

  const Workload workload;
  const Clock::time_point scheduled;
  const bool measured;
  grpc::ClientContext context;
  grpc::Status status;
  int64_t images = 0;
  int64_t tokens = 0;
  Clock::time_point first_token{}, last_token{};
  std::vector<double> itl_ms;
};

class ClassifyCall : public Call {
 public:
  ClassifyCall(Tost::Stub& stub, grpc::CompletionQueue& cq, const v1::ClassifyRequest& request,
               int64_t images, Clock::time_point scheduled, bool measured, Clock::duration timeout)
      : Call(Workload::kClassify, scheduled, measured, timeout) {
    this->images = images;
    reader_ = stub.PrepareAsyncClassify(&context, request, &cq);
    reader_->StartCall();
    reader_->Finish(&response_, &status, this);
  }
  bool Proceed(bool) override { return false; }

 private:
  v1::ClassifyResponse response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::ClassifyResponse>> reader_;
};

class GenerateCall : public Call {
 public:
  GenerateCall(Tost::Stub& stub, grpc::CompletionQueue& cq, const v1::GenerateRequest& request,
               Clock::time_point scheduled, bool measured, Clock::duration timeout)
      : Call(Workload::kGenerate, scheduled, measured, timeout) {
    reader_ = stub.PrepareAsyncGenerate(&context, request, &cq);
    reader_->StartCall(this);
  }
  bool Proceed(bool ok) override {
    switch (state_) {
      case State::kStarting:
      case State::kReading:
        if (state_ == State::kReading && ok && message_.has_token()) {
          const Clock::time_point now = Clock::now();
          if (tokens == 0) {
            first_token = now;
          } else {
            itl_ms.push_back(Millis(now - last_token));
          }
          last_token = now;
          ++tokens;
        }
        if (ok) {
          state_ = State::kReading;
          reader_->Read(&message_, this);
        } else {
          state_ = State::kFinishing;
          reader_->Finish(&status, this);
        }
        return true;
      case State::kFinishing:
        return false;
    }
    return false;
  }

 private:
  enum class State { kStarting, kReading, kFinishing };
  State state_ = State::kStarting;
  v1::GenerateResponse message_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader_;
};

struct Workloads {
  std::vector<v1::ClassifyRequest> classify;  // a pool, used round robin
  int64_t images_per_call = 0;
  v1::GenerateRequest generate;  // the seed varies per call
  std::vector<int32_t> prompt_pool;
  int vocab_size = 0;
  int64_t eos_token_id = -1;
};

absl::StatusOr<v1::ModelStatus> FindModel(Tost::Stub& stub, const std::string& architecture,
                                          const std::string& name, double ready_timeout_s) {
  const Clock::time_point give_up =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ready_timeout_s));
  std::string last;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListModelsResponse list;
    const grpc::Status s = stub.ListModels(&ctx, {}, &list);
    if (!s.ok()) {
      last =
          absl::StrCat("ListModels failed: ", GrpcCodeName(s.error_code()), " ", s.error_message());
    } else {
      std::vector<std::string> seen;
      for (const v1::ModelStatus& m : list.models()) {
        seen.push_back(
            absl::StrCat(m.name(), " (", m.architecture(), m.ready() ? ", ready)" : ")"));
        if (m.architecture() != architecture || (!name.empty() && m.name() != name)) continue;
        if (m.ready()) return m;
        if (!m.error().empty()) {
          return absl::FailedPreconditionError(
              absl::StrCat("model ", m.name(), " failed to load: ", m.error()));
        }
      }
      last = absl::StrCat("expected a ready ", architecture, " model",
                          name.empty() ? "" : absl::StrCat(" named ", name),
                          ", the server lists: ", absl::StrJoin(seen, ", "));
    }
    if (Clock::now() > give_up) return absl::UnavailableError(last);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

absl::Status PrepareClassify(Tost::Stub& stub, Workloads& w, RunInfo& info) {
  auto model = FindModel(stub, "tost_vision", absl::GetFlag(FLAGS_classify_model),
                         absl::GetFlag(FLAGS_ready_timeout_s));
  if (!model.ok()) return model.status();
  if (model->input_shape_size() != 3) {
    return absl::FailedPreconditionError(absl::StrCat("model ", model->name(),
                                                      ": expected input_shape [C,H,W], got ",
                                                      model->input_shape_size(), " dimensions"));
  }
  const int64_t c = model->input_shape(0), h = model->input_shape(1), wd = model->input_shape(2);
  const int64_t image_floats = c * h * wd;
  std::vector<float> images;  // [n, C, H, W]
  const std::string npy = absl::GetFlag(FLAGS_input_npy);
  if (!npy.empty()) {
    std::ifstream in(npy, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --input_npy ", npy));
    std::stringstream bytes;
    bytes << in.rdbuf();
    auto array = tost::service::ParseNpy(bytes.str(), npy);
    if (!array.ok()) return array.status();
    const auto& s = array->shape;
    const bool one = s.size() == 3 && s[0] == c && s[1] == h && s[2] == wd;
    const bool many = s.size() == 4 && s[1] == c && s[2] == h && s[3] == wd && s[0] > 0;
    if (!one && !many) {
      return absl::InvalidArgumentError(absl::StrCat(
          npy, ": expected [", c, ",", h, ",", wd, "] or [N,", c, ",", h, ",", wd,
          "] (the input shape of ", model->name(), "), got [", absl::StrJoin(s, ","), "]"));
    }
    images = std::move(array->data);
  } else {
    std::mt19937 rng(static_cast<uint32_t>(absl::GetFlag(FLAGS_seed)));
    std::normal_distribution<float> normal;
    images.resize(16 * image_floats);
    for (float& x : images) x = normal(rng);
  }
  const int64_t available = static_cast<int64_t>(images.size()) / image_floats;
  const int batch = absl::GetFlag(FLAGS_batch_size);
  if (batch < 1) return absl::InvalidArgumentError("--batch_size: expected >= 1");
  // A pool of distinct requests, each `batch` consecutive images (wrapping around the input).
  const int64_t pool = std::max<int64_t>(1, std::min<int64_t>(16, available));
  for (int64_t r = 0; r < pool; ++r) {
    v1::ClassifyRequest req;
    req.set_model(model->name());
    req.set_top_k(absl::GetFlag(FLAGS_top_k));
    auto* t = req.mutable_tensor();
    for (int64_t d : {static_cast<int64_t>(batch), c, h, wd}) t->add_shape(d);
    std::string raw;
    raw.reserve(batch * image_floats * sizeof(float));
    for (int b = 0; b < batch; ++b) {
      const float* src = images.data() + ((r * batch + b) % available) * image_floats;
      raw.append(reinterpret_cast<const char*>(src), image_floats * sizeof(float));
    }
    t->set_raw(std::move(raw));
    w.classify.push_back(std::move(req));
  }
  w.images_per_call = batch;
  info.workload_params["classify_model"] = model->name();
  info.workload_params["classify_input_shape"] = absl::StrCat("[", c, ",", h, ",", wd, "]");
  info.workload_params["batch_size"] = absl::StrCat(batch);
  info.workload_params["input"] = npy.empty() ? "random" : npy;
  return absl::OkStatus();
}

absl::Status PrepareGenerate(Tost::Stub& stub, Workloads& w, RunInfo& info) {
  auto model = FindModel(stub, "tost_lm", absl::GetFlag(FLAGS_generate_model),
                         absl::GetFlag(FLAGS_ready_timeout_s));
  if (!model.ok()) return model.status();
  v1::GenerateRequest& req = w.generate;
  req.set_model(model->name());
  req.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  if (prompt_tokens > 0) {
    if (prompt_tokens + absl::GetFlag(FLAGS_max_new_tokens) > model->context_length()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt_tokens + --max_new_tokens: expected at most the context length ",
                       model->context_length(), " of ", model->name(), ", got ",
                       prompt_tokens + absl::GetFlag(FLAGS_max_new_tokens)));
    }
    w.vocab_size = static_cast<int>(model->vocab_size());
    w.eos_token_id = model->eos_token_id();
    std::mt19937 rng(static_cast<uint32_t>(absl::GetFlag(FLAGS_seed)));
    std::uniform_int_distribution<int32_t> id(0, w.vocab_size - 1);
    // Random ids, none of them end-of-text (which would end a prompt's document early).
    for (int i = 0; i < prompt_tokens; ++i) {
      int32_t t = id(rng);
      while (t == w.eos_token_id) t = id(rng);
      req.mutable_prompt_tokens()->add_ids(t);
    }
  } else {
    req.set_prompt_bytes(absl::GetFlag(FLAGS_prompt_text));
  }
  info.workload_params["generate_model"] = model->name();
  info.workload_params["prompt"] = prompt_tokens > 0
                                       ? absl::StrCat(prompt_tokens, " random token ids")
                                       : absl::StrCat("\"", absl::GetFlag(FLAGS_prompt_text), "\"");
  info.workload_params["max_new_tokens"] = absl::StrCat(absl::GetFlag(FLAGS_max_new_tokens));
  info.workload_params["temperature"] = absl::StrCat(absl::GetFlag(FLAGS_temperature));
  if (const std::string schema = absl::GetFlag(FLAGS_json_schema); !schema.empty()) {
    req.mutable_constraint()->set_json_schema(schema);
    info.workload_params["json_schema"] = schema;
  }
  return absl::OkStatus();
}

class Driver {
 public:
  Driver(std::vector<std::unique_ptr<Tost::Stub>> stubs, Workloads workloads, RunResult& result,
         MixPicker picker)
      : stubs_(std::move(stubs)),
        w_(std::move(workloads)),
        result_(result),
        picker_(std::move(picker)) {}

  void Run() {
    const RunInfo& info = result_.info;
    const bool open_loop = info.mode == "rate";
    const Clock::time_point t0 = Clock::now();
    const auto after = [&](double s) {
      return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    measure_from_ = after(info.warmup_s);
    const Clock::time_point send_until =
        info.duration_s > 0 ? after(info.warmup_s + info.duration_s) : Clock::time_point::max();
    ArrivalSchedule schedule(*ParseArrivals(info.arrivals), std::max(info.rate_per_s, 1e-9),
                             absl::GetFlag(FLAGS_seed));
    Clock::time_point next_arrival = after(schedule.Next());
    const Usage usage0 = ReadUsage();
    Clock::time_point cancel_at = Clock::time_point::max();
    bool cancelled = false;

    while (true) {
      Clock::time_point now = Clock::now();
      const bool sending =
          now < send_until && (info.max_requests == 0 || measured_started_ < info.max_requests);
      if (sending) {
        if (open_loop) {
          while (next_arrival <= now && next_arrival < send_until &&
                 (info.max_requests == 0 || measured_started_ < info.max_requests)) {
            if (static_cast<int64_t>(in_flight_.size()) >= absl::GetFlag(FLAGS_max_in_flight)) {
              if (next_arrival >= measure_from_) ++result_.skipped_sends;
            } else {
              if (next_arrival >= measure_from_) {
                result_.send_lag_ms.Add(Millis(now - next_arrival));
                if (now - next_arrival > std::chrono::milliseconds(1)) ++result_.late_sends;
              }
              Start(next_arrival);
            }
            next_arrival = after(schedule.Next());
            now = Clock::now();
          }
        } else {
          while (static_cast<int>(in_flight_.size()) < info.concurrency &&
                 (info.max_requests == 0 || measured_started_ < info.max_requests)) {
            Start(Clock::now());
          }
        }
      } else {
        if (in_flight_.empty()) break;
        // Calls still running after their own deadline plus a grace are cancelled, so a stuck
        // server cannot hold the report forever.
        if (cancel_at == Clock::time_point::max())
          cancel_at = now + timeout_ + std::chrono::seconds(5);
        if (!cancelled && now >= cancel_at) {
          for (Call* c : in_flight_) c->context.TryCancel();
          cancelled = true;
        }
      }
      Clock::time_point wake = now + std::chrono::milliseconds(100);
      if (sending && open_loop) wake = std::min(wake, next_arrival);
      if (sending) wake = std::min(wake, send_until);
      // The completion queue's timed wait can overshoot by about a millisecond, so the last
      // stretch before a send is polled and slept precisely instead (the core is ours).
      const bool near = sending && open_loop && wake == next_arrival &&
                        wake - now < std::chrono::microseconds(1500);
      void* tag = nullptr;
      bool ok = false;
      const auto got =
          cq_.AsyncNext(&tag, &ok,
                        near ? gpr_inf_past(GPR_CLOCK_MONOTONIC)
                             : ToGpr(open_loop ? wake - std::chrono::microseconds(1200) : wake));
      if (got == grpc::CompletionQueue::SHUTDOWN) break;
      if (got == grpc::CompletionQueue::TIMEOUT) {
        if (near)
          std::this_thread::sleep_until(std::min(wake, now + std::chrono::microseconds(50)));
        continue;
      }
      // Drain everything already complete before looking at the clock again.
      do {
        Call* call = static_cast<Call*>(tag);
        if (!call->Proceed(ok)) Finish(call);
      } while (cq_.AsyncNext(&tag, &ok, gpr_inf_past(GPR_CLOCK_MONOTONIC)) ==
               grpc::CompletionQueue::GOT_EVENT);
    }
    const Usage usage1 = ReadUsage();
    result_.client_cpu_s = usage1.cpu_s - usage0.cpu_s;
    result_.client_preemptions = usage1.involuntary_switches - usage0.involuntary_switches;
    if (first_measured_ != Clock::time_point::max() && last_done_ > first_measured_) {
      result_.measured_s = Seconds(last_done_ - first_measured_);
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  void Start(Clock::time_point scheduled) {
    const bool measured = scheduled >= measure_from_;
    const Workload workload = picker_.Pick();
    Tost::Stub& stub = *stubs_[next_stub_++ % stubs_.size()];
    std::unique_ptr<Call> call;
    if (workload == Workload::kClassify) {
      call = std::make_unique<ClassifyCall>(stub, cq_, w_.classify[calls_ % w_.classify.size()],
                                            w_.images_per_call, scheduled, measured, timeout_);
    } else {
      w_.generate.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed) * 1000003 + calls_);
      call = std::make_unique<GenerateCall>(stub, cq_, w_.generate, scheduled, measured, timeout_);
    }
    ++calls_;
    if (measured) {
      ++measured_started_;
      ++result_.by_workload[workload].started;
      first_measured_ = std::min(first_measured_, scheduled);
    }
    in_flight_.insert(call.get());
    result_.max_in_flight =
        std::max(result_.max_in_flight, static_cast<int64_t>(in_flight_.size()));
    call.release();  // owned by the completion queue until Finish
  }

  void Finish(Call* call) {
    const Clock::time_point now = Clock::now();
    in_flight_.erase(call);
    if (call->measured) {
      WorkloadStats& s = result_.by_workload[call->workload];
      s.tokens += call->tokens;
      if (call->status.ok()) {
        ++s.ok;
        s.images += call->images;
        s.latency_ms.Add(Millis(now - call->scheduled));
        if (call->tokens > 0) s.ttft_ms.Add(Millis(call->first_token - call->scheduled));
        for (double d : call->itl_ms) s.itl_ms.Add(d);
      } else {
        ++s.errors_by_code[GrpcCodeName(call->status.error_code())];
      }
      last_done_ = std::max(last_done_, now);
    }
    delete call;
  }

  std::vector<std::unique_ptr<Tost::Stub>> stubs_;
  Workloads w_;
  RunResult& result_;
  MixPicker picker_;
  grpc::CompletionQueue cq_;
  std::unordered_set<Call*> in_flight_;
  Clock::time_point measure_from_;
  Clock::time_point first_measured_ = Clock::time_point::max();
  Clock::time_point last_done_{};
  const Clock::duration timeout_ = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(absl::GetFlag(FLAGS_timeout_s)));
  int64_t calls_ = 0;
  int64_t measured_started_ = 0;
  size_t next_stub_ = 0;
};

absl::Status PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--cpu: cannot pin to core ", cpu, " (",
                                                   std::strerror(errno),
                                                   "); this "
                                                   "machine has ",
                                                   std::thread::hardware_concurrency(), " cores"));
  }
  return absl::OkStatus();
}

int Main() {
  RunResult result;
  RunInfo& info = result.info;
  info.target = absl::GetFlag(FLAGS_target);
  info.rate_per_s = absl::GetFlag(FLAGS_rate_per_s);
  info.concurrency = absl::GetFlag(FLAGS_concurrency);
  info.mode = info.rate_per_s > 0 ? "rate" : "concurrency";
  info.arrivals = absl::GetFlag(FLAGS_arrivals);
  info.duration_s = absl::GetFlag(FLAGS_duration_s);
  info.warmup_s = absl::GetFlag(FLAGS_warmup_s);
  info.max_requests = absl::GetFlag(FLAGS_requests);
  info.cpu = absl::GetFlag(FLAGS_cpu);
  info.mix = absl::GetFlag(FLAGS_workload);

  const auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "tost_loadgen: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  // Before any gRPC object exists: threads gRPC starts later inherit the mask.
  if (info.cpu >= 0) {
    if (absl::Status s = PinToCpu(info.cpu); !s.ok()) return fail(s);
  }
  if (auto a = ParseArrivals(info.arrivals); !a.ok()) return fail(a.status());
  auto mix = ParseMix(info.mix);
  if (!mix.ok()) return fail(mix.status());
  if (info.rate_per_s < 0 || (info.rate_per_s == 0 && info.concurrency < 1)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("expected --rate_per_s > 0 (open loop) or --concurrency >= 1 (closed loop), "
                     "got --rate_per_s=",
                     info.rate_per_s, " --concurrency=", info.concurrency)));
  }
  if (info.duration_s <= 0 && info.max_requests <= 0) {
    return fail(absl::InvalidArgumentError(
        "expected a bound: --duration_s > 0 and/or --requests > 0, got neither"));
  }
  const int channels = std::max(1, absl::GetFlag(FLAGS_channels));
  std::vector<std::unique_ptr<Tost::Stub>> stubs;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // Distinct arguments and a local subchannel pool: one TCP connection per channel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("tost.loadgen.channel", i);
    stubs.push_back(Tost::NewStub(
        grpc::CreateCustomChannel(info.target, grpc::InsecureChannelCredentials(), args)));
  }

  Workloads workloads;
  for (const MixEntry& e : *mix) {
    absl::Status s = e.workload == Workload::kClassify
                         ? PrepareClassify(*stubs[0], workloads, info)
                         : PrepareGenerate(*stubs[0], workloads, info);
    if (!s.ok()) return fail(s);
  }
  Driver driver(std::move(stubs), std::move(workloads), result,
                MixPicker(*mix, absl::GetFlag(FLAGS_seed) + 17));
  driver.Run();

  std::printf("%s", ResultSummary(result).c_str());
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << ResultJson(result) << "\n";
    if (!out) {
      return fail(absl::UnavailableError(absl::StrCat("cannot write --json ", json_path)));
    }
  }
  return 0;
}

}  // namespace
}  // namespace tost::loadgen

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load generator for tost.v1 servers. Examples:\n"
      "  tost_loadgen --target=127.0.0.1:8500 --workload=classify --rate_per_s=200 --cpu=0\n"
      "  tost_loadgen --workload=generate --concurrency=64 --max_new_tokens=64 --json=out.json\n"
      "  tost_loadgen --workload=classify:3,generate:1 --rate_per_s=50 --duration_s=30");
  absl::ParseCommandLine(argc, argv);
  return tost::loadgen::Main();
}
