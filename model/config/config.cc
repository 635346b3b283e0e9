#include "model/config/config.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "model/config/json_utf8.h"

namespace tost::model {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// The largest size any dimension of a model may have (2^20).
constexpr int64_t kMaxDimension = int64_t{1} << 20;

// Reads a positive integer field `key` of object `obj` (path `where` for messages).
absl::StatusOr<int64_t> PositiveInt(const json& obj, const char* key, const std::string& where,
                                    std::optional<int64_t> fallback = std::nullopt) {
  if (!obj.contains(key)) {
    if (fallback) return *fallback;
    return Invalid(where, absl::StrCat("missing required integer field \"", key, "\""));
  }
  const json& v = obj.at(key);
  if (!v.is_number_integer()) {
    return Invalid(where, absl::StrCat("field \"", key, "\" must be an integer, got ", v.dump()));
  }
  // Bounded so that no product of sizes the loader and the kernels form can overflow.
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{kMaxDimension}
                        ? kMaxDimension + 1
                        : v.get<int64_t>();
  if (x <= 0 || x > kMaxDimension) {
    return Invalid(where, absl::StrCat("field \"", key, "\" must be in [1, ", kMaxDimension,
                                       "], got ", v.dump()));
  }
  return x;
}

absl::StatusOr<std::vector<float>> FloatList(const json& obj, const char* key,
                                             const std::string& where, size_t expected,
                                             float fallback) {
  if (!obj.contains(key)) return std::vector<float>(expected, fallback);
  const json& v = obj.at(key);
  if (!v.is_array() || v.size() != expected) {
    return Invalid(where, absl::StrCat("field \"", key, "\" must be a list of ", expected,
                                       " numbers, got ", v.dump()));
  }
  std::vector<float> out;
  for (const json& e : v) {
    if (!e.is_number())
      return Invalid(where, absl::StrCat("field \"", key, "\" holds a non-number: ", e.dump()));
    out.push_back(e.get<float>());
  }
  return out;
}

absl::StatusOr<VisionConfig> ParseVision(const json& root, const std::string& source) {
  if (!root.contains("vision") || !root["vision"].is_object()) {
    return Invalid(source, "architecture tost_vision needs a \"vision\" object");
  }
  const json& v = root["vision"];
  const std::string where = source + " [vision]";
  VisionConfig c;
  TOST_ASSIGN_OR_RETURN(c.embed_dim, PositiveInt(v, "embed_dim", where));
  TOST_ASSIGN_OR_RETURN(c.depth, PositiveInt(v, "depth", where));
  TOST_ASSIGN_OR_RETURN(c.num_heads, PositiveInt(v, "num_heads", where));
  TOST_ASSIGN_OR_RETURN(c.mlp_ratio, PositiveInt(v, "mlp_ratio", where, 4));
  TOST_ASSIGN_OR_RETURN(c.patch_size, PositiveInt(v, "patch_size", where));
  TOST_ASSIGN_OR_RETURN(c.in_chans, PositiveInt(v, "in_chans", where, 3));
  TOST_ASSIGN_OR_RETURN(c.num_classes, PositiveInt(v, "num_classes", where));
  TOST_ASSIGN_OR_RETURN(c.cls_attn_layers, PositiveInt(v, "cls_attn_layers", where, 2));
  TOST_ASSIGN_OR_RETURN(c.image_height, PositiveInt(v, "image_height", where));
  TOST_ASSIGN_OR_RETURN(c.image_width, PositiveInt(v, "image_width", where));
  if (c.embed_dim % c.num_heads != 0) {
    return Invalid(where, absl::StrCat("embed_dim ", c.embed_dim,
                                       " must be divisible by num_heads ", c.num_heads));
  }
  if (c.patch_size < 2 || (c.patch_size & (c.patch_size - 1)) != 0) {
    return Invalid(where,
                   absl::StrCat("patch_size must be a power of two >= 2, got ", c.patch_size));
  }
  if (c.embed_dim % (int64_t{1} << (c.stem_stages() - 1)) != 0) {
    return Invalid(where,
                   absl::StrCat("embed_dim ", c.embed_dim, " must be divisible by 2^(stages-1) = ",
                                int64_t{1} << (c.stem_stages() - 1), " for a ", c.stem_stages(),
                                "-stage stem (patch_size ", c.patch_size, ")"));
  }
  if (root.contains("labels")) {
    const json& labels = root["labels"];
    if (!labels.is_array() || static_cast<int64_t>(labels.size()) != c.num_classes) {
      return Invalid(
          source,
          absl::StrCat("\"labels\" must be a list of num_classes=", c.num_classes, " strings"));
    }
    for (const json& l : labels) {
      if (!l.is_string())
        return Invalid(source, absl::StrCat("\"labels\" holds a non-string: ", l.dump()));
      c.labels.push_back(l.get<std::string>());
    }
  } else {
    for (int64_t i = 0; i < c.num_classes; ++i) c.labels.push_back(std::to_string(i));
  }
  const json pre = root.value("preprocess", json::object());
  TOST_ASSIGN_OR_RETURN(c.mean, FloatList(pre, "mean", source + " [preprocess]", c.in_chans, 0.f));
  TOST_ASSIGN_OR_RETURN(c.std, FloatList(pre, "std", source + " [preprocess]", c.in_chans, 1.f));
  for (float s : c.std) {
    if (!(s > 0)) return Invalid(source, "preprocess.std entries must be > 0");
  }
  return c;
}

absl::StatusOr<LanguageConfig> ParseLanguage(const json& root, const std::string& source) {
  if (!root.contains("lm") || !root["lm"].is_object()) {
    return Invalid(source, "architecture tost_lm needs an \"lm\" object");
  }
  const json& v = root["lm"];
  const std::string where = source + " [lm]";
  LanguageConfig c;
  TOST_ASSIGN_OR_RETURN(c.n_layer, PositiveInt(v, "n_layer", where));
  TOST_ASSIGN_OR_RETURN(c.n_head, PositiveInt(v, "n_head", where));
  TOST_ASSIGN_OR_RETURN(c.n_embd, PositiveInt(v, "n_embd", where));
  TOST_ASSIGN_OR_RETURN(c.context_length, PositiveInt(v, "context_length", where));
  TOST_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(v, "vocab_size", where));
  TOST_ASSIGN_OR_RETURN(c.mlp_ratio, PositiveInt(v, "mlp_ratio", where, 4));
  if (v.contains("bias")) {
    if (!v["bias"].is_boolean()) return Invalid(where, "field \"bias\" must be true or false");
    c.bias = v["bias"].get<bool>();
  }
  if (c.n_embd % c.n_head != 0) {
    return Invalid(where,
                   absl::StrCat("n_embd ", c.n_embd, " must be divisible by n_head ", c.n_head));
  }
  const json tok = root.value("tokenizer", json::object({{"type", "byte"}}));
  if (!tok.is_object())
    return Invalid(source, absl::StrCat("field \"tokenizer\" must be an object, got ", tok.dump()));
  if (!tok.value("type", json("byte")).is_string()) {
    return Invalid(source, "tokenizer.type must be a string");
  }
  c.tokenizer = tok.value("type", std::string("byte"));
  if (c.tokenizer != "byte" && c.tokenizer != "bpe" && c.tokenizer != "gpt2" &&
      c.tokenizer != "none") {
    return Invalid(
        source,
        absl::StrCat("tokenizer.type must be \"byte\", \"bpe\", \"gpt2\" or \"none\", got \"",
                     c.tokenizer, "\""));
  }
  // A plain file name: a config must not make the server read outside its model directory.
  auto file_field = [&](const char* field, const std::string& fallback,
                        std::string* out) -> absl::Status {
    const json value = tok.value(field, json(fallback));
    *out = value.is_string() ? value.get<std::string>() : std::string();
    if (out->empty() || out->find('/') != std::string::npos ||
        out->find('\\') != std::string::npos || *out == "." || *out == "..") {
      return Invalid(source, absl::StrCat("tokenizer.", field,
                                          " must be a file name inside the model directory, got ",
                                          value.dump()));
    }
    return absl::OkStatus();
  };
  const json eos = tok.value("eos_token_id", json());
  if (!eos.is_null() && !eos.is_number_integer()) {
    return Invalid(source,
                   absl::StrCat("tokenizer.eos_token_id must be an integer, got ", eos.dump()));
  }
  if (c.tokenizer == "byte" || c.tokenizer == "bpe") {
    if (c.vocab_size < 257) {
      return Invalid(where,
                     absl::StrCat("vocab_size must be >= 257 (256 bytes and end-of-text) for "
                                  "the ",
                                  c.tokenizer, " tokenizer, got ", c.vocab_size,
                                  "; a model without a text vocabulary takes tokenizer "
                                  "{\"type\": \"none\"}"));
    }
    if (c.tokenizer == "bpe")
      TOST_RETURN_IF_ERROR(file_field("file", "tokenizer.json", &c.tokenizer_file));
    c.eos_token_id = eos.is_null() ? 256 : eos.get<int64_t>();
    if (c.eos_token_id < 256 || c.eos_token_id >= c.vocab_size) {
      return Invalid(source, absl::StrCat("tokenizer.eos_token_id must be a special id in [256, ",
                                          c.vocab_size, "), got ", c.eos_token_id));
    }
  } else if (c.tokenizer == "gpt2") {
    if (tok.contains("ranks_file")) {
      if (tok.contains("encoder_file") || tok.contains("merges_file")) {
        return Invalid(source,
                       "tokenizer: give ranks_file (tiktoken) or encoder_file and "
                       "merges_file (encoder.json, vocab.bpe), not both");
      }
      TOST_RETURN_IF_ERROR(file_field("ranks_file", "", &c.tokenizer_ranks_file));
    } else {
      TOST_RETURN_IF_ERROR(file_field("encoder_file", "encoder.json", &c.tokenizer_encoder_file));
      TOST_RETURN_IF_ERROR(file_field("merges_file", "vocab.bpe", &c.tokenizer_merges_file));
    }
    // GPT-2's end of text; the tokenizer's files are checked against it when they load.
    c.eos_token_id = eos.is_null() ? 50256 : eos.get<int64_t>();
    if (c.eos_token_id < 256 || c.eos_token_id >= c.vocab_size) {
      return Invalid(source, absl::StrCat("tokenizer.eos_token_id must be in [256, ", c.vocab_size,
                                          ") for the gpt2 tokenizer, got ", c.eos_token_id));
    }
  } else {  // none
    c.eos_token_id = eos.is_null() ? -1 : eos.get<int64_t>();
    if (c.eos_token_id < -1 || c.eos_token_id >= c.vocab_size) {
      return Invalid(source, absl::StrCat("tokenizer.eos_token_id must be -1 (none) or an id in "
                                          "[0, ",
                                          c.vocab_size, "), got ", c.eos_token_id));
    }
  }
  return c;
}

// "chat_template": {"system": ..., "user": ..., "assistant": ..., "generation_prompt": ...,
// "stop": [...]}; `where` prefixes every message.
absl::StatusOr<ChatTemplate> ParseChatTemplateJson(const json& v, const std::string& where) {
  if (!v.is_object()) {
    return Invalid(where,
                   absl::StrCat("chat_template must be an object, got ", Utf8Prefix(v.dump(), 64)));
  }
  static constexpr const char* kKeys[] = {"system", "user", "assistant", "generation_prompt",
                                          "stop",   "tools"};
  for (const auto& item : v.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), item.key()) == std::end(kKeys)) {
      return Invalid(where,
                     absl::StrCat("chat_template has an unknown key \"", Utf8Prefix(item.key(), 64),
                                  "\" (expected system, user, assistant, "
                                  "generation_prompt, stop, tools)"));
    }
  }
  auto text_in = [&](const json& obj, const std::string& key,
                     std::string display = "") -> absl::StatusOr<std::string> {
    if (display.empty()) display = key;
    const json& t = obj.at(key);
    if (!t.is_string()) {
      return Invalid(where, absl::StrCat("chat_template.", display, ": expected a string, got ",
                                         Utf8Prefix(t.dump(), 64)));
    }
    std::string s = t.get<std::string>();
    if (s.size() > kMaxChatTemplateTextBytes) {
      return Invalid(where, absl::StrCat("chat_template.", display, ": at most ",
                                         kMaxChatTemplateTextBytes, " bytes, got ", s.size()));
    }
    return s;
  };
  auto text = [&](const char* key) { return text_in(v, key); };
  // `key`'s text (in `obj`, named `display` in errors) split at its one `placeholder`.
  auto split_in = [&](const json& obj, const std::string& key, const std::string& display,
                      const std::string& placeholder) -> absl::StatusOr<ChatTemplate::Turn> {
    TOST_ASSIGN_OR_RETURN(std::string s, text_in(obj, key, display));
    const size_t at = s.find(placeholder);
    if (at == std::string::npos || s.find(placeholder, at + 1) != std::string::npos) {
      return Invalid(where, absl::StrCat("chat_template.", display, ": expected exactly one \"",
                                         placeholder, "\" (where the ",
                                         placeholder == "{tools}" ? "tools go" : "message goes",
                                         "), got ", Utf8Prefix(json(s).dump(), 64)));
    }
    return ChatTemplate::Turn{s.substr(0, at), s.substr(at + placeholder.size())};
  };
  constexpr std::string_view kPlaceholder = "{content}";
  auto turn = [&](const char* key) { return split_in(v, key, key, std::string(kPlaceholder)); };
  ChatTemplate t;
  for (const char* required : {"user", "assistant"}) {
    if (!v.contains(required)) {
      return Invalid(where, absl::StrCat("chat_template.", required,
                                         ": missing (a string holding \"{content}\")"));
    }
  }
  TOST_ASSIGN_OR_RETURN(t.user, turn("user"));
  TOST_ASSIGN_OR_RETURN(t.assistant, turn("assistant"));
  if (v.contains("system")) {
    TOST_ASSIGN_OR_RETURN(t.system, turn("system"));
  }
  if (v.contains("generation_prompt")) {
    TOST_ASSIGN_OR_RETURN(t.generation_prompt, text("generation_prompt"));
    if (t.generation_prompt.find(kPlaceholder) != std::string::npos) {
      return Invalid(where,
                     "chat_template.generation_prompt: expected no \"{content}\" (it opens the "
                     "reply, which has no content yet)");
    }
  }
  if (v.contains("tools")) {
    const json& tools = v.at("tools");
    static constexpr const char* kToolKeys[] = {"definitions", "call_begin", "call_end", "result"};
    if (!tools.is_object()) {
      return Invalid(where, absl::StrCat("chat_template.tools: expected an object {",
                                         "\"definitions\", \"call_begin\", \"call_end\", "
                                         "\"result\"}, got ",
                                         Utf8Prefix(tools.dump(), 64)));
    }
    for (const char* key : kToolKeys) {
      if (!tools.contains(key)) {
        return Invalid(where, absl::StrCat("chat_template.tools.", key, ": missing"));
      }
    }
    for (const auto& item : tools.items()) {
      if (std::find(std::begin(kToolKeys), std::end(kToolKeys), item.key()) ==
          std::end(kToolKeys)) {
        return Invalid(where, absl::StrCat("chat_template.tools has an unknown key \"",
                                           Utf8Prefix(item.key(), 64),
                                           "\" (expected definitions, call_begin, call_end, "
                                           "result)"));
      }
    }
    ChatTemplate::Tools f;
    TOST_ASSIGN_OR_RETURN(ChatTemplate::Turn defs,
                          split_in(tools, "definitions", "tools.definitions", "{tools}"));
    f.definitions_prefix = std::move(defs.prefix);
    f.definitions_suffix = std::move(defs.suffix);
    TOST_ASSIGN_OR_RETURN(f.call_begin, text_in(tools, "call_begin", "tools.call_begin"));
    TOST_ASSIGN_OR_RETURN(f.call_end, text_in(tools, "call_end", "tools.call_end"));
    if (f.call_begin.empty() || f.call_end.empty()) {
      return Invalid(where,
                     "chat_template.tools: expected a non-empty call_begin and call_end (what "
                     "marks a call in the model's output)");
    }
    TOST_ASSIGN_OR_RETURN(f.result,
                          split_in(tools, "result", "tools.result", std::string(kPlaceholder)));
    t.tools = std::move(f);
  }
  if (v.contains("stop")) {
    const json& stop = v.at("stop");
    if (!stop.is_array() || stop.size() > kMaxChatTemplateStops) {
      return Invalid(where, absl::StrCat("chat_template.stop: expected a list of at most ",
                                         kMaxChatTemplateStops, " strings, got ",
                                         Utf8Prefix(stop.dump(), 64)));
    }
    for (size_t i = 0; i < stop.size(); ++i) {
      const json& e = stop[i];
      if (!e.is_string() || e.get_ref<const std::string&>().empty() ||
          e.get_ref<const std::string&>().size() > kMaxChatTemplateStopBytes) {
        return Invalid(
            where,
            absl::StrCat("chat_template.stop[", i, "]: expected a string of 1 to ",
                         kMaxChatTemplateStopBytes, " bytes, got ", Utf8Prefix(e.dump(), 64)));
      }
      t.stop.push_back(e.get<std::string>());
    }
  }
  return t;
}

// serving.dtypes: a non-empty list of distinct precision names (ParseComputeDtype's).
absl::StatusOr<std::vector<ComputeDtype>> ParseServingDtypes(const json& list,
                                                             const std::string& source) {
  if (!list.is_array() || list.empty() || list.size() > 4) {
    return Invalid(source, absl::StrCat("serving.dtypes must be a list of 1 to 4 of fp32, bf16, "
                                        "fp16, int8, got ",
                                        Utf8Prefix(list.dump(), 64)));
  }
  std::vector<ComputeDtype> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = absl::StrCat("serving.dtypes[", i, "]");
    if (!list[i].is_string()) {
      return Invalid(
          source, absl::StrCat(field, " must be a string, got ", Utf8Prefix(list[i].dump(), 64)));
    }
    absl::StatusOr<ComputeDtype> dtype = ParseComputeDtype(list[i].get<std::string>(), field);
    if (!dtype.ok()) return Invalid(source, std::string(dtype.status().message()));
    if (std::find(out.begin(), out.end(), *dtype) != out.end()) {
      return Invalid(source,
                     absl::StrCat(field, ": \"", ComputeDtypeName(*dtype), "\" is listed twice"));
    }
    out.push_back(*dtype);
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatTemplate> ParseChatTemplate(const std::string& json_text,
                                               const std::string& source) {
  TOST_RETURN_IF_ERROR(CheckJsonUtf8(json_text, source));
  json v;
  try {
    v = json::parse(json_text);
  } catch (const json::exception& e) {
    return Invalid(source, absl::StrCat("not valid JSON: ", EscapeInvalidUtf8(e.what())));
  }
  return ParseChatTemplateJson(v, source);
}

const char* ArchitectureName(Architecture a) {
  return a == Architecture::kVision ? "tost_vision" : "tost_lm";
}

const char* WeightDtypeName(WeightDtype d) {
  switch (d) {
    case WeightDtype::kFloat32:
      return "float32";
    case WeightDtype::kFloat16:
      return "float16";
    case WeightDtype::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

int64_t VisionConfig::stem_stages() const {
  int64_t s = 0;
  for (int64_t p = patch_size; p > 1; p >>= 1) ++s;
  return s;
}

int64_t VisionConfig::tokens() const {
  int64_t h = image_height, w = image_width;
  for (int64_t i = 0; i < stem_stages(); ++i) {
    h = (h + 1) / 2;  // 3x3, stride 2, pad 1
    w = (w + 1) / 2;
  }
  return h * w;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  // Before parsing: the parser refuses invalid UTF-8 too, but its message quotes the bytes raw,
  // and says neither the offset nor the field.
  TOST_RETURN_IF_ERROR(CheckJsonUtf8(json_text, source));
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // a syntax error, or a number out of double's range
    return Invalid(source, absl::StrCat("not valid JSON: ", EscapeInvalidUtf8(e.what())));
  }
  if (!root.is_object()) return Invalid(source, "top level must be a JSON object");
  try {
    ModelConfig cfg;
    const json format = root.value("format_version", json(1));
    if (!format.is_number_integer() || format.get<int64_t>() != 1) {
      return Invalid(source, absl::StrCat("format_version must be 1, got ", format.dump()));
    }
    if (!root.contains("name") || !root["name"].is_string() ||
        root["name"].get<std::string>().empty()) {
      return Invalid(source, "missing non-empty string field \"name\"");
    }
    cfg.name = root["name"].get<std::string>();
    if (root.contains("version")) {
      cfg.version =
          root["version"].is_string() ? root["version"].get<std::string>() : root["version"].dump();
    }
    const std::string arch = root.value("architecture", std::string());
    if (arch == "tost_vision") {
      cfg.architecture = Architecture::kVision;
    } else if (arch == "tost_lm") {
      cfg.architecture = Architecture::kLanguage;
    } else {
      return Invalid(source,
                     absl::StrCat("\"architecture\" must be \"tost_vision\" or \"tost_lm\", got \"",
                                  arch, "\""));
    }
    const std::string dtype = root.value("dtype", std::string("float32"));
    if (dtype == "float32") {
      cfg.dtype = WeightDtype::kFloat32;
    } else if (dtype == "float16") {
      cfg.dtype = WeightDtype::kFloat16;
    } else if (dtype == "bfloat16") {
      cfg.dtype = WeightDtype::kBFloat16;
    } else {
      return Invalid(source, absl::StrCat("\"dtype\" must be float32, float16 or bfloat16, got \"",
                                          dtype, "\""));
    }
    cfg.trained = root.value("trained", false);
    if (root.contains("serving")) {
      const json& serving = root["serving"];
      if (!serving.is_object()) {
        return Invalid(source, absl::StrCat("\"serving\" must be an object with optional "
                                            "\"device\", \"dtype\" and \"dtypes\", got ",
                                            Utf8Prefix(serving.dump(), 64)));
      }
      for (const auto& [key, value] : serving.items()) {
        if (key != "device" && key != "dtype" && key != "dtypes") {
          return Invalid(source,
                         absl::StrCat("\"serving\" has an unknown key \"", Utf8Prefix(key, 64),
                                      "\" (expected device, dtype, dtypes)"));
        }
        if (key == "dtypes") continue;  // a list, read below
        if (!value.is_string()) {
          return Invalid(source, absl::StrCat("serving.", key, " must be a string, got ",
                                              Utf8Prefix(value.dump(), 64)));
        }
      }
      if (serving.contains("device")) {
        absl::StatusOr<DeviceSpec> device =
            ParseDeviceSpec(serving["device"].get<std::string>(), "serving.device");
        if (!device.ok()) return Invalid(source, std::string(device.status().message()));
        cfg.serving_device = *device;
      }
      if (serving.contains("dtype")) {
        absl::StatusOr<ComputeDtype> dtype =
            ParseComputeDtype(serving["dtype"].get<std::string>(), "serving.dtype");
        if (!dtype.ok()) return Invalid(source, std::string(dtype.status().message()));
        cfg.serving_dtype = *dtype;
      }
      if (serving.contains("dtypes")) {
        TOST_ASSIGN_OR_RETURN(cfg.serving_dtypes, ParseServingDtypes(serving["dtypes"], source));
        if (cfg.serving_dtype.has_value() &&
            std::find(cfg.serving_dtypes.begin(), cfg.serving_dtypes.end(), *cfg.serving_dtype) ==
                cfg.serving_dtypes.end()) {
          return Invalid(source,
                         absl::StrCat("serving.dtype \"", ComputeDtypeName(*cfg.serving_dtype),
                                      "\" is not among serving.dtypes ",
                                      Utf8Prefix(serving["dtypes"].dump(), 64)));
        }
      }
    }
    cfg.provenance_json = root.contains("provenance") ? root["provenance"].dump() : "{}";
    if (cfg.architecture == Architecture::kVision) {
      TOST_ASSIGN_OR_RETURN(cfg.vision, ParseVision(root, source));
    } else {
      TOST_ASSIGN_OR_RETURN(cfg.language, ParseLanguage(root, source));
    }
    if (root.contains("chat_template")) {
      if (cfg.architecture != Architecture::kLanguage) {
        return Invalid(source,
                       "chat_template: only a tost_lm model takes one (it renders chats "
                       "into prompts)");
      }
      TOST_ASSIGN_OR_RETURN(cfg.chat_template,
                            ParseChatTemplateJson(root["chat_template"], source));
    }
    return cfg;
  } catch (const json::exception& e) {
    // Type errors (e.g. "trained": "yes") surface here with the field nlohmann names.
    return Invalid(source, absl::StrCat("malformed field: ", EscapeInvalidUtf8(e.what())));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  TOST_ASSIGN_OR_RETURN(std::string text,
                        ReadRegularFile(path, kMaxConfigFileBytes, "config file"));
  return ParseModelConfig(text, path);
}

}  // namespace tost::model
