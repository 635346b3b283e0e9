#include "service/structured/constraint.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/nesting.h"
#include "base/utf8.h"

namespace tost::structured {
namespace {

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
    const std::optional<NestingExcess> excess =
        constraint.kind == Constraint::Kind::kJsonSchema
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
