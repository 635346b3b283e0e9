// tost_cli: calls a running tost_server.
//   tost_cli models   [--server=HOST:PORT]
//   tost_cli classify --model=NAME [--input=IMAGE.npy] [--top_k=5]
//   tost_cli generate --model=NAME --prompt=TEXT [--max_new_tokens=64] [--temperature=0] [--top_k]
//   [--top_p] [--seed]
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "client/membership_png.h"
#include "client/npy.h"
#include "model/file_util.h"
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
ABSL_FLAG(int, timeout_s, 60, "Deadline of each call in seconds");

namespace {

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
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto reader = stub.Generate(&ctx, req);
  tost::v1::GenerateResponse msg;
  std::fputs(ids ? absl::StrJoin(prompt_ids, " ").c_str() : req.prompt_bytes().c_str(), stdout);
  std::fflush(stdout);
  while (reader->Read(&msg)) {
    if (msg.has_token()) {
      if (ids) {
        std::printf(" %d", msg.token().id());
      } else {
        std::fputs(msg.token().text().c_str(), stdout);
      }
      std::fflush(stdout);  // stream: each token appears as it arrives
    } else if (msg.has_final()) {
      if (!ids) std::fputs(msg.final().text().c_str(), stdout);
      std::fprintf(stdout, "\n");
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
