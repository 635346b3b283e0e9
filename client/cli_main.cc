// tost_cli: calls a running tost_server.
//   tost_cli models   [--server=HOST:PORT]
//   tost_cli classify --model=NAME [--input=IMAGE.npy] [--top_k=5]
//   tost_cli generate --model=NAME --prompt=TEXT [--max_new_tokens=64] [--temperature=0] [--top_k]
//   [--top_p] [--seed] [--resume [--state_every_tokens=16] [--max_retries=5]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/membership_png.h"
#include "client/npy.h"
#include "model/file_util.h"
#include "proto/grpc_code_name.h"
#include "service/api/image_decode.h"
#include "tost/v1/tost.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:8500", "Address of tost_server");
ABSL_FLAG(std::string, model, "", "Model name (see `tost_cli models`)");
ABSL_FLAG(std::string, input, "",
          "classify: .npy float32 image [C,H,W] or batch [B,C,H,W], preprocessed; "
          "empty = a synthetic random image of the model's shape");
ABSL_FLAG(std::string, image, "",
          "classify: a PNG or JPEG file, sent encoded (the server decodes and preprocesses it)");
ABSL_FLAG(std::string, membership_png, "",
          "classify: also fetch the TSSA membership maps and write PREFIX_image<i>_layer<l>.png "
          "heatmaps over the image");
ABSL_FLAG(int, top_k, 5, "classify: labels per image; generate: sampling top-k (0 = off)");
ABSL_FLAG(std::string, prompt, "", "generate: prompt text");
ABSL_FLAG(std::vector<std::string>, prompt_tokens, {},
          "generate: the prompt as comma-separated token ids instead of text (models without a "
          "text tokenizer); the output is then printed as token ids too");
ABSL_FLAG(int, max_new_tokens, 64, "generate: tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "generate: sampling temperature (0 = greedy)");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus sampling mass");
ABSL_FLAG(uint64_t, seed, 0, "generate: sampling seed");
ABSL_FLAG(int, timeout_s, 60,
          "Deadline of each call in seconds (generate --resume: of the whole generation, every "
          "continuation and wait included)");
ABSL_FLAG(bool, resume, false,
          "generate: survive a broken stream. Asks for a state snapshot every "
          "--state_every_tokens tokens and, when the stream breaks (UNAVAILABLE, a reset stream, "
          "a drained server's FINISH_REASON_DRAINED), continues from the last snapshot through "
          "--server on whichever replica answers (any replica with the same model and "
          "--session_key_file). Tokens are printed once a snapshot or the final message covers "
          "them, so none is printed twice or lost");
ABSL_FLAG(int, state_every_tokens, 16,
          "generate --resume: snapshot interval; at most this many tokens are generated again "
          "after a break");
ABSL_FLAG(int, max_retries, 5,
          "generate --resume: breaks in a row without a new snapshot before giving up");
ABSL_FLAG(int, retry_backoff_ms, 100,
          "generate --resume: wait before a continuation, doubled per break in a row (at most "
          "2 s)");

namespace {

using tost::GrpcCodeName;
using tost::v1::Tost;

int Fail(const std::string& what, const grpc::Status& s) {
  std::cerr << "tost_cli: " << what << " failed: " << s.error_code() << " " << s.error_message()
            << "\n";
  return 1;
}

void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s)));
}

int Models(Tost::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  tost::v1::ListModelsResponse resp;
  grpc::Status s = stub.ListModels(&ctx, {}, &resp);
  if (!s.ok()) return Fail("ListModels", s);
  for (const auto& m : resp.models()) {
    std::printf("%-20s %-12s %-6s %s%s\n", m.name().c_str(), m.architecture().c_str(),
                m.ready() ? "ready" : "FAILED", m.trained() ? "trained" : "untrained",
                m.error().empty() ? "" : ("  " + m.error()).c_str());
  }
  return 0;
}

int Classify(Tost::Stub& stub) {
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
    grpc::Status s = stub.ListModels(&ctx, {}, &models);
    if (!s.ok()) return Fail("ListModels", s);
    std::vector<int64_t> shape;
    for (const auto& m : models.models()) {
      if (m.name() == req.model()) shape.assign(m.input_shape().begin(), m.input_shape().end());
    }
    if (shape.size() != 3)
      return std::cerr << "tost_cli: model " << req.model() << " is not a served vision model\n", 1;
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
  grpc::Status s = stub.Classify(&ctx, req, &resp);
  if (!s.ok()) return Fail("Classify", s);
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
class Printer {
 public:
  explicit Printer(bool ids) : ids_(ids) {}
  void Token(const tost::v1::GeneratedToken& t) const {
    if (ids_) {
      std::printf(" %d", t.id());
    } else {
      std::fputs(t.text().c_str(), stdout);
    }
    std::fflush(stdout);  // stream: each token appears as it becomes final
  }
  void Final(const tost::v1::GenerateFinal& f) const {
    if (!ids_) std::fputs(f.text().c_str(), stdout);
    std::fprintf(stdout, "\n");
  }

 private:
  bool ids_;
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
absl::Status GenerateResumable(Tost::Stub& stub, tost::v1::GenerateRequest first,
                               const Printer& printer) {
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

int Generate(Tost::Stub& stub) {
  tost::v1::GenerateRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  const std::vector<std::string> prompt_ids = absl::GetFlag(FLAGS_prompt_tokens);
  const bool ids = !prompt_ids.empty();
  if (ids && !absl::GetFlag(FLAGS_prompt).empty()) {
    std::cerr << "tost_cli: give --prompt or --prompt_tokens, not both\n";
    return 2;
  }
  for (const std::string& id : prompt_ids) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(id, &value)) {
      std::cerr << "tost_cli: --prompt_tokens takes integers, got \"" << id << "\"\n";
      return 2;
    }
    req.mutable_prompt_tokens()->add_ids(value);
  }
  if (!ids) req.set_prompt_bytes(absl::GetFlag(FLAGS_prompt));
  req.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  req.mutable_sampling()->set_top_k(absl::GetFlag(FLAGS_top_k));
  req.mutable_sampling()->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  req.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
  const Printer printer(ids);
  std::fputs(ids ? absl::StrJoin(prompt_ids, " ").c_str() : req.prompt_bytes().c_str(), stdout);
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_resume)) {
    const absl::Status s = GenerateResumable(stub, std::move(req), printer);
    if (!s.ok()) {
      std::fprintf(stdout, "\n");
      std::cerr << "tost_cli: Generate --resume failed: " << s.message() << "\n";
      return 1;
    }
    return 0;
  }
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub.Generate(&ctx, req);
  tost::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_token()) {
      printer.Token(msg.token());
    } else if (msg.has_final()) {
      printer.Final(msg.final());
      std::fprintf(stderr, "[finish: %s, prompt tokens %d, generated %d]\n",
                   tost::v1::FinishReason_Name(msg.final().finish_reason()).c_str(),
                   msg.final().prompt_tokens(), msg.final().generated_tokens());
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail("Generate", s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("tost_cli models|classify|generate [flags]; see --helpfull");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() != 2) {
    std::cerr
        << "usage: tost_cli models|classify|generate [--server=HOST:PORT] [--model=NAME] ...\n";
    return 2;
  }
  const std::string command = rest[1];
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = Tost::NewStub(channel);
  if (command == "models") return Models(*stub);
  if (command == "classify") return Classify(*stub);
  if (command == "generate") return Generate(*stub);
  std::cerr << "tost_cli: unknown command \"" << command
            << "\"; expected models, classify or generate\n";
  return 2;
}
