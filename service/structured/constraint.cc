#include "service/structured/constraint.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace tost::structured {
namespace {

// Whether `bytes` is UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing past
// U+10FFFF.
bool IsValidUtf8(const std::string& bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<uint8_t>(bytes[i]);
    int continuation = 0;
    uint8_t low = 0x80, high = 0xBF;  // the range of the first continuation byte
    if (lead < 0x80) {
      continuation = 0;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuation = 2;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuation = 3;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    ++i;
    for (int k = 0; k < continuation; ++k, ++i) {
      if (i >= bytes.size()) return false;
      const auto byte = static_cast<uint8_t>(bytes[i]);
      if (byte < (k == 0 ? low : 0x80) || byte > (k == 0 ? high : 0xBF)) return false;
    }
  }
  return true;
}

bool UsesText(Constraint::Kind kind) {
  return kind == Constraint::Kind::kJsonSchema || kind == Constraint::Kind::kRegex ||
         kind == Constraint::Kind::kGrammar;
}

void AppendPart(std::string* key, const std::string& part) {
  absl::StrAppend(key, part.size(), ":", part);
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
  }
  if (constraint.kind != Constraint::Kind::kChoice) return absl::OkStatus();
  const auto& choices = constraint.choices;
  if (choices.empty() || choices.size() > kMaxChoices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint choices: expected 1 to ", kMaxChoices, " choices, received ", choices.size()));
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
    if (!IsValidUtf8(choices[i])) {
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
