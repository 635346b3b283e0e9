// What a request asks its output to conform to (a JSON schema, any JSON object, a regex, an
// XGrammar EBNF grammar, or one of a list of strings), its checks, and the key the grammar cache
// files its compiled form under: the one constraint type, from the parsers (tost.v1, OpenAI)
// through the engine and a session's state to the masker. No tokenizer and no XGrammar here (its
// own target, tost_constraint): the same constraint compiles once per model vocabulary
// (grammar_cache.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tost::structured {

struct Constraint {
  enum class Kind {
    kJsonSchema,  // `text` is a JSON schema
    kJsonObject,  // any JSON object; `text` and `choices` unused
    kRegex,       // `text` is a regular expression the whole output matches
    kGrammar,     // `text` is an XGrammar EBNF grammar whose start rule is `root`
    kChoice,      // the output is exactly one of `choices`
    // `text` is an XGrammar structural tag (JSON: {"type": "structural_tag", "format": ...}),
    // vLLM's structured_outputs.structural_tag
    kStructuralTag,
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;

  friend bool operator==(const Constraint&, const Constraint&) = default;
};

// Bounds Validate enforces: a constraint is compiled on the serving path, and its size bounds the
// compile's memory (the compile time is bounded separately, grammar_cache.h).
inline constexpr size_t kMaxConstraintTextBytes = 64 * 1024;
inline constexpr size_t kMaxConstraintChoices = 1024;
inline constexpr size_t kMaxChoiceBytes = 4 * 1024;
// How deeply a schema's JSON, a regex's groups or a grammar's groups may nest: the compiler
// recurses once per level (base/nesting.h). A schema object nested in another takes three JSON
// levels ({"properties": {"a": {...}}}), so this admits schemas some 85 objects deep, more than
// any output a model is asked to follow, and far below what overflows a thread's stack.
inline constexpr size_t kMaxConstraintNesting = 256;
// JSON schemas only. XGrammar's schema converter spells out what these count (a regex or grammar
// constraint keeps a repetition as one rule), so its compile time grows with them, faster than
// linearly (on tost-austen's 2048 tokens: 800 optional properties in one object compile in 1.8 s,
// 1600 in 19.5 s; a pattern [a-z]{1000} in 0.1 s, {3000} in 0.9 s, {10000} in 8.4 s). Within
// these a schema can still compile slowly (many patterns, many optional properties): the compile
// worker's kill bounds those (grammar_cache.h).
// Optional properties (in an object's "properties" but not its "required"), every object of the
// schema together: XGrammar spells out which may follow which (required ones cost little: 1200
// in 400 objects compile in 1 s).
inline constexpr size_t kMaxSchemaOptionalProperties = 1024;
// "enum" members and "const" values, every one of the schema together (11,500 short ones fit in
// the text bound and compile in 0.1 s: this one says what it counts instead).
inline constexpr size_t kMaxSchemaEnumValues = 8192;
// What one "pattern" (or "patternProperties" key) spells out: its characters and classes, each
// repetition {n}, {n,} or {n,m} counting what it repeats m times (n when unbounded).
inline constexpr size_t kMaxSchemaPatternExpansion = 1024;

// "json_schema", "json_object", "regex", "grammar", "choice", "structural_tag": the names errors
// and stats use.
const char* KindName(Constraint::Kind kind);

// INVALID_ARGUMENT, naming the field, what was expected and what was received, when `constraint`
// cannot be compiled for its shape alone: text over kMaxConstraintTextBytes or empty where the
// kind needs it, a schema, regex or grammar nested deeper than kMaxConstraintNesting, a schema
// past kMaxSchemaOptionalProperties, kMaxSchemaEnumValues or kMaxSchemaPatternExpansion, choices
// outside 1..kMaxConstraintChoices, an empty choice, a choice over kMaxChoiceBytes or not valid
// UTF-8 (the grammar matches text, and choices come from JSON requests). Whether the schema, regex
// or grammar itself is valid is the compiler's to say (a schema that is not JSON is left to it).
absl::Status Validate(const Constraint& constraint);

// The cache key of a constraint: the kind and the full content, each part length-prefixed, so two
// constraints share a key exactly when they compile to the same grammar (no hash, no collision).
// The fields a kind does not use are left out: a kJsonObject's stray text does not split the cache.
std::string ContentKey(const Constraint& constraint);

}  // namespace tost::structured
