#include "service/openai/json_fields.h"

#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/nesting.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "model/config/config.h"
#include "model/config/json_utf8.h"
#include "service/engine/client_text.h"
#include "service/generation/generation_limits.h"
#include "service/openai/error.h"

namespace tost::service::openai {

using nlohmann::json;

std::string Got(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::string:
      return absl::StrCat("a string (", QuoteClientText(v.get_ref<const std::string&>()), ")");
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return absl::StrCat("an integer (", v.dump(), ")");
    case json::value_t::number_float:
      return absl::StrCat("a number (", v.dump(), ")");
    case json::value_t::array:
      return absl::StrCat("an array of ", v.size(), " element(s)");
    case json::value_t::object:
      return "an object";
    default:
      return "a value of another type";
  }
}

absl::Status Expected(absl::string_view field, absl::string_view what, const json& got) {
  return FieldError(field, absl::StrCat("expected ", what, ", got ", Got(got)));
}

// A JSON integer in [lo, hi].
absl::StatusOr<int64_t> Int(const json& v, absl::string_view field, int64_t lo, int64_t hi) {
  const std::string what = absl::StrCat("an integer in [", lo, ", ", hi, "]");
  if (!v.is_number_integer()) return Expected(field, what, v);
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Expected(field, what, v);
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return Expected(field, what, v);
  return x;
}

absl::StatusOr<double> Number(const json& v, absl::string_view field, double lo, double hi) {
  const std::string what = absl::StrCat("a number in [", lo, ", ", hi, "]");
  if (!v.is_number()) return Expected(field, what, v);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) return Expected(field, what, v);
  return x;
}

absl::StatusOr<bool> Bool(const json& v, absl::string_view field) {
  if (!v.is_boolean()) return Expected(field, "true or false", v);
  return v.get<bool>();
}

absl::StatusOr<std::string> String(const json& v, absl::string_view field) {
  if (!v.is_string()) return Expected(field, "a string", v);
  return v.get<std::string>();
}

// The field's value, or null when absent: OpenAI's clients send null for "not set".
const json& Field(const json& body, const char* key) {
  static const json kNull;
  auto it = body.find(key);
  return it == body.end() ? kNull : *it;
}

absl::Status Unsupported(absl::string_view field, absl::string_view why, const json& got) {
  return FieldError(field,
                    absl::StrCat("not supported by this server (", why, "), got ", Got(got)));
}

// Schemas whose text is at most this long are re-read in their key order (OrderedSchemaText); a
// longer one keeps the parser's sorted order. A bound on that second read's cost (an ordered
// object finds a key by looking at each of its keys, so a schema of k keys costs k^2 / 2
// comparisons: a few tens of milliseconds at this size), equal to the engine's own bound on a
// constraint's text (service/structured/constraint.h), which refuses a longer schema anyway.
constexpr size_t kMaxOrderedSchemaBytes = 64 * 1024;

// The JSON value at `path` (keys from the body's top level) as text, its objects' keys in the
// order the client wrote them. The parser above keeps objects sorted by key, but a schema's order
// matters: a constrained output writes an object's properties in its schema's order (as OpenAI's
// and vLLM's do), so {"answer", "reason"} must not come out as {"reason", "answer"}. The body is
// read a second time, as an ordered_json that keeps only the value at `path`: everything else is
// dropped as it is read, so a large unrelated object costs no more than in the first read.
std::string OrderedSchemaText(std::string_view body, const std::vector<std::string>& path,
                              const json& sorted) {
  std::string text = sorted.dump();
  if (text.size() > kMaxOrderedSchemaBytes) return text;
  using ordered = nlohmann::ordered_json;
  // keys[d - 1]: the key most recently met at depth d (d = 1: the body's own keys).
  std::vector<std::string> keys;
  auto on_path = [&](size_t depth) {
    // The keys down to `depth` lead to the schema (a prefix of `path`), or lie inside it.
    for (size_t i = 0; i < std::min(depth, path.size()); ++i) {
      if (keys[i] != path[i]) return false;
    }
    return true;
  };
  ordered::parser_callback_t keep = [&](int depth, ordered::parse_event_t event, ordered& parsed) {
    if (event != ordered::parse_event_t::key) return true;
    // Arrays deepen without a key: their levels hold "" (no path goes through an array).
    keys.resize(static_cast<size_t>(depth));
    keys.back() = parsed.get<std::string>();
    return on_path(keys.size());
  };
  try {
    const ordered root = ordered::parse(body, keep);
    const ordered* at = &root;
    for (const std::string& key : path) {
      if (!at->is_object() || !at->contains(key)) return text;
      at = &(*at)[key];
    }
    return at->dump();
  } catch (const ordered::exception&) {
    return text;  // cannot happen (the body parsed once already); the sorted text is as valid
  }
}

// OpenAI's json_schema.name: 1 to 64 of a-z, A-Z, 0-9, _ and -.
bool ValidSchemaName(const std::string& name) {
  if (name.empty() || name.size() > kMaxSchemaNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

absl::Status CheckJsonBody(std::string_view body) {
  if (absl::Status utf8 = model::CheckJsonUtf8(body, "request body"); !utf8.ok()) {
    return WithParam(utf8, "body");
  }
  if (const std::optional<NestingExcess> excess = JsonNestingPast(body, kMaxBodyNesting)) {
    return FieldError("body", absl::StrCat("expected JSON nested at most ", kMaxBodyNesting,
                                           " levels deep, got deeper (level ", excess->depth,
                                           " at byte offset ", excess->offset, ")"));
  }
  return absl::OkStatus();
}

absl::Status JsonBodyError(const json::exception& e) {
  // nlohmann's text starts with its own exception's name ("[json.exception.parse_error.101] "),
  // which is its code, and may end quoting the token it last read, which can be most of the body:
  // the position and what was expected are the parts a client uses.
  std::string_view what = e.what();
  if (!what.empty() && what.front() == '[') {
    if (const size_t close = what.find("] "); close != std::string_view::npos) {
      what.remove_prefix(close + 2);
    }
  }
  what = what.substr(0, what.find("; last read: "));
  std::string shown = model::EscapeInvalidUtf8(what.substr(0, 200));
  if (what.size() > 200) shown += "...";
  return FieldError("body", absl::StrCat("expected a JSON object: ", shown));
}

absl::Status ParseStateBlob(const json& body, std::optional<std::string>& state) {
  const json& v = Field(body, "state");
  if (v.is_null()) return absl::OkStatus();
  TOST_ASSIGN_OR_RETURN(std::string encoded, String(v, "state"));
  std::string blob;
  if (encoded.empty() || !absl::Base64Unescape(encoded, &blob)) {
    return FieldError("state",
                      absl::StrCat("expected a state blob in base64 (RFC 4648), got ", Got(v)));
  }
  state = std::move(blob);
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, std::optional<float>& temperature,
                           std::optional<float>& top_p, std::optional<uint64_t>& seed) {
  if (const json& v = Field(body, "temperature"); !v.is_null()) {
    TOST_ASSIGN_OR_RETURN(double t, Number(v, "temperature", 0.0, kOpenAiMaxTemperature));
    if (t != 0.0 && t < model::kMinTemperature) {
      return Expected("temperature",
                      absl::StrCat("0 (greedy) or a number in [", model::kMinTemperature, ", ",
                                   kOpenAiMaxTemperature, "]"),
                      v);
    }
    temperature = static_cast<float>(t);
  }
  if (const json& v = Field(body, "top_p"); !v.is_null()) {
    if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0)) {
      return Expected("top_p", "a number in (0, 1]", v);
    }
    top_p = v.get<float>();
  }
  if (const json& v = Field(body, "seed"); !v.is_null()) {
    // OpenAI's seed is a signed 64-bit integer; the sampler's is its two's-complement bits.
    TOST_ASSIGN_OR_RETURN(int64_t signed_seed, Int(v, "seed", std::numeric_limits<int64_t>::min(),
                                                   std::numeric_limits<int64_t>::max()));
    seed = static_cast<uint64_t>(signed_seed);
  }
  return absl::OkStatus();
}

}  // namespace tost::service::openai
