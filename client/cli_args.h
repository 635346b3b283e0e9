// tost_cli's command line: which command, which of its flags, and the help that lists them.
// The flags themselves are ABSL_FLAGs (client/cli_main.cc); this parser sets them by name so that
// each command accepts only its own flags and every mistake is one line with the exit status 2.
#ifndef TOST_CLIENT_CLI_ARGS_H_
#define TOST_CLIENT_CLI_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tost::cli {

// tost_cli's exit statuses, listed by every --help: scripts tell the classes of failure apart.
enum ExitCode : int {
  kExitOk = 0,
  kExitOther = 1,        // any failure not below: bad input, a refused request, a deadline
  kExitUsage = 2,        // the command line: unknown command or flag, bad or missing value
  kExitUnreachable = 3,  // no tost_server answers at --server (refused, unresolved, silent)
  kExitNotFound = 4,     // the server does not serve --model (or holds no such session)
  kExitUnavailable = 5,  // the server answers UNAVAILABLE: still loading its models, or draining
};

// One line per status, for --help.
std::string ExitCodesHelp();

// A flag a command takes: `name` is its ABSL_FLAG's name, `value` the placeholder shown in
// --name=VALUE; `meaning` (one line) overrides the ABSL_FLAG's help where the command uses the
// flag its own way.
struct FlagUse {
  const char* name;
  const char* value;
  const char* meaning = nullptr;
};

struct CommandSpec {
  const char* name;
  const char* usage;    // after "tost_cli NAME"
  const char* summary;  // one line
  std::vector<FlagUse> flags;
  const char* details = "";  // paragraphs after the flags, may be empty
};

struct ParsedArgs {
  const CommandSpec* command = nullptr;  // null only with help: the overview
  bool help = false;
};

// Parses argv: one command, then (before or after it) --name=VALUE, --name VALUE, --bool,
// --nobool; --help, -h and `help [COMMAND]` ask for help. Sets the ABSL_FLAGs given. A usage
// error is InvalidArgument whose message is the one line to print after "tost_cli: ".
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<CommandSpec>& commands, int argc,
                                     char** argv);

// `tost_cli --help`: the commands, then every command's flags with defaults, then exit statuses.
std::string OverviewHelp(const std::vector<CommandSpec>& commands);
// `tost_cli COMMAND --help`: its usage, each flag with default and meaning, then exit statuses.
std::string CommandHelp(const CommandSpec& command);

}  // namespace tost::cli

#endif  // TOST_CLIENT_CLI_ARGS_H_
