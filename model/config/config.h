// Model configuration: the parsed, validated form of <repo>/<name>/config.json
// (format in docs/model-repository.md). Torch-free: the service reads it too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config/device.h"

namespace tost::model {

enum class Architecture { kVision, kLanguage };
enum class WeightDtype { kFloat32, kFloat16, kBFloat16 };

const char* ArchitectureName(Architecture a);
const char* WeightDtypeName(WeightDtype d);

struct VisionConfig {
  int64_t embed_dim = 0;
  int64_t depth = 0;
  int64_t num_heads = 0;
  int64_t mlp_ratio = 4;
  int64_t patch_size = 16;  // power of two; log2 of it = stem stages
  int64_t in_chans = 3;
  int64_t num_classes = 0;
  int64_t cls_attn_layers = 2;
  int64_t image_height = 0;  // the one resolution served
  int64_t image_width = 0;
  std::vector<std::string> labels;  // num_classes entries ("0".."n-1" when the config has none)
  std::vector<float> mean;          // per channel, applied to images in [0,1]
  std::vector<float> std;

  int64_t stem_stages() const;
  int64_t tokens() const;  // patch tokens at the served resolution
};

struct LanguageConfig {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  int64_t mlp_ratio = 4;
  bool bias = false;
  // "byte", "bpe", "gpt2" or "none" (model/text/tokenizer.h). Every file below is a plain name
  // inside the model directory.
  std::string tokenizer = "byte";
  std::string tokenizer_file;          // bpe: the merges file
  std::string tokenizer_encoder_file;  // gpt2: encoder.json (with tokenizer_merges_file) ...
  std::string tokenizer_merges_file;   // ... and vocab.bpe
  std::string tokenizer_ranks_file;    // gpt2: or a tiktoken rank file instead
  // End of text: a special id (>= 256) for byte and bpe; "<|endoftext|>" for gpt2; for none, -1
  // when the model has no end-of-text id.
  int64_t eos_token_id = 256;

  // Floats of per-sequence TSSA state per layer: S1 (C) + S2 (C) + S3 (K).
  int64_t state_floats_per_layer() const { return 2 * n_embd + n_head; }
};

// How a chat (a list of role-tagged messages) becomes a prompt, for the OpenAI-compatible chat
// endpoint: config.json "chat_template" (format in docs/models.md). Not Jinja, which no C++ library
// in Debian implements: each role's turn is `prefix + content + suffix`, the turns in order, then
// `generation_prompt` opens the reply. A message's content is inserted as is, never re-read.
struct ChatTemplate {
  struct Turn {
    std::string prefix;  // the role's template text before "{content}"
    std::string suffix;  // and after it
  };
  std::optional<Turn> system;  // absent: the model takes no system messages
  Turn user;
  Turn assistant;
  std::string generation_prompt;  // appended after the last turn: where the reply starts
  // Stop strings every chat request gets (the end of a turn), before the request's own.
  std::vector<std::string> stop;
  // How the model sees tools and calls them ("tools"; absent: the model takes no tool calls). The
  // request's functions, as a JSON array of {"name", "description", "parameters"}, replace
  // "{tools}" in `definitions`, which comes before the first turn. An assistant turn's calls are
  // `call_begin` + a JSON array of {"name", "arguments"} + `call_end`, after its content; a tool
  // message is a `result` turn.
  struct Tools {
    std::string definitions_prefix;  // `definitions` before "{tools}"
    std::string definitions_suffix;  // and after it
    std::string call_begin;
    std::string call_end;
    Turn result;
  };
  std::optional<Tools> tools;
};

// Bounds on a chat template: its stop strings join a request's (at most 4) in a state that holds
// at most 16 (service/engine/generation_state.h), each of at most 256 bytes.
inline constexpr size_t kMaxChatTemplateStops = 8;
inline constexpr size_t kMaxChatTemplateStopBytes = 256;
inline constexpr size_t kMaxChatTemplateTextBytes = 4096;  // per template string

struct ModelConfig {
  std::string name;
  std::string version = "1";
  Architecture architecture = Architecture::kVision;
  WeightDtype dtype = WeightDtype::kFloat32;
  bool trained = false;
  std::string provenance_json;  // the "provenance" object, re-serialised, for ModelInfo
  // "serving": {"device": ..., "dtype": ...}: overrides of the server's --device and --dtype for
  // this model (model/config/device.h). "dtype" above is the weight file's dtype, not this.
  std::optional<DeviceSpec> serving_device;
  std::optional<ComputeDtype> serving_dtype;
  // "serving": {"dtypes": [...]}: the precisions this model may be served in (whoever checked its
  // quality at each says so); empty: any. A load at another fails, naming the model and the list.
  std::vector<ComputeDtype> serving_dtypes;
  VisionConfig vision;                        // when architecture == kVision
  LanguageConfig language;                    // when architecture == kLanguage
  std::optional<ChatTemplate> chat_template;  // tost_lm only; absent: no chat endpoint
};

// Parses a "chat_template" object's JSON text (ParseModelConfig does it for config.json; exposed
// for tests and for the fuzzer). Errors name `source`, the key, what was expected and what came.
absl::StatusOr<ChatTemplate> ParseChatTemplate(const std::string& json_text,
                                               const std::string& source);

// Parses and validates config.json text. `source` names the file in every error message.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);

// Reads and parses <model_dir>/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace tost::model
