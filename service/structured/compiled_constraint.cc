#include "service/structured/compiled_constraint.h"

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/error_detail.h"

namespace tost::structured {
namespace {

constexpr char kAnyObjectSchema[] = R"({"type":"object","additionalProperties":true})";

xgrammar::CompiledGrammar CompileSchema(xgrammar::GrammarCompiler& compiler,
                                        const std::string& schema) {
  return compiler.CompileJSONSchema(schema, /*any_whitespace=*/false, /*indent=*/std::nullopt,
                                    /*separators=*/std::nullopt, /*strict_mode=*/true);
}

xgrammar::CompiledGrammar Compile(xgrammar::GrammarCompiler& compiler,
                                  const Constraint& constraint) {
  switch (constraint.kind) {
    case Constraint::Kind::kJsonSchema:
      return CompileSchema(compiler, constraint.text);
    case Constraint::Kind::kJsonObject:
      return CompileSchema(compiler, kAnyObjectSchema);
    case Constraint::Kind::kRegex:
      return compiler.CompileRegex(constraint.text);
    case Constraint::Kind::kGrammar:
      return compiler.CompileGrammar(constraint.text, "root");
    case Constraint::Kind::kChoice:
      return compiler.CompileGrammar(ChoiceGrammar(constraint), "root");
    case Constraint::Kind::kStructuralTag:
      return compiler.CompileStructuralTag(constraint.text);
  }
  return compiler.CompileGrammar(ChoiceGrammar(constraint), "root");
}

}  // namespace

std::string ChoiceGrammar(const Constraint& constraint) {
  std::string ebnf = "root ::=";
  for (size_t i = 0; i < constraint.choices.size(); ++i) {
    ebnf += i == 0 ? " \"" : " | \"";
    for (const char c : constraint.choices[i]) {
      const auto byte = static_cast<uint8_t>(c);
      if (c == '"' || c == '\\') {
        ebnf += '\\';
        ebnf += c;
      } else if (byte < 0x20 || byte == 0x7F) {
        ebnf += absl::StrFormat("\\u%04X", byte);
      } else {
        ebnf += c;  // printable ASCII, or UTF-8 (Validate checked it), which the parser decodes
      }
    }
    ebnf += '"';
  }
  return ebnf;
}

namespace {

// The most bytes of the compiler's reason a client reads.
constexpr size_t kMaxReasonBytes = 128;

// The reason in XGrammar's error that a client can act on, or "" when there is none. Its errors
// start with its logger's prefix, "[HH:MM:SS] /path/to/file.cc:LINE: ": the time and a path of
// this server's file system mean nothing to a client (and the path says where the server's
// dependencies live). A failed check adds "Check failed: (expr) is false: ", which is its code,
// and a schema that is no JSON ". The JSON string is:" and the whole schema, which can be megabytes
// of the client's own text. So: the first line after those, at most kMaxReasonBytes, control
// bytes escaped. The whole text is the status's server detail, for the log.
std::string CompilerReason(std::string_view what) {
  what = what.substr(0, what.find('\n'));
  if (!what.empty() && what.front() == '[') {
    if (const size_t close = what.find("] "); close != std::string_view::npos) {
      what.remove_prefix(close + 2);
    }
  }
  // "file.ext:LINE: " with no space inside the file part.
  const size_t colon = what.find(':');
  if (colon != std::string_view::npos &&
      what.substr(0, colon).find(' ') == std::string_view::npos) {
    size_t digits = colon + 1;
    while (digits < what.size() && what[digits] >= '0' && what[digits] <= '9') ++digits;
    if (digits > colon + 1 && what.substr(digits, 2) == ": ") what.remove_prefix(digits + 2);
  }
  constexpr std::string_view kCheck = "Check failed: ";
  constexpr std::string_view kIsFalse = " is false: ";
  if (what.substr(0, kCheck.size()) == kCheck) {
    const size_t end = what.find(kIsFalse);
    what.remove_prefix(end == std::string_view::npos ? what.size() : end + kIsFalse.size());
  }
  what = what.substr(0, what.find(". The JSON string is:"));
  while (!what.empty() && what.back() == ' ') what.remove_suffix(1);
  const bool cut = what.size() > kMaxReasonBytes;
  if (cut) {
    size_t n = kMaxReasonBytes;
    while (n > 0 && (static_cast<unsigned char>(what[n]) & 0xc0) == 0x80) --n;  // whole UTF-8
    what = what.substr(0, n);
  }
  std::string reason;
  for (const char c : what) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppend(&reason, absl::StrFormat("\\x%02x", byte));
    } else {
      reason += c;
    }
  }
  if (cut) reason += "...";
  return reason;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileConstraint(
    const std::shared_ptr<GrammarVocabulary>& vocabulary, const Constraint& constraint,
    int64_t max_bytes) {
  if (absl::Status valid = Validate(constraint); !valid.ok()) return valid;
  try {
    xgrammar::CompiledGrammar grammar = Compile(vocabulary->compiler(), constraint);
    const auto bytes = static_cast<int64_t>(grammar.MemorySizeBytes());
    if (max_bytes > 0 && bytes > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constraint ", KindName(constraint.kind), " for model ", vocabulary->model_name(),
          ": compiled, it takes ", bytes, " bytes, expected at most ", max_bytes,
          " (an eighth of --constraint_cache_bytes); simplify it (fewer alternatives, shorter "
          "bounded repetitions), as retrying gets the same answer"));
    }
    return std::make_shared<const CompiledConstraint>(
        CompiledConstraint{constraint.kind, std::move(grammar), vocabulary, bytes});
  } catch (const std::exception& e) {
    const std::string reason = CompilerReason(e.what());
    return WithServerDetail(
        absl::InvalidArgumentError(absl::StrCat(
            "constraint ", KindName(constraint.kind), " for model ", vocabulary->model_name(),
            ": the grammar compiler refused it", reason.empty() ? "" : ": ", reason)),
        absl::StrCat("XGrammar: ", *e.what() != '\0' ? e.what() : typeid(e).name()));
  }
}

}  // namespace tost::structured
