// tost_cli: calls a running tost_server. `tost_cli --help` lists the commands (models, classify,
// generate), each one's flags with their defaults, and the exit statuses (client/cli_args.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "client/cli_args.h"
#include "client/membership_png.h"
#include "client/npy.h"
#include "imaging/image_decode.h"
#include "proto/grpc_code_name.h"
#include "tost/v1/tost.grpc.pb.h"

// One-line meanings: `tost_cli COMMAND --help` prints them (client/cli_args.cc); what needs more
// words is in the command's details below.
ABSL_FLAG(std::string, server, "127.0.0.1:8500", "the tost_server to call");
ABSL_FLAG(std::string, model, "", "model name, required (tost_cli models lists them)");
ABSL_FLAG(std::string, input, "",
          ".npy float32 image [C,H,W] or batch [B,C,H,W], preprocessed; none = a synthetic "
          "random image of the model's shape");
ABSL_FLAG(std::string, image, "",
          "a PNG or JPEG file, sent encoded (the server decodes and preprocesses it)");
ABSL_FLAG(std::string, membership_png, "",
          "also fetch the membership maps and write PREFIX_image<i>_layer<l>.png heatmaps");
ABSL_FLAG(int, top_k, 5, "classify: labels per image; generate: sampling top-k (0 = off)");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::vector<std::string>, prompt_tokens, {},
          "the prompt as comma-separated token ids instead of text; the output is ids too");
ABSL_FLAG(int, max_new_tokens, 64, "most tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling: the smallest set of tokens with this mass");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed (the same seed gives the same tokens)");
ABSL_FLAG(int, timeout_s, 60, "deadline of each call in seconds");
ABSL_FLAG(bool, resume, false,
          "survive a broken stream: continue from the last state snapshot on any replica");
ABSL_FLAG(int, state_every_tokens, 16,
          "with --resume: snapshot interval; at most this many tokens are generated again");
ABSL_FLAG(std::string, json_schema, "",
          "constrain the output to JSON valid under this schema: a file, or the schema itself when "
          "it starts with '{'");
ABSL_FLAG(std::string, regex, "",
          "constrain the output to a string this regular expression matches");
ABSL_FLAG(std::string, grammar, "",
          "constrain the output to an XGrammar EBNF grammar (start rule root) read from this file");
ABSL_FLAG(std::vector<std::string>, choice, {},
          "constrain the output to exactly one of these strings");
ABSL_FLAG(int, max_retries, 5, "with --resume: breaks in a row without a new snapshot, then fail");
ABSL_FLAG(int, retry_backoff_ms, 100,
          "with --resume: wait before a continuation, doubled per break in a row (at most 2 s)");

namespace {

using tost::GrpcCodeName;
using tost::v1::Tost;

using tost::cli::kExitNotFound;
using tost::cli::kExitOk;
using tost::cli::kExitOther;
using tost::cli::kExitUnavailable;
using tost::cli::kExitUnreachable;
using tost::cli::kExitUsage;

// The server a command talks to, as its error messages name it.
struct Target {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Tost::Stub> stub;
};

void SetDeadline(grpc::ClientContext& ctx);

// Why no connection came up, when that is why the call failed: gRPC reports a refused
// connection and a name that does not resolve as UNAVAILABLE with the resolver's or the socket's
// words, and a host that never answers as the deadline passing before the channel is ready.
std::optional<std::string> Unreachable(const Target& target, const grpc::Status& s) {
  const std::string text = absl::AsciiStrToLower(s.error_message());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    if (absl::StrContains(text, "dns resolution failed") ||
        absl::StrContains(text, "domain name not found") ||
        absl::StrContains(text, "name or service not known") ||
        absl::StrContains(text, "could not resolve")) {
      return "the name does not resolve";
    }
    if (absl::StrContains(text, "connection refused")) return "connection refused";
    if (absl::StrContains(text, "failed to connect")) {
      // "failed to connect to all addresses; last error: UNKNOWN: ipv4:...: <why>": the why.
      const size_t colon = text.rfind(": ");
      return colon == std::string::npos ? text : text.substr(colon + 2);
    }
    return std::nullopt;
  }
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      target.channel->GetState(false) != GRPC_CHANNEL_READY) {
    return absl::StrCat("no connection within --timeout_s=", absl::GetFlag(FLAGS_timeout_s), " s");
  }
  return std::nullopt;
}

// The names the server lists, failed ones marked.
std::string ServedNames(const tost::v1::ListModelsResponse& models) {
  std::vector<std::string> names;
  for (const auto& m : models.models()) {
    names.push_back(m.ready() ? m.name() : absl::StrCat(m.name(), " (failed to load)"));
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

int ModelNotServed(const Target& target, const std::string& model,
                   const tost::v1::ListModelsResponse& models) {
  std::cerr << "tost_cli: model \"" << model << "\" is not served by " << target.address
            << "; served: " << ServedNames(models) << " (tost_cli models)\n";
  return kExitNotFound;
}

// Reports a failed call in one line on stderr and returns the exit status of its class
// (client/cli_args.h). `model`: the model the request named, empty for none.
int Fail(const Target& target, const std::string& rpc, const std::string& model,
         const grpc::Status& s) {
  const std::string code = tost::GrpcCodeName(s.error_code());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      absl::StrContains(s.error_message(), "still loading")) {
    std::cerr << "tost_cli: the server at " << target.address
              << " is still loading its models; retry in a few seconds (it serves once "
                 "grpc.health.v1 reports SERVING)\n";
    return kExitUnavailable;
  }
  if (std::optional<std::string> why = Unreachable(target, s)) {
    std::cerr << "tost_cli: cannot reach a tost_server at " << target.address << " (" << *why
              << "): start one (make run) or pass --server=HOST:PORT\n";
    return kExitUnreachable;
  }
  if (s.error_code() == grpc::StatusCode::NOT_FOUND && !model.empty()) {
    // The server's message names the models too; the list is asked for to print it the same
    // way as everywhere else, and to tell an unknown model from another missing thing.
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    tost::v1::ListModelsResponse models;
    const grpc::Status listed = target.stub->ListModels(&ctx, {}, &models);
    bool served = false;
    for (const auto& m : models.models()) served = served || m.name() == model;
    if (listed.ok() && !served) return ModelNotServed(target, model, models);
    if (!listed.ok()) {
      std::cerr << "tost_cli: model \"" << model << "\" is not served by " << target.address << " ("
                << rpc << " answered NOT_FOUND: " << s.error_message()
                << "); see tost_cli models\n";
      return kExitNotFound;
    }
    std::cerr << "tost_cli: " << rpc << " failed: NOT_FOUND: " << s.error_message() << "\n";
    return kExitNotFound;
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::cerr << "tost_cli: the server at " << target.address << " is unavailable (" << rpc
              << " answered UNAVAILABLE: " << s.error_message()
              << "); it may be draining or restarting: retry, or pass another --server\n";
    return kExitUnavailable;
  }
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    // Something answers HTTP/2 there, but not tost.v1: another service, or a proxy's 404.
    std::cerr << "tost_cli: " << target.address << " answered " << rpc
              << " with UNIMPLEMENTED: " << s.error_message()
              << "; is it a tost_server? pass --server=HOST:PORT of one\n";
    return kExitOther;
  }
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "tost_cli: " << rpc
              << " did not finish within --timeout_s=" << absl::GetFlag(FLAGS_timeout_s) << " s ("
              << s.error_message() << "); pass a larger --timeout_s\n";
    return kExitOther;
  }
  std::cerr << "tost_cli: " << rpc << " failed: " << code << ": " << s.error_message() << "\n";
  return kExitOther;
}

void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
}

int Models(const Target& target) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  tost::v1::ListModelsResponse resp;
  grpc::Status s = target.stub->ListModels(&ctx, {}, &resp);
  if (!s.ok()) return Fail(target, "ListModels", "", s);
  // How each language model's decode steps run ("cuda graphs", "eager", or "eager: " and why
  // graphs were turned off) is in ServerStatus. Without it (a server too old to say) the list is
  // still the list: the column is left out.
  std::map<std::string, std::string> decode_modes;
  {
    grpc::ClientContext status_ctx;
    SetDeadline(status_ctx);
    tost::v1::ServerStatusResponse status;
    if (target.stub->ServerStatus(&status_ctx, {}, &status).ok()) {
      for (const auto& g : status.generators()) decode_modes[g.model()] = g.decode_mode();
    }
  }
  for (const auto& m : resp.models()) {
    const auto mode = decode_modes.find(m.name());
    const std::string decode = mode == decode_modes.end() ? "" : "  decode: " + mode->second;
    std::printf("%-20s %-12s %-6s %s%s%s\n", m.name().c_str(), m.architecture().c_str(),
                m.ready() ? "ready" : "FAILED", m.trained() ? "trained" : "untrained",
                decode.c_str(), m.error().empty() ? "" : ("  " + m.error()).c_str());
  }
  return 0;
}

int Classify(const Target& target) {
  tost::v1::ClassifyRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  req.set_top_k(absl::GetFlag(FLAGS_top_k));
  const std::string input = absl::GetFlag(FLAGS_input);
  const std::string image_file = absl::GetFlag(FLAGS_image);
  const std::string heatmaps = absl::GetFlag(FLAGS_membership_png);
  req.set_return_membership(!heatmaps.empty());
  // Backgrounds for the heatmaps: one gray image per request image.
  std::vector<tost::service::GrayImage> backgrounds;
  if (!image_file.empty()) {
    auto contents = tost::model::ReadFileToString(image_file);
    if (!contents.ok()) return std::cerr << "tost_cli: " << contents.status().message() << "\n", 1;
    req.add_images(*contents);
    auto decoded =
        tost::service::DecodeImage(*contents, 1, tost::service::ImageLimits{}, image_file);
    if (decoded.ok()) {
      backgrounds.push_back({decoded->height, decoded->width,
                             std::vector<float>(decoded->pixels.begin(), decoded->pixels.end())});
    }
  } else if (!input.empty()) {
    auto contents = tost::model::ReadFileToString(input);
    if (!contents.ok()) return std::cerr << "tost_cli: " << contents.status().message() << "\n", 1;
    auto array = tost::service::ParseNpy(*contents, input);
    if (!array.ok()) return std::cerr << "tost_cli: " << array.status().message() << "\n", 1;
    for (int64_t d : array->shape) req.mutable_tensor()->add_shape(d);
    req.mutable_tensor()->set_raw(array->data.data(), array->data.size() * sizeof(float));
    // Background: the mean over channels of each image.
    const size_t dims = array->shape.size();
    if (dims == 3 || dims == 4) {
      const int64_t c = array->shape[dims - 3], h = array->shape[dims - 2],
                    w = array->shape[dims - 1];
      for (size_t off = 0; off + c * h * w <= array->data.size(); off += c * h * w) {
        tost::service::GrayImage g{h, w, std::vector<float>(h * w, 0.f)};
        for (int64_t ch = 0; ch < c; ++ch) {
          for (int64_t i = 0; i < h * w; ++i) g.values[i] += array->data[off + ch * h * w + i] / c;
        }
        backgrounds.push_back(std::move(g));
      }
    }
  } else {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    tost::v1::ListModelsResponse models;
    grpc::Status s = target.stub->ListModels(&ctx, {}, &models);
    if (!s.ok()) return Fail(target, "ListModels", req.model(), s);
    const tost::v1::ModelStatus* info = nullptr;
    for (const auto& m : models.models()) {
      if (m.name() == req.model()) info = &m;
    }
    if (info == nullptr) return ModelNotServed(target, req.model(), models);
    if (!info->ready()) {
      std::cerr << "tost_cli: model \"" << req.model() << "\" failed to load on " << target.address
                << ": " << info->error() << "\n";
      return kExitOther;
    }
    const std::vector<int64_t> shape(info->input_shape().begin(), info->input_shape().end());
    if (shape.size() != 3) {
      std::cerr << "tost_cli: classify needs a vision model (input shape [C,H,W]); model \""
                << req.model() << "\" is a " << info->architecture() << " model with input shape ["
                << absl::StrJoin(shape, ",") << "] (tost_cli models)\n";
      return kExitOther;
    }
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    std::vector<float> pixels(shape[0] * shape[1] * shape[2]);
    for (float& p : pixels) p = normal(rng);
    for (int64_t d : shape) req.mutable_tensor()->add_shape(d);
    req.mutable_tensor()->set_raw(pixels.data(), pixels.size() * sizeof(float));
    std::cerr << "tost_cli: no --input given: classifying a synthetic random image of shape ["
              << absl::StrJoin(shape, ",") << "]\n";
  }
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  tost::v1::ClassifyResponse resp;
  grpc::Status s = target.stub->Classify(&ctx, req, &resp);
  if (!s.ok()) return Fail(target, "Classify", req.model(), s);
  for (int i = 0; i < resp.results_size(); ++i) {
    std::printf("image %d:\n", i);
    for (const auto& l : resp.results(i).labels()) {
      std::printf("  %-16s %.4f  (class %d)\n", l.label().c_str(), l.probability(), l.index());
    }
    for (const auto& map : resp.results(i).membership()) {
      if (static_cast<size_t>(i) >= backgrounds.size()) break;
      const std::string path =
          heatmaps + "_image" + std::to_string(i) + "_layer" + std::to_string(map.layer()) + ".png";
      absl::Status written = tost::service::WriteMembershipPng(
          path, backgrounds[i], std::vector<float>(map.values().begin(), map.values().end()),
          map.heads(), map.grid_height(), map.grid_width());
      if (!written.ok()) return std::cerr << "tost_cli: " << written.message() << "\n", 1;
      std::printf("  membership of layer %d (%d heads, %dx%d tokens) -> %s\n", map.layer(),
                  map.heads(), map.grid_height(), map.grid_width(), path.c_str());
    }
  }
  return 0;
}

// Prints a generation as its tokens become final: token ids after the prompt's ids, or text.
// The prompt goes out with the first of them: a call that fails before any answer leaves stdout
// empty, and the one line on stderr says why.
class Printer {
 public:
  Printer(bool ids, std::string prompt) : ids_(ids), prompt_(std::move(prompt)) {}
  // Prints the prompt unless done already.
  void Start() const {
    if (started_) return;
    started_ = true;
    std::fwrite(prompt_.data(), 1, prompt_.size(), stdout);
  }
  // Ends a line begun, so the shell's prompt does not follow a failure's partial output.
  void EndLine() const {
    if (started_) std::fputs("\n", stdout);
  }
  void Token(const tost::v1::GeneratedToken& t) const {
    Start();
    if (ids_) {
      std::printf(" %d", t.id());
    } else {
      std::fputs(t.text().c_str(), stdout);
    }
    std::fflush(stdout);  // stream: each token appears as it becomes final
  }
  void Final(const tost::v1::GenerateFinal& f) const {
    Start();
    if (!ids_) std::fputs(f.text().c_str(), stdout);
    std::fprintf(stdout, "\n");
  }

 private:
  bool ids_;
  std::string prompt_;
  mutable bool started_ = false;
};

// Breaks a continuation repairs: a draining or unreachable replica (UNAVAILABLE; a proxy without
// a live upstream answers 502, which gRPC reports so), a stream reset in flight (INTERNAL or
// UNKNOWN: RST_STREAM through a proxy whose upstream died, a connection closed without trailers,
// CANCELLED by the server), every place taken (RESOURCE_EXHAUSTED). The others (bad input, a
// refused blob, the deadline) would fail again.
bool Retryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

// A resumable point: the blob of a snapshot (or of a drained stream's final message), the
// position of the last token it includes, and how many tokens of this generation it includes.
struct ResumePoint {
  std::string state;
  int64_t position = 0;
  int64_t committed = 0;
};

// Generate through broken streams. Positions (service/engine/generation_scheduler.cc): a token's
// position is its place in the sequence (the first generated one sits at the prompt's length); a
// snapshot's position is that of the last token its blob includes, and it arrives right after
// that token; a continuation of the blob produces next the token at position + 1. Tokens received
// after the last snapshot are dropped at a break and generated again by the continuation (greedy,
// or seeded: draws are keyed by seed and position), so they are printed only once a snapshot or the
// final message covers them. Before the first snapshot, the continuation is the request again.
// `last_error`: the status of the last call that failed; `answered`: whether any call got a
// message (when none did, the failure is reported as a plain call's would be).
absl::Status GenerateResumable(Tost::Stub& stub, tost::v1::GenerateRequest first,
                               const Printer& printer, grpc::Status* last_error, bool* answered) {
  const int every = absl::GetFlag(FLAGS_state_every_tokens);
  const int max_retries = absl::GetFlag(FLAGS_max_retries);
  if (every <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state_every_tokens must be > 0, got ", every));
  }
  if (first.max_new_tokens() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_new_tokens must be > 0 with --resume (the count left after a break is computed "
        "from it), got ",
        first.max_new_tokens()));
  }
  first.set_return_state(true);
  first.set_state_every_tokens(every);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
  std::optional<ResumePoint> point;
  std::optional<int64_t> first_position;  // where the first generated token sits
  int64_t committed = 0;                  // tokens printed
  int64_t last_committed_position = -1;
  int calls = 0, breaks = 0, from_snapshot = 0, in_a_row = 0;
  int64_t regenerated = 0;
  for (;;) {
    if (std::chrono::system_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Generate did not finish within --timeout_s=", absl::GetFlag(FLAGS_timeout_s), " s (",
          calls, " call(s), ", breaks, " break(s))"));
    }
    tost::v1::GenerateRequest request;
    std::optional<int64_t> expected = first_position;
    if (point.has_value()) {
      request.set_model(first.model());
      request.set_state(point->state);
      request.set_max_new_tokens(static_cast<int32_t>(first.max_new_tokens() - point->committed));
      request.set_return_state(true);
      request.set_state_every_tokens(every);
      expected = point->position + 1;
    } else {
      request = first;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    ++calls;
    auto reader = stub.Generate(&ctx, request);
    std::vector<tost::v1::GeneratedToken> pending;  // past the last snapshot
    int64_t received = 0;
    std::optional<tost::v1::GenerateFinal> final;
    bool drained = false;
    tost::v1::GenerateResponse msg;
    // Marks `pending` final: printed, and covered by the resume point.
    auto commit = [&] {
      for (const auto& t : pending) printer.Token(t);
      committed += static_cast<int64_t>(pending.size());
      if (!pending.empty()) last_committed_position = pending.back().position();
      pending.clear();
    };
    while (reader->Read(&msg)) {
      *answered = true;
      if (msg.has_token()) {
        const tost::v1::GeneratedToken& t = msg.token();
        if (expected.has_value() && t.position() != *expected) {
          ctx.TryCancel();
          return absl::InternalError(
              absl::StrCat("token at position ", t.position(), ", expected position ", *expected));
        }
        if (!first_position.has_value()) first_position = t.position();
        expected = t.position() + 1;
        ++received;
        pending.push_back(t);
      } else if (msg.has_snapshot()) {
        const int64_t last = pending.empty() ? last_committed_position : pending.back().position();
        if (msg.snapshot().position() != last) {
          ctx.TryCancel();
          return absl::InternalError(absl::StrCat("snapshot at position ",
                                                  msg.snapshot().position(),
                                                  ", expected the last token's position ", last));
        }
        commit();
        point = ResumePoint{msg.snapshot().state(), last, committed};
        in_a_row = 0;
      } else if (msg.has_final()) {
        const tost::v1::GenerateFinal& f = msg.final();
        if (f.finish_reason() != tost::v1::FINISH_REASON_DRAINED) {
          final = f;
          continue;  // read on to the end of the stream
        }
        drained = true;
        if (f.generated_tokens() > 0) {
          // The drained blob holds every token of this call: nothing is generated again.
          const int64_t last =
              pending.empty() ? last_committed_position : pending.back().position();
          if (last < 0 || f.position() != last + 1 || f.state().empty()) {
            ctx.TryCancel();
            return absl::InternalError(
                absl::StrCat("drained final at position ", f.position(), " with ", f.state().size(),
                             " state bytes, expected position ", last + 1, " and a blob"));
          }
          commit();
          point = ResumePoint{f.state(), last, committed};
          in_a_row = 0;
        }
        // Drained before this call produced a token: its blob is the call's own input (an empty
        // state for a fresh prompt), so the same request goes out again.
      }
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) *last_error = status;
    if (final.has_value()) {
      commit();
      printer.Final(*final);
      std::fprintf(stderr,
                   "[finish: %s, generated %lld, %d call(s), %d break(s): %d resumed from a "
                   "snapshot, %lld token(s) generated again]\n",
                   tost::v1::FinishReason_Name(final->finish_reason()).c_str(),
                   static_cast<long long>(committed), calls, breaks, from_snapshot,
                   static_cast<long long>(regenerated));
      return absl::OkStatus();
    }
    std::string reason;
    if (!status.ok()) {
      if (!Retryable(status.error_code())) {
        return absl::Status(
            static_cast<absl::StatusCode>(status.error_code()),
            absl::StrCat("Generate failed with ", GrpcCodeName(status.error_code()), ": ",
                         status.error_message(), " (", calls, " call(s), ", breaks, " break(s))"));
      }
      reason = absl::StrCat(GrpcCodeName(status.error_code()), ": ", status.error_message());
    } else {
      reason = drained ? "FINISH_REASON_DRAINED" : "the stream ended without a final message";
    }
    ++breaks;
    ++in_a_row;
    regenerated += static_cast<int64_t>(pending.size());
    if (point.has_value()) ++from_snapshot;
    std::fprintf(
        stderr,
        "[tost_cli: stream broke after %lld token(s) (%s); %s, %zu token(s) to generate "
        "again]\n",
        static_cast<long long>(received), reason.c_str(),
        point.has_value()
            ? absl::StrCat("resuming from the snapshot at position ", point->position).c_str()
            : "sending the request again",
        pending.size());
    if (in_a_row > max_retries) {
      return absl::UnavailableError(
          absl::StrCat("gave up after ", in_a_row, " break(s) in a row without a new snapshot (",
                       "--max_retries=", max_retries, "); the last: ", reason));
    }
    const int64_t backoff_ms =
        std::min<int64_t>(2000, static_cast<int64_t>(absl::GetFlag(FLAGS_retry_backoff_ms))
                                    << std::min(in_a_row - 1, 16));
    const auto wake = std::min(
        deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(backoff_ms));
    std::this_thread::sleep_until(wake);
  }
}

// The constraint the flags ask for (at most one of --json_schema, --regex, --grammar, --choice),
// into `req`; kExitUsage (with its one line printed) for a bad combination or an unreadable file.
int SetConstraint(tost::v1::GenerateRequest& req) {
  const std::string schema = absl::GetFlag(FLAGS_json_schema);
  const std::string regex = absl::GetFlag(FLAGS_regex);
  const std::string grammar = absl::GetFlag(FLAGS_grammar);
  const std::vector<std::string> choices = absl::GetFlag(FLAGS_choice);
  const int given = !schema.empty() + !regex.empty() + !grammar.empty() + !choices.empty();
  if (given == 0) return kExitOk;
  if (given > 1) {
    std::cerr
        << "tost_cli: give at most one of --json_schema, --regex, --grammar and --choice, got "
        << given << "; see tost_cli generate --help\n";
    return kExitUsage;
  }
  const auto read = [](const std::string& flag, const std::string& path, std::string* out) {
    absl::StatusOr<std::string> text = tost::model::ReadFileToString(path);
    if (!text.ok()) {
      std::cerr << "tost_cli: --" << flag << ": cannot read \"" << path
                << "\": " << text.status().message() << "; see tost_cli generate --help\n";
      return false;
    }
    *out = *std::move(text);
    return true;
  };
  tost::v1::Constraint& c = *req.mutable_constraint();
  if (!schema.empty()) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(schema), "{")) {
      c.set_json_schema(schema);
    } else if (!read("json_schema", schema, c.mutable_json_schema())) {
      return kExitUsage;
    }
  } else if (!regex.empty()) {
    c.set_regex(regex);
  } else if (!grammar.empty()) {
    if (!read("grammar", grammar, c.mutable_grammar())) return kExitUsage;
  } else {
    for (const std::string& choice : choices) c.mutable_choice()->add_choices(choice);
  }
  return kExitOk;
}

int Generate(const Target& target) {
  tost::v1::GenerateRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  const std::vector<std::string> prompt_ids = absl::GetFlag(FLAGS_prompt_tokens);
  const bool ids = !prompt_ids.empty();
  if (ids && !absl::GetFlag(FLAGS_prompt).empty()) {
    std::cerr << "tost_cli: give --prompt or --prompt_tokens, not both; see tost_cli generate "
                 "--help\n";
    return kExitUsage;
  }
  for (const std::string& id : prompt_ids) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(id, &value)) {
      std::cerr << "tost_cli: --prompt_tokens takes comma-separated integers, got \"" << id
                << "\"; see tost_cli generate --help\n";
      return kExitUsage;
    }
    req.mutable_prompt_tokens()->add_ids(value);
  }
  if (!ids) req.set_prompt_bytes(absl::GetFlag(FLAGS_prompt));
  if (int usage = SetConstraint(req); usage != kExitOk) return usage;
  req.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  req.mutable_sampling()->set_top_k(absl::GetFlag(FLAGS_top_k));
  req.mutable_sampling()->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  req.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
  const Printer printer(ids, ids ? absl::StrJoin(prompt_ids, " ") : req.prompt_bytes());
  if (absl::GetFlag(FLAGS_resume)) {
    grpc::Status last_error;
    bool answered = false;
    const std::string model = req.model();
    const absl::Status s =
        GenerateResumable(*target.stub, std::move(req), printer, &last_error, &answered);
    if (s.ok()) return kExitOk;
    printer.EndLine();
    // No replica ever answered: the same classes (unreachable, loading, unknown model) as a
    // call without --resume.
    if (!answered && !last_error.ok()) return Fail(target, "Generate", model, last_error);
    std::cerr << "tost_cli: Generate --resume failed: " << s.message() << "\n";
    if (s.code() == absl::StatusCode::kInvalidArgument && last_error.ok() && !answered) {
      return kExitUsage;  // refused before any call: a flag's value
    }
    if (s.code() == absl::StatusCode::kUnavailable) return kExitUnavailable;
    if (s.code() == absl::StatusCode::kNotFound) return kExitNotFound;
    return kExitOther;
  }
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = target.stub->Generate(&ctx, req);
  tost::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_token()) {
      printer.Token(msg.token());
    } else if (msg.has_final()) {
      printer.Final(msg.final());
      std::fprintf(stderr, "[finish: %s, prompt tokens %d (%d cached), generated %d]\n",
                   tost::v1::FinishReason_Name(msg.final().finish_reason()).c_str(),
                   msg.final().prompt_tokens(), msg.final().cached_tokens(),
                   msg.final().generated_tokens());
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    printer.EndLine();
    return Fail(target, "Generate", req.model(), s);
  }
  return kExitOk;
}

// The commands and the flags each takes, in the order --help lists them.
std::vector<tost::cli::CommandSpec> Commands() {
  using tost::cli::FlagUse;
  const FlagUse server{"server", "HOST:PORT"};
  const FlagUse timeout{"timeout_s", "SECONDS"};
  const FlagUse model{"model", "NAME"};
  return {
      {"models",
       "[--server=HOST:PORT]",
       "lists the served models: name, architecture, ready or FAILED (with why), trained or not, "
       "and how a language model decodes (cuda graphs, or eager and why)",
       {server, timeout}},
      {"classify",
       "--model=NAME [--image=FILE | --input=FILE.npy] [--top_k=K] [--membership_png=PREFIX]",
       "classifies images with a vision model and prints the top labels of each",
       {server,
        timeout,
        model,
        {"image", "FILE"},
        {"input", "FILE.npy"},
        {"top_k", "K", "labels printed per image"},
        {"membership_png", "PREFIX"}},
       "Without --image or --input it classifies a synthetic random image of the model's shape."},
      {"generate",
       "--model=NAME (--prompt=TEXT | --prompt_tokens=ID,...) [flags]",
       "generates a continuation of the prompt with a language model, printed as it streams",
       {server,
        {"timeout_s", "SECONDS", "deadline of the call in seconds (with --resume: of it all)"},
        model,
        {"prompt", "TEXT"},
        {"prompt_tokens", "ID,ID,..."},
        {"max_new_tokens", "N"},
        {"temperature", "T"},
        {"top_k", "K", "sampling: only the K likeliest tokens (0 = off; no effect when greedy)"},
        {"top_p", "P"},
        {"seed", "N"},
        {"json_schema", "FILE_OR_JSON"},
        {"regex", "REGEX"},
        {"grammar", "FILE"},
        {"choice", "A,B,..."},
        {"resume", "true|false"},
        {"state_every_tokens", "N"},
        {"max_retries", "N"},
        {"retry_backoff_ms", "MS"}},
       "With --resume the call asks for a state snapshot every --state_every_tokens tokens; when "
       "the stream breaks\n(UNAVAILABLE, a reset stream, a draining server's "
       "FINISH_REASON_DRAINED) it continues from the last snapshot\nthrough --server on "
       "whichever replica answers (any replica with the same model and --session_key_file).\n"
       "Tokens are printed once a snapshot or the final message covers them: none twice, none "
       "lost. Each break is\nreported on stderr.\n"
       "--json_schema, --regex, --grammar and --choice (at most one) constrain the output: each "
       "token keeps it\na prefix of one the constraint accepts, and it ends (FINISH_REASON_EOS) "
       "only once complete;\nFINISH_REASON_LENGTH means --max_new_tokens cut it short "
       "(docs/api.md, Constrained generation).\nWith --resume a continuation goes on under the "
       "constraint: its snapshots carry the constraint's progress."},
  };
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<tost::cli::CommandSpec> commands = Commands();
  const absl::StatusOr<tost::cli::ParsedArgs> parsed = tost::cli::ParseArgs(commands, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "tost_cli: " << parsed.status().message() << "\n";
    return kExitUsage;
  }
  if (parsed->help) {
    std::fputs(parsed->command != nullptr ? tost::cli::CommandHelp(*parsed->command).c_str()
                                          : tost::cli::OverviewHelp(commands).c_str(),
               stdout);
    return kExitOk;
  }
  const std::string command = parsed->command->name;
  if (command != "models" && absl::GetFlag(FLAGS_model).empty()) {
    std::cerr << "tost_cli: " << command
              << " needs --model=NAME, got none; tost_cli models lists the served ones\n";
    return kExitUsage;
  }
  Target target;
  target.address = absl::GetFlag(FLAGS_server);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  target.channel =
      grpc::CreateCustomChannel(target.address, grpc::InsecureChannelCredentials(), args);
  target.stub = Tost::NewStub(target.channel);
  if (command == "models") return Models(target);
  if (command == "classify") return Classify(target);
  return Generate(target);
}
