// libFuzzer target: the OpenAI-compatible API's request bodies (service/openai/request.h). The
// first byte picks the endpoint (even: /v1/completions, odd: /v1/chat/completions), the rest is
// the body. Whatever the bytes: a refusal is INVALID_ARGUMENT with a valid UTF-8 message and a
// valid JSON error body; an accepted request keeps every bound the parser promises, converts to a
// GenerationInput, and its responses (body and stream, fed the prompt's own bytes as tokens that
// split characters) are valid UTF-8 JSON.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/utf8.h"
#include "service/engine/text_stream.h"
#include "service/openai/error.h"
#include "service/openai/request.h"
#include "service/openai/response.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tost::model::FirstInvalidUtf8;
using namespace tost::service;
using namespace tost::service::openai;

// Bytes 0-255 and end of text at 256.
class ByteIds final : public tost::model::Tokenizer {
 public:
  ByteIds() : Tokenizer(257, 256) {}
  std::vector<int32_t> Encode(std::string_view text) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
  const char* type() const override { return "byte"; }
};

tost::model::ModelConfig ChatModel() {
  tost::model::ModelConfig c;
  c.name = "fuzz-lm";
  c.architecture = tost::model::Architecture::kLanguage;
  tost::model::ChatTemplate t;
  t.system = tost::model::ChatTemplate::Turn{"", "\n\n"};
  t.user = {"\"", "\"\n\n"};
  t.assistant = {"\"", "\"\n\n"};
  t.generation_prompt = "\"";
  t.stop = {"\"", "\n\n"};
  t.tools = tost::model::ChatTemplate::Tools{
      "Tools: ", "\n\n", "<call>", "</call>", {"Result: ", "\n\n"}};
  c.chat_template = t;
  c.language.vocab_size = 2048;
  return c;
}

bool ValidJson(const std::string& s) {
  if (FirstInvalidUtf8(s).has_value()) return false;
  return nlohmann::json::accept(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = (data[0] & 1) ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  const std::string_view body = tost::fuzz::Bytes(data + 1, size - 1);
  const absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(endpoint, body);
  if (!r.ok()) {
    TOST_FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    TOST_FUZZ_CHECK(!FirstInvalidUtf8(std::string(r.status().message())).has_value());
    TOST_FUZZ_CHECK(!ErrorParam(r.status()).empty());
    TOST_FUZZ_CHECK(ValidJson(OpenAiErrorBody(r.status())));
    return 0;
  }
  TOST_FUZZ_CHECK(!FirstInvalidUtf8(body).has_value());
  TOST_FUZZ_CHECK(r->endpoint == endpoint);
  TOST_FUZZ_CHECK(!r->model.empty());
  TOST_FUZZ_CHECK(r->n >= 1 && r->n <= kMaxChoicesPerRequest);
  TOST_FUZZ_CHECK(!r->logprobs.has_value() || (*r->logprobs >= 0 && *r->logprobs <= 20));
  TOST_FUZZ_CHECK(!r->max_tokens.has_value() || *r->max_tokens >= (r->echo ? 0 : 1));
  TOST_FUZZ_CHECK(r->logit_bias.size() <= kMaxLogitBias);
  TOST_FUZZ_CHECK(r->tools.size() <= kMaxTools);
  TOST_FUZZ_CHECK(r->tool_choice == ToolChoice::kNone || !r->tools.empty());
  // A required or named call is constrained, and reported under "tools".
  TOST_FUZZ_CHECK(
      (r->tool_choice != ToolChoice::kRequired && r->tool_choice != ToolChoice::kNamed) ||
      (r->constraint.has_value() && r->constraint_field == "tools" &&
       nlohmann::json::accept(r->constraint->text)));
  TOST_FUZZ_CHECK(!r->temperature.has_value() ||
                  (*r->temperature >= 0.f && *r->temperature <= 2.f));
  TOST_FUZZ_CHECK(!r->top_p.has_value() || (*r->top_p > 0.f && *r->top_p <= 1.f));
  TOST_FUZZ_CHECK(r->include_usage <= r->stream);
  TOST_FUZZ_CHECK(r->session_id.empty() || !r->state.has_value());
  if (r->stop.has_value()) {
    TOST_FUZZ_CHECK(r->stop->size() <= static_cast<size_t>(kMaxStop));
    for (const std::string& s : *r->stop)
      TOST_FUZZ_CHECK(!s.empty() && s.size() <= kMaxStopStringBytes);
  }
  if (endpoint == Endpoint::kCompletions) {
    TOST_FUZZ_CHECK(r->prompt_text.has_value() != r->prompt_tokens.has_value());
    TOST_FUZZ_CHECK(r->messages.empty());
  } else {
    TOST_FUZZ_CHECK(!r->messages.empty());
  }

  std::string storage;
  const absl::StatusOr<GenerationInput> in = ToGenerationInput(*r, ChatModel(), &storage);
  if (!in.ok()) {  // what only the model can say: a logit_bias id past its vocabulary
    TOST_FUZZ_CHECK(in.status().code() == absl::StatusCode::kInvalidArgument);
    TOST_FUZZ_CHECK(ErrorParam(in.status()) == "logit_bias");
    return 0;
  }
  if (in->stop.has_value()) TOST_FUZZ_CHECK(in->stop->strings.size() <= kMaxStopStrings);

  // The prompt's bytes generated back one byte-token at a time, as the scheduler publishes them.
  const std::string generated(in->prompt_text.substr(0, 64));
  const ByteIds tokenizer;
  ResponseBuilder whole(*r, {"cmpl-fuzz", 1, r->model}, tokenizer);
  ResponseBuilder stream(*r, {"cmpl-fuzz", 1, r->model}, tokenizer);
  if (r->tool_choice != ToolChoice::kNone) {
    whole.set_call_begin("<call>");
    stream.set_call_begin("<call>");
  }
  TextStream text(in->stop.has_value() ? in->stop->strings : std::vector<std::string>{});
  std::string chunks;
  if (r->echo) {  // the prompt (its first bytes, a byte-token each) before the completion
    EchoedPrompt prompt;
    prompt.text = std::string(in->prompt_text.substr(0, 16));
    for (size_t i = 0; i < prompt.text.size(); ++i) {
      TokenEvent t;
      t.id = static_cast<unsigned char>(prompt.text[i]);
      t.bytes = prompt.text.substr(i, 1);
      if (i > 0) t.logprob = -0.5f;
      prompt.tokens.push_back(std::move(t));
    }
    whole.Echo(prompt);
    chunks += stream.Echo(prompt);
  }
  for (size_t i = 0; i < generated.size(); ++i) {
    TokenEvent t;
    t.id = static_cast<unsigned char>(generated[i]);
    t.bytes = generated.substr(i, 1);
    const TextStream::Output out = text.Push(t.bytes);
    t.text = out.text;
    t.logprob = -1.f;
    t.top_logprobs = {{t.id, -1.f}, {static_cast<int32_t>((t.id + 1) % 257), -2.f}};
    const int32_t choice = static_cast<int32_t>(i % static_cast<size_t>(r->n));
    whole.AddToken(choice, t);
    chunks += stream.Token(choice, t);
    if (out.stop_matched) break;
  }
  GenerationEvent done;
  done.kind = GenerationEvent::Kind::kFinished;
  done.finish_reason = FinishReason::kStop;
  done.final_text = text.Flush();
  for (int32_t i = 0; i < r->n; ++i) {
    TOST_FUZZ_CHECK(whole.Finish(i, done, r->return_state ? "state" : "").ok());
    const absl::StatusOr<std::string> fin = stream.FinishChunk(i, done);
    TOST_FUZZ_CHECK(fin.ok());
    chunks += *fin;
  }
  chunks += stream.End();
  TOST_FUZZ_CHECK(ValidJson(whole.Body()));
  TOST_FUZZ_CHECK(!FirstInvalidUtf8(chunks).has_value());
  size_t at = 0;
  while (at < chunks.size()) {
    TOST_FUZZ_CHECK(chunks.compare(at, 6, "data: ") == 0);
    const size_t end = chunks.find("\n\n", at);
    TOST_FUZZ_CHECK(end != std::string::npos);
    const std::string payload = chunks.substr(at + 6, end - at - 6);
    TOST_FUZZ_CHECK(payload == "[DONE]" || nlohmann::json::accept(payload));
    at = end + 2;
  }
  TOST_FUZZ_CHECK(chunks.size() >= kSseDone.size() &&
                  chunks.compare(chunks.size() - kSseDone.size(), kSseDone.size(), kSseDone) == 0);
  return 0;
}
