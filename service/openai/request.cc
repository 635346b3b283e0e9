#include "service/openai/request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "service/engine/client_text.h"
#include "service/openai/error.h"
#include "service/openai/json_fields.h"
#include "service/structured/constraint.h"

namespace tost::service::openai {
namespace {

using nlohmann::json;

// A token id list: integers in [0, 2^31).
absl::StatusOr<std::vector<int32_t>> TokenIds(const json& v, absl::string_view field) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    TOST_ASSIGN_OR_RETURN(int64_t id, Int(v[i], absl::StrCat(field, "[", i, "]"), 0,
                                          std::numeric_limits<int32_t>::max()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

absl::Status ParsePrompt(const json& v, OpenAiRequest& r) {
  constexpr absl::string_view kWhat =
      "a string, an array of token ids, or an array holding one of either";
  if (v.is_null())
    return FieldError("prompt", "missing: expected a string or an array of token ids");
  if (v.is_string()) {
    r.prompt_text = v.get<std::string>();
    return absl::OkStatus();
  }
  if (!v.is_array()) return Expected("prompt", kWhat, v);
  if (v.empty() || v[0].is_number()) {
    TOST_ASSIGN_OR_RETURN(r.prompt_tokens, TokenIds(v, "prompt"));
    return absl::OkStatus();
  }
  if (!v[0].is_string() && !v[0].is_array()) return Expected("prompt[0]", kWhat, v[0]);
  if (v.size() > 1) {
    return FieldError("prompt",
                      absl::StrCat("batch prompts are not supported: expected one prompt (a "
                                   "string or an array of token ids), got an array of ",
                                   v.size(), " prompts; send one request per prompt"));
  }
  if (v[0].is_string()) {
    r.prompt_text = v[0].get<std::string>();
    return absl::OkStatus();
  }
  TOST_ASSIGN_OR_RETURN(r.prompt_tokens, TokenIds(v[0], "prompt[0]"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> MessageContent(const json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array())
    return Expected(field, "a string or an array of {\"type\": \"text\"} parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (!part.is_object())
      return Expected(at, "an object {\"type\": \"text\", \"text\": ...}", part);
    const json& type = Field(part, "type");
    if (!type.is_string() || type.get_ref<const std::string&>() != "text") {
      if (type.is_string()) {
        return FieldError(absl::StrCat(at, ".type"),
                          absl::StrCat("expected \"text\" (the only content this server's models "
                                       "take), got ",
                                       Got(type)));
      }
      return Expected(absl::StrCat(at, ".type"), "\"text\"", type);
    }
    TOST_ASSIGN_OR_RETURN(std::string part_text,
                          String(Field(part, "text"), absl::StrCat(at, ".text")));
    text += part_text;
  }
  return text;
}

// An assistant's tool_calls and a tool message's tool_call_id, which must name a call of an
// earlier assistant message.
absl::Status ParseMessageToolFields(const json& m, const std::string& at, ChatMessage& msg,
                                    const std::vector<ChatMessage>& earlier) {
  const json& calls = Field(m, "tool_calls");
  if (!calls.is_null()) {
    const std::string field = absl::StrCat(at, ".tool_calls");
    if (msg.role != ChatRole::kAssistant) {
      return FieldError(field, "only an assistant message carries tool calls");
    }
    if (!calls.is_array() || calls.size() > kMaxTools) {
      return Expected(field, absl::StrCat("an array of at most ", kMaxTools, " tool calls"), calls);
    }
    for (size_t k = 0; k < calls.size(); ++k) {
      const json& c = calls[k];
      const std::string ck = absl::StrCat(field, "[", k, "]");
      if (!c.is_object()) {
        return Expected(
            ck, R"(an object {"id", "type": "function", "function": {"name", "arguments"}})", c);
      }
      ToolCall call;
      TOST_ASSIGN_OR_RETURN(call.id, String(Field(c, "id"), ck + ".id"));
      if (const json& type = Field(c, "type"); !type.is_null() && type != "function") {
        return Expected(ck + ".type", "\"function\"", type);
      }
      const json& fn = Field(c, "function");
      if (!fn.is_object())
        return Expected(ck + ".function", R"(an object {"name", "arguments"})", fn);
      TOST_ASSIGN_OR_RETURN(call.name, String(Field(fn, "name"), ck + ".function.name"));
      TOST_ASSIGN_OR_RETURN(call.arguments,
                            String(Field(fn, "arguments"), ck + ".function.arguments"));
      msg.tool_calls.push_back(std::move(call));
    }
  }
  const json& id = Field(m, "tool_call_id");
  if (msg.role != ChatRole::kTool) {
    if (!id.is_null()) {
      return FieldError(absl::StrCat(at, ".tool_call_id"), "only a tool message answers a call");
    }
    return absl::OkStatus();
  }
  const std::string field = absl::StrCat(at, ".tool_call_id");
  if (id.is_null()) return FieldError(field, "missing: expected the id of the call this answers");
  TOST_ASSIGN_OR_RETURN(msg.tool_call_id, String(id, field));
  for (const ChatMessage& e : earlier) {
    for (const ToolCall& c : e.tool_calls) {
      if (c.id == msg.tool_call_id) return absl::OkStatus();
    }
  }
  return FieldError(field, absl::StrCat("expected the id of a call an earlier assistant message "
                                        "made, got ",
                                        QuoteClientText(msg.tool_call_id)));
}

absl::Status ParseMessages(const json& v, OpenAiRequest& r) {
  if (v.is_null()) return FieldError("messages", "missing: expected an array of messages");
  if (!v.is_array() || v.empty()) return Expected("messages", "a non-empty array of messages", v);
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Expected(at, "an object {\"role\", \"content\"}", m);
    const json& role = Field(m, "role");
    ChatMessage msg;
    const std::string* name = role.is_string() ? &role.get_ref<const std::string&>() : nullptr;
    // "developer" is OpenAI's newer name for the system role.
    if (name != nullptr && (*name == "system" || *name == "developer")) {
      msg.role = ChatRole::kSystem;
    } else if (name != nullptr && *name == "user") {
      msg.role = ChatRole::kUser;
    } else if (name != nullptr && *name == "assistant") {
      msg.role = ChatRole::kAssistant;
    } else if (name != nullptr && *name == "tool") {
      msg.role = ChatRole::kTool;
    } else {
      return Expected(absl::StrCat(at, ".role"),
                      "one of \"system\", \"developer\", \"user\", \"assistant\", \"tool\"", role);
    }
    if (const json& n = Field(m, "name"); !n.is_null()) {
      if (!n.is_string() || !ValidSchemaName(n.get_ref<const std::string&>())) {
        return Expected(absl::StrCat(at, ".name"), "a name of 1 to 64 of a-z, A-Z, 0-9, _ and -",
                        n);
      }
      msg.name = n.get<std::string>();
    }
    for (const char* key : {"audio", "refusal"}) {
      if (const json& v = Field(m, key); !v.is_null()) {
        return Unsupported(absl::StrCat(at, ".", key),
                           std::string_view(key) == "audio"
                               ? "no audio: the models here read and write text"
                               : "no refusals: send the assistant's text as \"content\"",
                           v);
      }
    }
    if (const json& t = Field(m, "function_call"); !t.is_null()) {
      return Unsupported(absl::StrCat(at, ".function_call"),
                         "the deprecated function_call form: send tool_calls", t);
    }
    TOST_RETURN_IF_ERROR(ParseMessageToolFields(m, at, msg, r.messages));
    const json& content = Field(m, "content");
    // An assistant message that calls tools may have no content.
    if (!(content.is_null() && !msg.tool_calls.empty())) {
      TOST_ASSIGN_OR_RETURN(msg.content, MessageContent(content, at + ".content"));
    }
    r.messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& v, OpenAiRequest& r) {
  if (v.is_null()) return absl::OkStatus();
  std::vector<std::string> stop;
  auto one = [&](const json& s, const std::string& field) -> absl::Status {
    if (!s.is_string() || s.get_ref<const std::string&>().empty() ||
        s.get_ref<const std::string&>().size() > kMaxStopStringBytes) {
      return Expected(field, absl::StrCat("a string of 1 to ", kMaxStopStringBytes, " bytes"), s);
    }
    stop.push_back(s.get<std::string>());
    return absl::OkStatus();
  };
  if (v.is_string()) {
    TOST_RETURN_IF_ERROR(one(v, "stop"));
  } else if (v.is_array()) {
    if (v.size() > static_cast<size_t>(kMaxStop)) {
      return Expected("stop",
                      absl::StrCat("a string or an array of at most ", kMaxStop, " strings"), v);
    }
    for (size_t i = 0; i < v.size(); ++i)
      TOST_RETURN_IF_ERROR(one(v[i], absl::StrCat("stop[", i, "]")));
  } else {
    return Expected("stop", absl::StrCat("a string or an array of at most ", kMaxStop, " strings"),
                    v);
  }
  r.stop = std::move(stop);
  return absl::OkStatus();
}

absl::Status ParseLogprobs(const json& body, OpenAiRequest& r) {
  const json& logprobs = Field(body, "logprobs");
  if (r.endpoint == Endpoint::kCompletions) {
    if (logprobs.is_null()) return absl::OkStatus();
    TOST_ASSIGN_OR_RETURN(int64_t n, Int(logprobs, "logprobs", 0, kMaxTopLogprobs));
    r.logprobs = static_cast<int32_t>(n);
    return absl::OkStatus();
  }
  bool wanted = false;
  if (!logprobs.is_null()) {
    TOST_ASSIGN_OR_RETURN(wanted, Bool(logprobs, "logprobs"));
  }
  const json& top = Field(body, "top_logprobs");
  int64_t n = 0;
  if (!top.is_null()) {
    TOST_ASSIGN_OR_RETURN(n, Int(top, "top_logprobs", 0, kMaxTopLogprobs));
    if (!wanted) {
      return FieldError("top_logprobs", absl::StrCat("needs \"logprobs\": true, got ", n,
                                                     " with logprobs ", Got(logprobs)));
    }
  }
  if (wanted) r.logprobs = static_cast<int32_t>(n);
  return absl::OkStatus();
}

absl::Status ParseMaxTokens(const json& body, OpenAiRequest& r) {
  const json& max_tokens = Field(body, "max_tokens");
  // OpenAI's completions schema has no max_completion_tokens; vLLM takes it on both routes, and so
  // does this server, as the same bound.
  const json& max_completion = Field(body, "max_completion_tokens");
  const int64_t hi = std::numeric_limits<int32_t>::max();
  // With echo, 0 asks for the prompt's scores alone (how evaluation harnesses score text).
  const int64_t lo = r.echo ? 0 : 1;
  if (!max_tokens.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t n, Int(max_tokens, "max_tokens", lo, hi));
    r.max_tokens = static_cast<int32_t>(n);
  }
  if (!max_completion.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t n, Int(max_completion, "max_completion_tokens", lo, hi));
    if (r.max_tokens.has_value() && *r.max_tokens != n) {
      return FieldError("max_completion_tokens",
                        absl::StrCat("expected the same value as max_tokens (", *r.max_tokens,
                                     ") or max_tokens left out, got ", n));
    }
    r.max_tokens = static_cast<int32_t>(n);
    r.max_tokens_field = "max_completion_tokens";
  }
  return absl::OkStatus();
}

// vLLM's sampling extensions top_k, min_p and repetition_penalty, and its stop_token_ids.
absl::Status ParseVllmSampling(const json& body, OpenAiRequest& r) {
  if (const json& v = Field(body, "top_k"); !v.is_null()) {
    // vLLM's "off" is -1 (or 0); the sampler's is 0.
    TOST_ASSIGN_OR_RETURN(int64_t k, Int(v, "top_k", -1, std::numeric_limits<int32_t>::max()));
    r.top_k = static_cast<int32_t>(std::max<int64_t>(k, 0));
  }
  if (const json& v = Field(body, "min_p"); !v.is_null()) {
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() < 1.0)) {
      return Expected("min_p", "a number in [0, 1)", v);
    }
    r.min_p = v.get<float>();
  }
  if (const json& v = Field(body, "repetition_penalty"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(double p, Number(v, "repetition_penalty", model::kMinRepetitionPenalty,
                                           model::kMaxRepetitionPenalty));
    r.repetition_penalty = static_cast<float>(p);
  }
  if (const json& v = Field(body, "stop_token_ids"); !v.is_null()) {
    if (!v.is_array()) return Expected("stop_token_ids", "an array of token ids", v);
    // The count is checked before anything is copied (the state's own bound).
    if (v.size() > kMaxStopTokenIds) {
      return FieldError("stop_token_ids", absl::StrCat("expected at most ", kMaxStopTokenIds,
                                                       " token ids, got ", v.size()));
    }
    TOST_ASSIGN_OR_RETURN(r.stop_token_ids, TokenIds(v, "stop_token_ids"));
  }
  return absl::OkStatus();
}

// OpenAI's logit_bias: {"<token id>": bias}, at most kMaxLogitBias entries, biases in
// [-100, 100]. The ids' range is the model's to check (BuildGenerationRequest).
absl::Status ParseLogitBias(const json& v, OpenAiRequest& r) {
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_object()) {
    return Expected("logit_bias", "an object mapping token ids (as strings) to biases", v);
  }
  if (v.size() > kMaxLogitBias) {
    return FieldError("logit_bias", absl::StrCat("expected at most ", kMaxLogitBias,
                                                 " token ids, got ", v.size()));
  }
  for (const auto& [key, bias] : v.items()) {
    int64_t id = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return FieldError("logit_bias",
                        absl::StrCat("expected token ids as decimal strings, got the key ",
                                     QuoteClientText(key)));
    }
    const std::string at = absl::StrCat("logit_bias[\"", id, "\"]");
    TOST_ASSIGN_OR_RETURN(double b, Number(bias, at, -kMaxLogitBiasValue, kMaxLogitBiasValue));
    r.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  // JSON object keys are distinct strings, but "7" and "07" name one id.
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  for (size_t i = 1; i < r.logit_bias.size(); ++i) {
    if (r.logit_bias[i].first == r.logit_bias[i - 1].first) {
      return FieldError("logit_bias", absl::StrCat("expected each token id once, got ",
                                                   r.logit_bias[i].first, " twice"));
    }
  }
  return absl::OkStatus();
}

// The fields of OpenAI's chat schema for what only OpenAI's own service offers (audio, storage,
// moderation, web search, reasoning models' settings, service tiers, cache lifetimes): each is
// accepted at its default (absent, null, or the value that asks for nothing) and refused by name
// otherwise.
absl::Status RefuseServiceOnly(const json& body) {
  struct Rule {
    const char* key;
    const char* why;
    bool (*accepted)(const json&);
  };
  static constexpr Rule kRules[] = {
      {"audio", "no audio output: the models here write text", [](const json&) { return false; }},
      {"modalities", "text output only: [\"text\"] is accepted",
       [](const json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }},
      {"store", "nothing is stored: false is accepted",
       [](const json& v) { return v.is_boolean() && !v.get<bool>(); }},
      {"metadata", "nothing is stored to tag: {} is accepted",
       [](const json& v) { return v.is_object() && v.empty(); }},
      {"moderation", "no moderation model", [](const json&) { return false; }},
      {"prediction", "no predicted outputs", [](const json&) { return false; }},
      {"web_search_options", "no web search", [](const json&) { return false; }},
      {"reasoning_effort", "the models here do not reason before answering: \"none\" is accepted",
       [](const json& v) { return v == "none"; }},
      {"verbosity", "no verbosity setting: the length is max_tokens'",
       [](const json&) { return false; }},
      {"service_tier", "one tier: \"auto\" and \"default\" are accepted",
       [](const json& v) { return v == "auto" || v == "default"; }},
      {"prompt_cache_options",
       "the prefix cache is automatic, without breakpoints or lifetimes: {} is accepted",
       [](const json& v) { return v.is_object() && v.empty(); }},
      {"prompt_cache_retention", "the prefix cache keeps entries by its own byte budget",
       [](const json&) { return false; }},
  };
  for (const Rule& rule : kRules) {
    const json& v = Field(body, rule.key);
    if (!v.is_null() && !rule.accepted(v)) return Unsupported(rule.key, rule.why, v);
  }
  return absl::OkStatus();
}

// The fields that change what is generated and that this server cannot honour: each is accepted
// at its default (absent, null, zero, empty) and refused otherwise.
absl::Status RefuseUnsupported(const json& body, const OpenAiRequest& r) {
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    const json& v = Field(body, key);
    if (v.is_null()) continue;
    TOST_ASSIGN_OR_RETURN(double x, Number(v, key, -2.0, 2.0));
    if (x != 0.0) {
      return Unsupported(key,
                         "OpenAI's penalties subtract from a token's logit per occurrence; "
                         "the model's repetition penalty divides it, which is not the same "
                         "distribution: send 0 (or repetition_penalty, vLLM's)",
                         v);
    }
  }
  // The deprecated forms of tools and tool_choice.
  if (const json& v = Field(body, "functions"); !v.is_null() && !(v.is_array() && v.empty())) {
    if (!v.is_array()) return Expected("functions", "an array", v);
    return Unsupported("functions", "the deprecated functions form: send tools", v);
  }
  if (const json& v = Field(body, "function_call"); !v.is_null() && v != "none") {
    return Unsupported("function_call", "the deprecated function_call form: send tool_choice", v);
  }
  {
    const json& v = Field(body, "suffix");
    if (!v.is_null() && !(v.is_string() && v.get_ref<const std::string&>().empty())) {
      return Unsupported("suffix", "no insertion, completions append only", v);
    }
  }
  {
    const json& v = Field(body, "best_of");
    if (!v.is_null()) {
      TOST_ASSIGN_OR_RETURN(int64_t best_of, Int(v, "best_of", 1, kMaxChoicesPerRequest));
      if (best_of != r.n) {
        return Unsupported(
            "best_of",
            absl::StrCat("no ranking of choices; best_of equal to n (", r.n, ") is accepted"), v);
      }
    }
  }
  return absl::OkStatus();
}

// Records the request's constraint, from body field `source` (reported as `field`); a second
// source is refused, naming both.
absl::Status SetConstraint(OpenAiRequest& r, std::string& source, const std::string& new_source,
                           std::string field, structured::Constraint spec) {
  if (r.constraint.has_value()) {
    return FieldError(
        new_source, absl::StrCat("expected one constraint per request, got two: ", source, " and ",
                                 new_source, " both constrain the output; send one"));
  }
  source = new_source;
  r.constraint = std::move(spec);
  r.constraint_field = std::move(field);
  return absl::OkStatus();
}

absl::Status ParseResponseFormat(std::string_view raw_body, const json& v, OpenAiRequest& r,
                                 std::string& source) {
  constexpr absl::string_view kTypes = R"(one of "text", "json_object", "json_schema")";
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_object()) {
    return Expected("response_format",
                    R"(an object {"type": "text"}, {"type": "json_object"} or {"type": )"
                    R"("json_schema", "json_schema": {"name", "schema"}})",
                    v);
  }
  const json& type = Field(v, "type");
  if (type.is_null())
    return FieldError("response_format.type", absl::StrCat("missing: expected ", kTypes));
  if (!type.is_string()) return Expected("response_format.type", kTypes, type);
  const std::string& t = type.get_ref<const std::string&>();
  if (t == "text") return absl::OkStatus();
  structured::Constraint spec;
  if (t == "json_object") {
    spec.kind = structured::Constraint::Kind::kJsonObject;
    return SetConstraint(r, source, "response_format", "response_format", std::move(spec));
  }
  if (t != "json_schema") return Expected("response_format.type", kTypes, type);
  constexpr absl::string_view kAt = "response_format.json_schema";
  const json& js = Field(v, "json_schema");
  if (js.is_null()) {
    return FieldError(kAt, R"(missing: expected an object {"name", "schema", "strict", )"
                           R"("description"} with "type": "json_schema")");
  }
  if (!js.is_object()) {
    return Expected(kAt, R"(an object {"name", "schema", "strict", "description"})", js);
  }
  const std::string name_field = absl::StrCat(kAt, ".name");
  const std::string what_name = absl::StrCat("a string of 1 to ", kMaxSchemaNameBytes,
                                             " characters from a-z, A-Z, 0-9, _ and -");
  const json& name = Field(js, "name");
  if (name.is_null()) return FieldError(name_field, absl::StrCat("missing: expected ", what_name));
  if (!name.is_string() || !ValidSchemaName(name.get_ref<const std::string&>())) {
    return Expected(name_field, what_name, name);
  }
  if (const json& d = Field(js, "description"); !d.is_null() && !d.is_string()) {
    return Expected(absl::StrCat(kAt, ".description"), "a string", d);
  }
  // strict: false is accepted and enforced all the same (docs/api.md): the schema is always a
  // constraint here, never a hint.
  if (const json& strict = Field(js, "strict"); !strict.is_null()) {
    TOST_RETURN_IF_ERROR(Bool(strict, absl::StrCat(kAt, ".strict")).status());
  }
  const std::string schema_field = absl::StrCat(kAt, ".schema");
  const json& schema = Field(js, "schema");
  if (schema.is_null()) {
    return FieldError(schema_field, "missing: expected a JSON schema (an object)");
  }
  if (!schema.is_object()) return Expected(schema_field, "a JSON schema (an object)", schema);
  spec.kind = structured::Constraint::Kind::kJsonSchema;
  spec.text = OrderedSchemaText(raw_body, {"response_format", "json_schema", "schema"}, schema);
  return SetConstraint(r, source, "response_format", schema_field, std::move(spec));
}

// vLLM's structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object" |
// "structural_tag": ...}, the object that replaced its guided_* fields: exactly one of them; its
// other keys (whitespace and fallback settings of vLLM's backends) are refused by name.
absl::Status ParseStructuredOutputs(std::string_view raw_body, const json& v, OpenAiRequest& r,
                                    std::string& source) {
  if (v.is_null()) return absl::OkStatus();
  constexpr absl::string_view kWhat =
      R"(an object with one of "json", "regex", "choice", "grammar", "json_object", )"
      R"("structural_tag")";
  if (!v.is_object()) return Expected("structured_outputs", kWhat, v);
  std::optional<structured::Constraint> spec;
  std::string field;
  for (const auto& [key, value] : v.items()) {
    if (value.is_null()) continue;
    const std::string at = absl::StrCat("structured_outputs.", key);
    if (key != "json" && key != "regex" && key != "choice" && key != "grammar" &&
        key != "json_object" && key != "structural_tag") {
      return Unsupported(at.size() <= 96 ? at : "structured_outputs",
                         "this server's constraints take no backend settings", value);
    }
    if (spec.has_value()) {
      return FieldError(at, absl::StrCat("expected one constraint in structured_outputs, got two: ",
                                         field, " and ", at));
    }
    structured::Constraint c;
    if (key == "json") {
      c.kind = structured::Constraint::Kind::kJsonSchema;
      if (value.is_object()) {
        c.text = OrderedSchemaText(raw_body, {"structured_outputs", "json"}, value);
      } else if (value.is_string() && !value.get_ref<const std::string&>().empty()) {
        c.text = value.get<std::string>();
      } else {
        return Expected(at, "a JSON schema: an object, or a string holding one", value);
      }
    } else if (key == "regex" || key == "grammar") {
      if (!value.is_string() || value.get_ref<const std::string&>().empty()) {
        return Expected(
            at,
            key == "regex"
                ? "a non-empty string (a regular expression the whole output matches)"
                : "a non-empty string (an XGrammar EBNF grammar whose start rule is root)",
            value);
      }
      c.kind = key == "regex" ? structured::Constraint::Kind::kRegex
                              : structured::Constraint::Kind::kGrammar;
      c.text = value.get<std::string>();
    } else if (key == "choice") {
      if (!value.is_array() || value.empty())
        return Expected(at, "a non-empty array of strings", value);
      c.kind = structured::Constraint::Kind::kChoice;
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string() || value[i].get_ref<const std::string&>().empty()) {
          return Expected(absl::StrCat(at, "[", i, "]"), "a non-empty string", value[i]);
        }
        c.choices.push_back(value[i].get<std::string>());
      }
    } else if (key == "json_object") {
      TOST_ASSIGN_OR_RETURN(bool on, Bool(value, at));
      if (!on) continue;
      c.kind = structured::Constraint::Kind::kJsonObject;
    } else {
      // XGrammar's structural tag, as JSON text or as the object itself.
      c.kind = structured::Constraint::Kind::kStructuralTag;
      if (value.is_object()) {
        c.text = OrderedSchemaText(raw_body, {"structured_outputs", "structural_tag"}, value);
      } else if (value.is_string() && !value.get_ref<const std::string&>().empty()) {
        c.text = value.get<std::string>();
      } else {
        return Expected(
            at,
            R"(an XGrammar structural tag {"type": "structural_tag", "format": ...}: an object, or a string holding one)",
            value);
      }
    }
    spec = std::move(c);
    field = at;
  }
  if (!spec.has_value()) return absl::OkStatus();
  return SetConstraint(r, source, "structured_outputs", field, *std::move(spec));
}

// vLLM's guided_json, guided_regex, guided_grammar and guided_choice, and OpenAI's
// response_format: at most one of them per request.
absl::Status ParseConstraint(std::string_view raw_body, const json& body, OpenAiRequest& r) {
  std::string source;  // the field the constraint came from, for the refusal of a second one
  TOST_RETURN_IF_ERROR(ParseResponseFormat(raw_body, Field(body, "response_format"), r, source));
  if (const json& v = Field(body, "guided_json"); !v.is_null()) {
    structured::Constraint spec;
    spec.kind = structured::Constraint::Kind::kJsonSchema;
    if (v.is_object()) {
      spec.text = OrderedSchemaText(raw_body, {"guided_json"}, v);
    } else if (v.is_string() && !v.get_ref<const std::string&>().empty()) {
      spec.text = v.get<std::string>();
    } else {
      return Expected("guided_json", "a JSON schema: an object, or a string holding one", v);
    }
    TOST_RETURN_IF_ERROR(SetConstraint(r, source, "guided_json", "guided_json", std::move(spec)));
  }
  for (const auto& [key, kind, what] :
       {std::tuple{"guided_regex", structured::Constraint::Kind::kRegex,
                   "a non-empty string (a regular expression the whole output matches)"},
        std::tuple{"guided_grammar", structured::Constraint::Kind::kGrammar,
                   "a non-empty string (an XGrammar EBNF grammar whose start rule is root)"}}) {
    const json& v = Field(body, key);
    if (v.is_null()) continue;
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) return Expected(key, what, v);
    structured::Constraint spec;
    spec.kind = kind;
    spec.text = v.get<std::string>();
    TOST_RETURN_IF_ERROR(SetConstraint(r, source, key, key, std::move(spec)));
  }
  TOST_RETURN_IF_ERROR(
      ParseStructuredOutputs(raw_body, Field(body, "structured_outputs"), r, source));
  if (const json& v = Field(body, "guided_choice"); !v.is_null()) {
    if (!v.is_array() || v.empty())
      return Expected("guided_choice", "a non-empty array of strings", v);
    structured::Constraint spec;
    spec.kind = structured::Constraint::Kind::kChoice;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty()) {
        return Expected(absl::StrCat("guided_choice[", i, "]"), "a non-empty string", v[i]);
      }
      spec.choices.push_back(v[i].get<std::string>());
    }
    TOST_RETURN_IF_ERROR(
        SetConstraint(r, source, "guided_choice", "guided_choice", std::move(spec)));
  }
  return absl::OkStatus();
}

// `schema` with every "$ref" that points into its own document ("#...") rebased to `base`.
template <typename Json>
void RebaseRefs(Json& schema, const std::string& base) {
  if (schema.is_object()) {
    for (auto& [key, value] : schema.items()) {
      if (key == "$ref" && value.is_string()) {
        const std::string ref = value.template get<std::string>();
        if (!ref.empty() && ref[0] == '#') value = base + ref.substr(1);
      } else {
        RebaseRefs(value, base);
      }
    }
  } else if (schema.is_array()) {
    for (Json& e : schema) RebaseRefs(e, base);
  }
}

// Whether some finite JSON value satisfies `node` of schema `root`, as far as its local
// references, combinators, required properties and non-empty arrays go: a reference back to a
// schema being checked on the current path counts as unsatisfiable there, so a schema whose every
// branch recurses ({"$ref": "#"}, or an object requiring itself) has no finite value. `budget`
// bounds the visits (a schema with many shared references); past it the answer is yes, and the
// compiler's own bounds apply.
bool HasFiniteValue(const json& root, const json& node, std::vector<const json*>& path,
                    int64_t& budget) {
  if (--budget < 0 || !node.is_object()) return true;
  if (std::find(path.begin(), path.end(), &node) != path.end()) return false;
  path.push_back(&node);
  bool finite = true;
  const auto all = [&](const json& list) {
    for (const json& e : list) {
      if (!HasFiniteValue(root, e, path, budget)) return false;
    }
    return true;
  };
  if (const json& ref = Field(node, "$ref"); ref.is_string()) {
    const std::string& r = ref.get_ref<const std::string&>();
    if (r == "#" || absl::StartsWith(r, "#/")) {
      try {
        const json::json_pointer pointer(r.substr(1));
        if (root.contains(pointer)) finite = HasFiniteValue(root, root.at(pointer), path, budget);
      } catch (const json::exception&) {
        // Not a pointer nlohmann reads ("~2"): the compiler says what is wrong with it.
      }
    }
  }
  for (const char* any_key : {"anyOf", "oneOf"}) {
    const json& list = Field(node, any_key);
    if (finite && list.is_array() && !list.empty()) {
      finite = std::any_of(list.begin(), list.end(),
                           [&](const json& e) { return HasFiniteValue(root, e, path, budget); });
    }
  }
  if (const json& list = Field(node, "allOf"); finite && list.is_array()) finite = all(list);
  const json& required = Field(node, "required");
  const json& properties = Field(node, "properties");
  if (finite && required.is_array() && properties.is_object()) {
    for (const json& name : required) {
      if (name.is_string() && properties.contains(name.get<std::string>()) &&
          !HasFiniteValue(root, properties.at(name.get<std::string>()), path, budget)) {
        finite = false;
        break;
      }
    }
  }
  if (const json& items = Field(node, "items"); finite && items.is_object()) {
    const json& min_items = Field(node, "minItems");
    if (min_items.is_number() && min_items.get<double>() > 0) {
      finite = HasFiniteValue(root, items, path, budget);
    }
  }
  path.pop_back();
  return finite;
}

// tools, tool_choice and parallel_tool_calls (chat). Each function's parameters are checked as a
// constraint's schema is (structured::Validate: size, nesting, counts) and refused naming
// tools[i].function.parameters; a required or named call's schema (ToolCallSchema) becomes the
// request's constraint, reported under "tools" (the routes narrow the compiler's refusal of it to
// the function whose parameters it refuses: ToolParameterConstraints).
absl::Status ParseTools(std::string_view raw_body, const json& body, OpenAiRequest& r) {
  const json& tools = Field(body, "tools");
  if (!tools.is_null()) {
    // The body once more with its objects' keys in the order sent (nlohmann's json sorts them).
    const nlohmann::ordered_json ordered_body = nlohmann::ordered_json::parse(raw_body);
    const nlohmann::ordered_json& ordered_tools = ordered_body.at("tools");
    if (!tools.is_array() || tools.size() > kMaxTools) {
      return Expected("tools",
                      absl::StrCat("an array of at most ", kMaxTools,
                                   " {\"type\": \"function\", \"function\": {...}}"),
                      tools);
    }
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string at = absl::StrCat("tools[", i, "]");
      const json& t = tools[i];
      if (!t.is_object()) {
        return Expected(at, R"(an object {"type": "function", "function": {"name", "parameters"}})",
                        t);
      }
      if (const json& type = Field(t, "type"); type != "function") {
        return Expected(at + ".type", "\"function\" (the only kind of tool here)", type);
      }
      const json& fn = Field(t, "function");
      if (!fn.is_object()) {
        return Expected(at + ".function", R"(an object {"name", "description", "parameters"})", fn);
      }
      ToolFunction f;
      const json& name = Field(fn, "name");
      if (!name.is_string() || !ValidSchemaName(name.get_ref<const std::string&>())) {
        return Expected(at + ".function.name", "a name of 1 to 64 of a-z, A-Z, 0-9, _ and -", name);
      }
      f.name = name.get<std::string>();
      for (const ToolFunction& other : r.tools) {
        if (other.name == f.name) {
          return FieldError(at + ".function.name",
                            absl::StrCat("expected distinct function names, got ",
                                         QuoteClientText(f.name), " twice"));
        }
      }
      if (const json& d = Field(fn, "description"); !d.is_null()) {
        TOST_ASSIGN_OR_RETURN(f.description, String(d, at + ".function.description"));
      }
      if (const json& strict = Field(fn, "strict"); !strict.is_null()) {
        TOST_RETURN_IF_ERROR(Bool(strict, at + ".function.strict").status());
      }
      const std::string pfield = at + ".function.parameters";
      const json& params = Field(fn, "parameters");
      if (!params.is_null() && !params.is_object()) {
        return Expected(pfield, "a JSON schema (an object)", params);
      }
      // As the client wrote it: the schema's property order is the arguments' order.
      f.parameters = params.is_null() ? std::string("{}")
                                      : ordered_tools.at(i).at("function").at("parameters").dump();
      structured::Constraint c;
      c.kind = structured::Constraint::Kind::kJsonSchema;
      c.text = f.parameters;
      if (absl::Status valid = structured::Validate(c); !valid.ok()) {
        return FieldError(pfield, valid.message());
      }
      std::vector<const json*> path;
      int64_t budget = 100000;
      if (!params.is_null() && !HasFiniteValue(params, params, path, budget)) {
        return FieldError(pfield,
                          "expected a schema some finite JSON value satisfies, got one "
                          "whose references recurse without end (every branch comes back "
                          "to a schema it is inside)");
      }
      r.tools.push_back(std::move(f));
    }
  }
  if (const json& v = Field(body, "parallel_tool_calls"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.parallel_tool_calls, Bool(v, "parallel_tool_calls"));
  }
  r.tool_choice = r.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  const json& choice = Field(body, "tool_choice");
  constexpr absl::string_view kChoices =
      R"("none", "auto", "required" or {"type": "function", "function": {"name"}})";
  if (choice.is_string()) {
    const std::string& c = choice.get_ref<const std::string&>();
    if (c == "none") {
      r.tool_choice = ToolChoice::kNone;
    } else if (c == "auto") {
      r.tool_choice = ToolChoice::kAuto;
    } else if (c == "required") {
      r.tool_choice = ToolChoice::kRequired;
    } else {
      return Expected("tool_choice", kChoices, choice);
    }
  } else if (choice.is_object()) {
    const json& fn = Field(choice, "function");
    const json& name = fn.is_object() ? Field(fn, "name") : fn;
    if (Field(choice, "type") != "function" || !name.is_string()) {
      return Expected("tool_choice", kChoices, choice);
    }
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = name.get<std::string>();
    if (std::none_of(r.tools.begin(), r.tools.end(),
                     [&](const ToolFunction& f) { return f.name == r.tool_choice_name; })) {
      return FieldError("tool_choice.function.name",
                        absl::StrCat("expected the name of one of the request's tools, got ",
                                     QuoteClientText(r.tool_choice_name)));
    }
  } else if (!choice.is_null()) {
    return Expected("tool_choice", kChoices, choice);
  }
  if (r.tool_choice != ToolChoice::kNone && r.tools.empty()) {
    return FieldError("tool_choice", "expected tools to choose from: the request has none");
  }
  if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) {
    if (r.constraint.has_value()) {
      return FieldError(
          "tool_choice",
          absl::StrCat("a required call is constrained by the functions' schemas, "
                       "and ",
                       r.constraint_field, " constrains the output too: send one of them"));
    }
    structured::Constraint c;
    c.kind = structured::Constraint::Kind::kJsonSchema;
    c.text = ToolCallSchema(r);
    r.constraint = std::move(c);
    r.constraint_field = "tools";
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenAiRequest> Parse(Endpoint endpoint, std::string_view raw_body,
                                    const json& body) {
  if (!body.is_object()) return Expected("body", "a JSON object", body);
  OpenAiRequest r;
  r.endpoint = endpoint;
  {
    const json& model = Field(body, "model");
    if (model.is_null()) return FieldError("model", "missing: expected the name of a model");
    if (!model.is_string() || model.get_ref<const std::string&>().empty()) {
      return Expected("model", "a non-empty string", model);
    }
    r.model = model.get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    TOST_RETURN_IF_ERROR(ParsePrompt(Field(body, "prompt"), r));
  } else {
    TOST_RETURN_IF_ERROR(ParseMessages(Field(body, "messages"), r));
  }
  if (const json& v = Field(body, "echo"); !v.is_null() && endpoint == Endpoint::kCompletions) {
    TOST_ASSIGN_OR_RETURN(r.echo, Bool(v, "echo"));
  }
  TOST_RETURN_IF_ERROR(ParseMaxTokens(body, r));
  TOST_RETURN_IF_ERROR(ParseSampling(body, r.temperature, r.top_p, r.seed));
  TOST_RETURN_IF_ERROR(ParseStop(Field(body, "stop"), r));
  TOST_RETURN_IF_ERROR(ParseLogprobs(body, r));
  if (const json& v = Field(body, "n"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t n, Int(v, "n", 1, kMaxChoicesPerRequest));
    r.n = static_cast<int32_t>(n);
  }
  if (const json& v = Field(body, "stream"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.stream, Bool(v, "stream"));
  }
  if (const json& v = Field(body, "stream_options"); !v.is_null()) {
    if (!v.is_object()) return Expected("stream_options", "an object {\"include_usage\": bool}", v);
    if (!r.stream) {
      return FieldError("stream_options", "only with \"stream\": true");
    }
    if (const json& u = Field(v, "include_usage"); !u.is_null()) {
      TOST_ASSIGN_OR_RETURN(r.include_usage, Bool(u, "stream_options.include_usage"));
    }
    if (const json& o = Field(v, "include_obfuscation"); !o.is_null()) {
      TOST_ASSIGN_OR_RETURN(bool obfuscate, Bool(o, "stream_options.include_obfuscation"));
      if (obfuscate) {
        return Unsupported("stream_options.include_obfuscation",
                           "no padding of stream chunks: false is accepted", o);
      }
    }
  }
  TOST_ASSIGN_OR_RETURN(r.identifiers, ParseClientIdentifiers(body));
  TOST_RETURN_IF_ERROR(ParseVllmSampling(body, r));
  TOST_RETURN_IF_ERROR(ParseLogitBias(Field(body, "logit_bias"), r));
  if (endpoint == Endpoint::kChatCompletions) TOST_RETURN_IF_ERROR(RefuseServiceOnly(body));
  TOST_RETURN_IF_ERROR(RefuseUnsupported(body, r));
  TOST_RETURN_IF_ERROR(ParseConstraint(raw_body, body, r));
  if (endpoint == Endpoint::kChatCompletions) TOST_RETURN_IF_ERROR(ParseTools(raw_body, body, r));
  if (const json& v = Field(body, "session_id"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.session_id, String(v, "session_id"));
  }
  TOST_RETURN_IF_ERROR(ParseStateBlob(body, r.state));
  if (!r.session_id.empty() && r.state.has_value()) {
    return FieldError("state", "set session_id or state, not both");
  }
  if (r.echo && (!r.session_id.empty() || r.state.has_value())) {
    return FieldError("echo", absl::StrCat("expected a prompt that starts a sequence, got one "
                                           "continuing ",
                                           r.session_id.empty() ? "a state blob (state)"
                                                                : "a session (session_id)",
                                           ": its earlier tokens are not in the request to echo"));
  }
  if (r.n > 1 && !r.session_id.empty()) {
    return FieldError("n", absl::StrCat("a request continuing a session (session_id) takes n = 1 "
                                        "(one state to write back), got ",
                                        r.n));
  }
  if (const json& v = Field(body, "return_state"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(r.return_state, Bool(v, "return_state"));
  }
  if (const json& v = Field(body, "priority"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(int64_t p, Int(v, "priority", std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max()));
    r.priority = static_cast<int32_t>(p);
  }
  return r;
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, std::string_view body) {
  return ParseJsonBody(body, [&](const json& parsed) { return Parse(endpoint, body, parsed); });
}

std::string ToolCallSchema(const OpenAiRequest& request) {
  using json = nlohmann::ordered_json;  // "name" before "arguments", parameters as sent
  json defs = json::object();
  json calls = json::array();
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const ToolFunction& f = request.tools[i];
    if (request.tool_choice == ToolChoice::kNamed && f.name != request.tool_choice_name) continue;
    const std::string def = absl::StrCat("tool_", i);
    json params = json::parse(f.parameters, nullptr, /*allow_exceptions=*/false);
    if (params.is_discarded() || (params.is_object() && params.empty())) {
      params = json{{"type", "object"}};
    }
    RebaseRefs(params, absl::StrCat("#/$defs/", def));
    defs[def] = std::move(params);
    calls.push_back({{"type", "object"},
                     {"properties",
                      {{"name", {{"const", f.name}}},
                       {"arguments", {{"$ref", absl::StrCat("#/$defs/", def)}}}}},
                     {"required", {"name", "arguments"}},
                     {"additionalProperties", false}});
  }
  json items = calls.size() == 1 ? calls[0] : json{{"anyOf", std::move(calls)}};
  json schema = {{"type", "array"}, {"items", std::move(items)}, {"minItems", 1}};
  // A named function is called once; otherwise parallel_tool_calls false allows one call.
  if (!request.parallel_tool_calls || request.tool_choice == ToolChoice::kNamed) {
    schema["maxItems"] = 1;
  }
  schema["$defs"] = std::move(defs);
  return schema.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<std::pair<std::string, structured::Constraint>> ToolParameterConstraints(
    const OpenAiRequest& request) {
  std::vector<std::pair<std::string, structured::Constraint>> out;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const ToolFunction& f = request.tools[i];
    if (request.tool_choice == ToolChoice::kNamed && f.name != request.tool_choice_name) continue;
    structured::Constraint c;
    c.kind = structured::Constraint::Kind::kJsonSchema;
    c.text = f.parameters;
    out.emplace_back(absl::StrCat("tools[", i, "].function.parameters"), std::move(c));
  }
  return out;
}

bool SetsSampling(const OpenAiRequest& request) {
  return request.temperature.has_value() || request.top_p.has_value() || request.seed.has_value() ||
         request.top_k.has_value() || request.min_p.has_value() ||
         request.repetition_penalty.has_value();
}

GenerationFieldNames FieldNames(const OpenAiRequest& request) {
  GenerationFieldNames names;
  names.max_new_tokens = request.max_tokens_field;
  names.prompt_tokens = "prompt";
  names.prompt_text = request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  names.stop = "stop";
  names.stop_token_ids = "stop_token_ids";
  return names;
}

absl::StatusOr<GenerationInput> ToGenerationInput(const OpenAiRequest& request,
                                                  const model::ModelConfig& config,
                                                  std::string* prompt_storage) {
  GenerationInput in;
  const bool continued = !request.session_id.empty() || request.state.has_value();
  if (request.endpoint == Endpoint::kChatCompletions) {
    if (!config.chat_template.has_value()) {
      TOST_RETURN_IF_ERROR(RenderChat(config, request.messages).status());  // says why
    }
    const model::ChatTemplate& chat = *config.chat_template;
    // "none" shows the model no tools (its history may still hold calls and results).
    const std::vector<ToolFunction> no_tools;
    TOST_ASSIGN_OR_RETURN(
        *prompt_storage,
        RenderChatWithTools(chat, request.messages,
                            request.tool_choice == ToolChoice::kNone ? no_tools : request.tools,
                            config.name));
    const bool must_call =
        request.tool_choice == ToolChoice::kRequired || request.tool_choice == ToolChoice::kNamed;
    // A required call starts at once: the reply opens with the template's call marker, and the
    // constraint (ToolCallSchema) makes the calls' JSON.
    if (must_call) *prompt_storage += chat.tools->call_begin;
    in.prompt_text = *prompt_storage;
    in.stop.emplace();
    in.stop->token_ids = request.stop_token_ids.value_or(std::vector<int32_t>{});
    if (request.constraint.has_value()) {
      // The constraint ends the reply (end-of-text where the output is complete); the template's
      // stop strings (tost-austen's closing quote) would cut a JSON output at its first quote.
      in.stop->strings = request.stop.value_or(std::vector<std::string>{});
    } else {
      in.stop->strings =
          ChatStopStrings(*config.chat_template, request.stop.value_or(std::vector<std::string>{}));
      // With tools offered, the end of a call ends the reply (ParseToolCalls reads it).
      if (request.tool_choice == ToolChoice::kAuto &&
          std::find(in.stop->strings.begin(), in.stop->strings.end(), chat.tools->call_end) ==
              in.stop->strings.end()) {
        in.stop->strings.push_back(chat.tools->call_end);
      }
    }
  } else {
    if (request.prompt_tokens.has_value()) {
      in.prompt_tokens = absl::MakeConstSpan(*request.prompt_tokens);
    } else if (request.prompt_text.has_value()) {
      in.prompt_text = *request.prompt_text;
    }
    if (request.stop.has_value() || request.stop_token_ids.has_value() || !continued) {
      in.stop.emplace();
      in.stop->strings = request.stop.value_or(std::vector<std::string>{});
      in.stop->token_ids = request.stop_token_ids.value_or(std::vector<int32_t>{});
    }
  }
  if (SetsSampling(request) || !continued) {
    model::SamplingParams s;  // temperature 1 and top_p 1: OpenAI's defaults too
    s.temperature = request.temperature.value_or(1.f);
    s.top_p = request.top_p.value_or(1.f);
    s.top_k = request.top_k.value_or(0);
    s.min_p = request.min_p.value_or(0.f);
    s.repetition_penalty = request.repetition_penalty.value_or(1.f);
    s.seed = request.seed.value_or(0);
    in.sampling = s;
  }
  // Checked here as well as by BuildGenerationRequest, so that the refusal carries its param.
  for (const auto& [id, bias] : request.logit_bias) {
    if (id >= config.language.vocab_size) {
      return FieldError(
          "logit_bias",
          absl::StrCat("expected token ids of model ", QuoteClientText(config.name),
                       "'s vocabulary (0 to ", config.language.vocab_size - 1, "), got ", id));
    }
  }
  in.logit_bias = request.logit_bias;
  in.max_new_tokens = request.max_tokens.value_or(0);
  in.logprobs = request.logprobs.has_value();
  in.top_logprobs = request.logprobs.value_or(0);
  return in;
}

namespace {

// The tokenizer routes' optional "model": a non-empty string when given.
absl::Status ParseOptionalModel(const json& body, std::string& model) {
  const json& v = Field(body, "model");
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    return Expected("model", "a non-empty string", v);
  }
  model = v.get<std::string>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  return ParseJsonBody(body, [](const json& b) -> absl::StatusOr<TokenizeRequest> {
    if (!b.is_object()) return Expected("body", "a JSON object", b);
    TokenizeRequest r;
    TOST_RETURN_IF_ERROR(ParseOptionalModel(b, r.model));
    const json& prompt = Field(b, "prompt");
    if (prompt.is_null()) return FieldError("prompt", "missing: expected the text to tokenize");
    TOST_ASSIGN_OR_RETURN(r.prompt, String(prompt, "prompt"));
    if (const json& v = Field(b, "add_special_tokens"); !v.is_null()) {
      TOST_RETURN_IF_ERROR(Bool(v, "add_special_tokens").status());
    }
    return r;
  });
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body) {
  return ParseJsonBody(body, [](const json& b) -> absl::StatusOr<DetokenizeRequest> {
    if (!b.is_object()) return Expected("body", "a JSON object", b);
    DetokenizeRequest r;
    TOST_RETURN_IF_ERROR(ParseOptionalModel(b, r.model));
    const json& tokens = Field(b, "tokens");
    if (tokens.is_null()) return FieldError("tokens", "missing: expected an array of token ids");
    if (!tokens.is_array()) return Expected("tokens", "an array of token ids", tokens);
    TOST_ASSIGN_OR_RETURN(r.tokens, TokenIds(tokens, "tokens"));
    return r;
  });
}

}  // namespace tost::service::openai
