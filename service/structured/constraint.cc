#include "service/structured/constraint.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/nesting.h"
#include "base/utf8.h"

namespace tost::structured {
namespace {

bool UsesText(Constraint::Kind kind) {
  return kind == Constraint::Kind::kJsonSchema || kind == Constraint::Kind::kRegex ||
         kind == Constraint::Kind::kGrammar || kind == Constraint::Kind::kStructuralTag;
}

void AppendPart(std::string* key, const std::string& part) {
  absl::StrAppend(key, part.size(), ":", part);
}

// What a regular expression spells out (kMaxSchemaPatternExpansion): each character, escape or
// class counts 1, a group the sum of what is inside it (every alternative), and a repetition
// {n}, {n,} or {n,m} multiplies what it follows by m (n when unbounded); * + ? count nothing (a
// loop, not a copy). Saturates at `cap`, so the products of nested repetitions cannot overflow.
size_t PatternExpansion(std::string_view re, size_t cap) {
  struct Group {
    size_t sum = 0;
    size_t last = 0;  // the weight of the atom a following repetition applies to
  };
  const auto add = [cap](size_t a, size_t b) { return std::min(cap, a + b); };
  const auto mul = [cap](size_t a, size_t b) { return b != 0 && a > cap / b ? cap : a * b; };
  std::vector<Group> groups(1);
  size_t i = 0;
  const auto atom = [&](size_t weight) {
    groups.back().sum = add(groups.back().sum, weight);
    groups.back().last = weight;
  };
  const auto digits = [&](size_t* at, size_t* value) {
    const size_t start = *at;
    *value = 0;
    while (*at < re.size() && re[*at] >= '0' && re[*at] <= '9') {
      *value = std::min(cap, *value * 10 + static_cast<size_t>(re[*at] - '0'));
      ++*at;
    }
    return *at > start;
  };
  while (i < re.size()) {
    const char c = re[i];
    if (c == '\\') {
      i += 2;
      atom(1);
    } else if (c == '[') {
      for (++i; i < re.size() && re[i] != ']'; ++i) {
        if (re[i] == '\\') ++i;
      }
      ++i;
      atom(1);
    } else if (c == '(') {
      groups.emplace_back();
      ++i;
      if (i < re.size() && re[i] == '?') {  // (?:...), (?=...), (?<name>...): not atoms
        while (i < re.size() && re[i] != ':' && re[i] != '=' && re[i] != '!' && re[i] != '>') ++i;
        ++i;
      }
    } else if (c == ')') {
      ++i;
      if (groups.size() > 1) {
        const size_t weight = groups.back().sum;
        groups.pop_back();
        atom(weight);
      }
    } else if (c == '{') {
      size_t at = i + 1, low = 0, high = 0;
      bool repetition = digits(&at, &low);
      high = low;
      if (repetition && at < re.size() && re[at] == ',') {
        ++at;
        if (!digits(&at, &high)) high = low;
      }
      repetition = repetition && at < re.size() && re[at] == '}';
      if (repetition) {
        Group& g = groups.back();
        const size_t repeated = mul(g.last, std::max(high, low));
        g.sum = add(g.sum - std::min(g.sum, g.last), repeated);
        g.last = repeated;
        i = at + 1;
      } else {
        ++i;
        atom(1);
      }
    } else if (c == '*' || c == '+' || c == '?' || c == '|') {
      ++i;
    } else {
      ++i;
      atom(1);
    }
  }
  size_t total = 0;
  for (const Group& g : groups) total = add(total, g.sum);  // unclosed groups count too
  return total;
}

// The schema keywords whose values are schemas (the others hold data: enum, const, default,
// examples), by the shape of the value.
bool IsSchemaMap(std::string_view k) {
  return k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions" ||
         k == "dependentSchemas";
}
bool IsSchemaList(std::string_view k) {
  return k == "anyOf" || k == "oneOf" || k == "allOf" || k == "prefixItems" || k == "items";
}
bool IsSchema(std::string_view k) {
  return k == "items" || k == "additionalProperties" || k == "additionalItems" ||
         k == "unevaluatedProperties" || k == "unevaluatedItems" || k == "propertyNames" ||
         k == "contains" || k == "not" || k == "if" || k == "then" || k == "else";
}

// Counts a schema's properties and enum values and checks its patterns, walking its subschemas.
// The text's nesting is bounded (kMaxConstraintNesting) before this recursion runs.
class SchemaCounter {
 public:
  absl::Status Walk(const nlohmann::json& schema) {
    if (!schema.is_object()) return absl::OkStatus();
    const auto properties = schema.find("properties");
    if (properties != schema.end() && properties->is_object()) {
      const auto required = schema.find("required");
      for (const auto& [name, sub] : properties->items()) {
        const bool is_required =
            required != schema.end() && required->is_array() &&
            std::find(required->begin(), required->end(), nlohmann::json(name)) != required->end();
        if (!is_required) ++optional_properties;
      }
    }
    for (const auto& [key, value] : schema.items()) {
      path_.push_back(key);
      absl::Status status = Keyword(key, value);
      path_.pop_back();
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  size_t optional_properties = 0;
  size_t enum_values = 0;

 private:
  absl::Status Keyword(const std::string& key, const nlohmann::json& value) {
    if (key == "enum" && value.is_array()) enum_values += value.size();
    if (key == "const") ++enum_values;
    if (key == "pattern" && value.is_string()) {
      if (absl::Status s = Pattern(value.get_ref<const std::string&>()); !s.ok()) return s;
    }
    if (IsSchemaMap(key) && value.is_object()) {
      for (const auto& [name, sub] : value.items()) {
        path_.push_back(name);
        absl::Status status = key == "patternProperties" ? Pattern(name) : absl::OkStatus();
        if (status.ok()) status = Walk(sub);
        path_.pop_back();
        if (!status.ok()) return status;
      }
    } else if (IsSchemaList(key) && value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i) {
        path_.push_back(absl::StrCat(i));
        absl::Status status = Walk(value[i]);
        path_.pop_back();
        if (!status.ok()) return status;
      }
    } else if (IsSchema(key)) {
      return Walk(value);
    }
    return absl::OkStatus();
  }

  absl::Status Pattern(std::string_view pattern) {
    const size_t expansion = PatternExpansion(pattern, kMaxSchemaPatternExpansion + 1);
    if (expansion <= kMaxSchemaPatternExpansion) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint text: expected each pattern of a json_schema to spell out at most ",
        kMaxSchemaPatternExpansion,
        " characters (a repetition {n,m} counting what it repeats m times), received one that "
        "spells out more at ",
        PathText()));
  }

  // Where the walk is, as a JSON pointer: its last 64 bytes (the names are the client's, of any
  // length), control bytes escaped.
  std::string PathText() const {
    constexpr size_t kMaxBytes = 64;
    std::string path = "/" + absl::StrJoin(path_, "/");
    std::string_view tail = path;
    bool cut = false;
    if (tail.size() > kMaxBytes) {
      tail.remove_prefix(tail.size() - kMaxBytes);
      while (!tail.empty() && (static_cast<unsigned char>(tail.front()) & 0xC0) == 0x80) {
        tail.remove_prefix(1);  // from a character's first byte
      }
      cut = true;
    }
    std::string text = cut ? "..." : "";
    for (const char c : tail) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte == 0x7F) {
        absl::StrAppend(&text, "\\x", absl::Hex(byte, absl::kZeroPad2));
      } else {
        text += c;
      }
    }
    return text;
  }

  std::vector<std::string> path_;
};

absl::Status ValidateSchemaCounts(const std::string& text) {
  // Not JSON: the compiler says why, in its words.
  const nlohmann::json schema = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::OkStatus();
  SchemaCounter counter;
  if (absl::Status s = counter.Walk(schema); !s.ok()) return s;
  if (counter.optional_properties > kMaxSchemaOptionalProperties) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint text: expected a json_schema of at most ", kMaxSchemaOptionalProperties,
        " optional properties (in its objects' \"properties\" but not their \"required\", "
        "together), received ",
        counter.optional_properties));
  }
  if (counter.enum_values > kMaxSchemaEnumValues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint text: expected a json_schema of at most ", kMaxSchemaEnumValues,
        " enum and const values (its enums' together), received ", counter.enum_values));
  }
  return absl::OkStatus();
}

}  // namespace

const char* KindName(Constraint::Kind kind) {
  switch (kind) {
    case Constraint::Kind::kJsonSchema:
      return "json_schema";
    case Constraint::Kind::kJsonObject:
      return "json_object";
    case Constraint::Kind::kRegex:
      return "regex";
    case Constraint::Kind::kGrammar:
      return "grammar";
    case Constraint::Kind::kChoice:
      return "choice";
    case Constraint::Kind::kStructuralTag:
      return "structural_tag";
  }
  return "unknown";
}

absl::Status Validate(const Constraint& constraint) {
  const char* kind = KindName(constraint.kind);
  if (UsesText(constraint.kind)) {
    if (constraint.text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraint text: expected a non-empty ", kind, ", received an empty one"));
    }
    if (constraint.text.size() > kMaxConstraintTextBytes) {
      return absl::InvalidArgumentError(absl::StrCat("constraint text: expected a ", kind,
                                                     " of at most ", kMaxConstraintTextBytes,
                                                     " bytes, received ", constraint.text.size()));
    }
    const std::optional<NestingExcess> excess =
        constraint.kind == Constraint::Kind::kJsonSchema ||
                constraint.kind == Constraint::Kind::kStructuralTag
            ? JsonNestingPast(constraint.text, kMaxConstraintNesting)
        : constraint.kind == Constraint::Kind::kRegex
            ? RegexNestingPast(constraint.text, kMaxConstraintNesting)
            : GrammarNestingPast(constraint.text, kMaxConstraintNesting);
    if (excess.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("constraint text: expected a ", kind, " nested at most ",
                       kMaxConstraintNesting, " levels deep, received one nested past that (level ",
                       excess->depth, " at byte offset ", excess->offset, ")"));
    }
    if (constraint.kind == Constraint::Kind::kJsonSchema) {
      if (absl::Status counts = ValidateSchemaCounts(constraint.text); !counts.ok()) return counts;
    }
  }
  if (constraint.kind != Constraint::Kind::kChoice) return absl::OkStatus();
  const auto& choices = constraint.choices;
  if (choices.empty() || choices.size() > kMaxConstraintChoices) {
    return absl::InvalidArgumentError(absl::StrCat("constraint choices: expected 1 to ",
                                                   kMaxConstraintChoices, " choices, received ",
                                                   choices.size()));
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constraint choices[", i, "]: expected a non-empty string, received an empty one"));
    }
    if (choices[i].size() > kMaxChoiceBytes) {
      return absl::InvalidArgumentError(absl::StrCat("constraint choices[", i,
                                                     "]: expected at most ", kMaxChoiceBytes,
                                                     " bytes, received ", choices[i].size()));
    }
    if (model::FirstInvalidUtf8(choices[i]).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constraint choices[", i, "]: expected UTF-8 text, received bytes that are not UTF-8"));
    }
  }
  return absl::OkStatus();
}

std::string ContentKey(const Constraint& constraint) {
  std::string key = KindName(constraint.kind);
  key += '|';
  if (UsesText(constraint.kind)) AppendPart(&key, constraint.text);
  if (constraint.kind == Constraint::Kind::kChoice) {
    absl::StrAppend(&key, constraint.choices.size(), "#");
    for (const std::string& choice : constraint.choices) AppendPart(&key, choice);
  }
  return key;
}

}  // namespace tost::structured
