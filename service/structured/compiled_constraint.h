// A constraint compiled against one model vocabulary: XGrammar's compiled grammar (the grammar
// and its precomputed token masks), shared read-only by every sequence that generates under it.
#pragma once

#include <memory>

#include <xgrammar/xgrammar.h>

#include "absl/status/statusor.h"
#include "service/structured/constraint.h"
#include "service/structured/grammar_vocabulary.h"

namespace tost::structured {

struct CompiledConstraint {
  Constraint::Kind kind;
  xgrammar::CompiledGrammar grammar;
  // Kept alive with the grammar: matchers read its sizes and end-of-text id.
  std::shared_ptr<const GrammarVocabulary> vocabulary;
  // What the compiled grammar holds (the grammar and its token-mask cache), as XGrammar counts it.
  int64_t bytes = 0;
};

// Compiles `constraint` (validated first) on the calling thread, however long it takes; the
// GrammarCache bounds the wait. INVALID_ARGUMENT with the compiler's message when the schema,
// regex or grammar is not one it accepts, and when its compiled form holds more than `max_bytes`
// (0: no bound): what it would keep in memory for as long as it is cached, so a constraint
// under the text-size bound that still compiles to something huge is refused, not kept.
//
// How each kind compiles, and why:
//  - kJsonSchema: XGrammar's JSON-schema converter in strict mode (an object without
//    "additionalProperties" admits only its listed properties, as OpenAI's strict schemas do) and
//    without free whitespace (any_whitespace off: the separators are ", " and ": ", so a model
//    cannot spend its tokens on runs of spaces and newlines, and outputs stay compact).
//  - kJsonObject: the schema {"type":"object","additionalProperties":true}, compiled the same way.
//  - kRegex: XGrammar's regex converter; the whole output matches.
//  - kGrammar: XGrammar EBNF, start rule `root`.
//  - kChoice: the EBNF alternation root ::= "c1" | "c2" | ..., each choice a string literal whose
//    quote, backslash and control characters are escaped (\uXXXX: XGrammar's \x takes any
//    number of hex digits, so it could swallow the characters after it).
absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileConstraint(
    const std::shared_ptr<GrammarVocabulary>& vocabulary, const Constraint& constraint,
    int64_t max_bytes = 0);

// The EBNF grammar a kChoice constraint compiles to (exposed for tests).
std::string ChoiceGrammar(const Constraint& constraint);

}  // namespace tost::structured
