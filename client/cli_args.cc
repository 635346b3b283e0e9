#include "client/cli_args.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tost::cli {
namespace {

const CommandSpec* FindCommand(const std::vector<CommandSpec>& commands, const std::string& name) {
  for (const CommandSpec& c : commands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

const FlagUse* FindUse(const CommandSpec& command, const std::string& name) {
  for (const FlagUse& f : command.flags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The commands that take the flag `name`, in table order.
std::vector<std::string> CommandsTaking(const std::vector<CommandSpec>& commands,
                                        const std::string& name) {
  std::vector<std::string> out;
  for (const CommandSpec& c : commands) {
    if (FindUse(c, name) != nullptr) out.push_back(c.name);
  }
  return out;
}

std::string CommandNames(const std::vector<CommandSpec>& commands) {
  std::vector<std::string> names;
  for (const CommandSpec& c : commands) names.push_back(c.name);
  if (names.size() < 2) return absl::StrJoin(names, "");
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

// What a value of the flag must look like, for the message that refuses one.
std::string Expected(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int>() || flag.IsOfType<int64_t>()) return "an integer";
  if (flag.IsOfType<uint64_t>()) return "a non-negative integer";
  if (flag.IsOfType<double>()) return "a number";
  if (flag.IsOfType<std::vector<std::string>>()) return "comma-separated values";
  return "text";
}

std::string FlagLine(const FlagUse& use) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(use.name);
  std::string head = absl::StrCat("  --", use.name, "=", use.value);
  if (head.size() < 32) head.resize(32, ' ');
  if (flag == nullptr) return absl::StrCat(head, " ", use.meaning ? use.meaning : "", "\n");
  const std::string def = flag->DefaultValue();
  return absl::StrCat(head, " ", use.meaning != nullptr ? use.meaning : flag->Help(),
                      " (default: ", def.empty() ? "none" : def, ")\n");
}

std::string UsageLine(const CommandSpec& c) {
  return absl::StrCat("usage: tost_cli ", c.name, " ", c.usage, "\n");
}

}  // namespace

std::string ExitCodesHelp() {
  return absl::StrCat(
      "exit status:\n", "  ", kExitOk, "  success\n", "  ", kExitOther,
      "  any other failure (bad input, a request the server refuses, --timeout_s passed)\n", "  ",
      kExitUsage, "  usage: an unknown command or flag, a missing or malformed value\n", "  ",
      kExitUnreachable,
      "  no tost_server answers at --server (connection refused, name does not resolve)\n", "  ",
      kExitNotFound, "  the server does not serve --model (see tost_cli models)\n", "  ",
      kExitUnavailable,
      "  the server is unavailable: still loading its models, or draining; retry later\n");
}

std::string CommandHelp(const CommandSpec& c) {
  std::string out = absl::StrCat(UsageLine(c), c.summary, "\n\nflags:\n");
  for (const FlagUse& f : c.flags) out += FlagLine(f);
  if (*c.details != '\0') absl::StrAppend(&out, "\n", c.details, "\n");
  absl::StrAppend(&out, "\n", ExitCodesHelp());
  return out;
}

std::string OverviewHelp(const std::vector<CommandSpec>& commands) {
  std::string out =
      "tost_cli: calls a running tost_server (gRPC, service tost.v1.Tost).\n\n"
      "usage: tost_cli COMMAND [--name=VALUE ...]\n\ncommands:\n";
  for (const CommandSpec& c : commands) {
    std::string name = absl::StrCat("  ", c.name);
    name.resize(12, ' ');
    absl::StrAppend(&out, name, c.summary, "\n");
  }
  absl::StrAppend(&out, "\n`tost_cli COMMAND --help` shows one command; here are all of them.\n");
  for (const CommandSpec& c : commands) {
    absl::StrAppend(&out, "\n", UsageLine(c), "flags:\n");
    for (const FlagUse& f : c.flags) out += FlagLine(f);
  }
  absl::StrAppend(&out, "\n", ExitCodesHelp());
  return out;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<CommandSpec>& commands, int argc,
                                     char** argv) {
  struct Given {
    absl::CommandLineFlag* flag;
    std::string name;
    std::string value;
  };
  ParsedArgs out;
  std::vector<std::string> positional;
  std::vector<Given> given;
  std::optional<std::string> first_error;  // reported once the command (for its --help) is known
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    const std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    std::optional<std::string> value;
    if (eq != std::string::npos) value = body.substr(eq + 1);
    if (name == "help" || name == "h" || name == "helpfull" || name == "helpshort") {
      out.help = true;
      continue;
    }
    auto known = [&](const std::string& n) -> absl::CommandLineFlag* {
      return CommandsTaking(commands, n).empty() ? nullptr : absl::FindCommandLineFlag(n);
    };
    absl::CommandLineFlag* flag = known(name);
    if (flag == nullptr && !value.has_value() && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = known(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
        value = "false";
      }
    }
    if (flag == nullptr) {
      if (!first_error) first_error = absl::StrCat("unknown flag --", name);
      continue;
    }
    if (!value.has_value()) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        if (!first_error) {
          first_error = absl::StrCat("--", name, " needs a value (--", name, "=VALUE), got none");
        }
        continue;
      }
    }
    given.push_back({flag, name, *value});
  }

  const std::string overview_hint = "; see tost_cli --help";
  if (!positional.empty() && positional[0] == "help") {
    out.help = true;
    positional.erase(positional.begin());
  }
  if (positional.empty()) {
    if (out.help) return out;
    return absl::InvalidArgumentError(absl::StrCat(first_error.value_or("no command given"),
                                                   "; expected a command: ", CommandNames(commands),
                                                   overview_hint));
  }
  out.command = FindCommand(commands, positional[0]);
  if (out.command == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", positional[0],
                                                   "\"; expected ", CommandNames(commands),
                                                   overview_hint));
  }
  if (out.help) return out;  // the help asked for, whatever else the line holds
  const std::string hint = absl::StrCat("; see tost_cli ", out.command->name, " --help");
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", positional[1],
                                                   "\" after the command ", out.command->name,
                                                   "; flags take the form --name=VALUE", hint));
  }
  if (first_error) return absl::InvalidArgumentError(absl::StrCat(*first_error, hint));
  for (const Given& g : given) {
    if (FindUse(*out.command, g.name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", g.name, " is not a flag of ", out.command->name, " (it is one of ",
                       absl::StrJoin(CommandsTaking(commands, g.name), ", "), ")", hint));
    }
    std::string error;
    if (!g.flag->ParseFrom(g.value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", g.name, " expects ", Expected(*g.flag),
                                                     ", got \"", g.value, "\"", hint));
    }
  }
  return out;
}

}  // namespace tost::cli
