// JSON field readers shared by the OpenAI-compatible request parsers (chat and completions in
// request.cc, the Responses API and conversations in responses_request.cc): each reads one value,
// and a refusal is INVALID_ARGUMENT naming the field's path, what was expected and what came
// (FieldError, error.h), never the value itself when it is an array or an object (a client's value
// may be megabytes deep).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tost::service::openai {

// How deeply a request body may nest: what OpenAI's requests need (a schema nested as deep as a
// constraint may be, structured::kMaxConstraintNesting, inside a few levels of body), and far
// below what overflows the stack of a recursive reader (base/nesting.h).
inline constexpr size_t kMaxBodyNesting = 320;

// INVALID_ARGUMENT (param "body") unless `body` is valid UTF-8 and nested at most kMaxBodyNesting
// deep: checked before parsing, since nlohmann quotes invalid bytes raw and names no offset, and
// its dump recurses per level.
absl::Status CheckJsonBody(std::string_view body);
// A json exception from parsing or reading a body, as INVALID_ARGUMENT (param "body").
absl::Status JsonBodyError(const nlohmann::json::exception& e);

// Checks and parses a request body, then returns `parse(body_json)`. The one place a json
// exception may surface: parse errors, and any type error a field reader missed (a bug, reported
// as a bad request rather than a crash).
template <typename Parse>
auto ParseJsonBody(std::string_view body, Parse parse) -> decltype(parse(nlohmann::json())) {
  if (absl::Status checked = CheckJsonBody(body); !checked.ok()) return checked;
  try {
    return parse(nlohmann::json::parse(body));
  } catch (const nlohmann::json::exception& e) {
    return JsonBodyError(e);
  }
}

// What a JSON value is, for "expected ..., got ..." messages.
std::string Got(const nlohmann::json& v);
absl::Status Expected(absl::string_view field, absl::string_view what, const nlohmann::json& got);
// A field this server cannot honour, with why.
absl::Status Unsupported(absl::string_view field, absl::string_view why, const nlohmann::json& got);

// A JSON integer in [lo, hi].
absl::StatusOr<int64_t> Int(const nlohmann::json& v, absl::string_view field, int64_t lo,
                            int64_t hi);
absl::StatusOr<double> Number(const nlohmann::json& v, absl::string_view field, double lo,
                              double hi);
absl::StatusOr<bool> Bool(const nlohmann::json& v, absl::string_view field);
absl::StatusOr<std::string> String(const nlohmann::json& v, absl::string_view field);

// The field's value, or null when absent: OpenAI's clients send null for "not set".
const nlohmann::json& Field(const nlohmann::json& body, const char* key);

// temperature (0, or [kMinTemperature, 2]), top_p ((0, 1]) and seed (a signed 64-bit integer, kept
// as its two's-complement bits), each left unset when absent or null.
absl::Status ParseSampling(const nlohmann::json& body, std::optional<float>& temperature,
                           std::optional<float>& top_p, std::optional<uint64_t>& seed);

// The ToST extension "state": a state blob in base64, decoded (left unset when absent or null).
absl::Status ParseStateBlob(const nlohmann::json& body, std::optional<std::string>& state);

// The JSON value at `path` (keys from the body's top level) as text, its objects' keys in the
// order the client wrote them (see json_fields.cc); `sorted` is the same value as parsed.
std::string OrderedSchemaText(std::string_view body, const std::vector<std::string>& path,
                              const nlohmann::json& sorted);

// OpenAI's limit on a json_schema's name, 1 to 64 of [a-zA-Z0-9_-].
inline constexpr size_t kMaxSchemaNameBytes = 64;
bool ValidSchemaName(const std::string& name);

}  // namespace tost::service::openai
