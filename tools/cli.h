// The trafficrate command line: subcommands, their options and help.
//
//   int main(int argc, char** argv) { return trafficrate::CliMain(argc, argv);
//   }
//
// Conventions: `trafficrate --help`, `trafficrate COMMAND --help`,
// `--version`; exit status 0 ok, 1 the operation failed, 2 usage error;
// errors are one line on stderr starting "trafficrate: ".

#ifndef TRAFFICRATE_TOOLS_CLI_H_
#define TRAFFICRATE_TOOLS_CLI_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trafficrate {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// One option of a subcommand: "--name VALUE" (or "--name=VALUE") when
// takes_value, else a switch "--name".
struct OptionSpec {
  const char* name;
  bool takes_value;
};

struct ParsedArgs {
  std::map<std::string, std::string>
      options;  // "--rate" -> "500k"; switches -> ""
  std::vector<std::string> positional;
  std::vector<std::string> command;  // after "--" (when allowed)
  bool help = false;                 // --help or -h was given

  bool Has(const std::string& name) const { return options.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback) const;
};

// Parses a subcommand's arguments. InvalidArgumentError (one line) for an
// unknown option or a missing value. With allow_command, everything after
// the first "--" goes to `command`.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     absl::Span<const OptionSpec> specs,
                                     bool allow_command);

// The TRAFFICRATE_* environment a `run` or `check` would give the server:
// `base` (the current environment's TRAFFICRATE_* variables) overridden by
// the options (--rate -> TRAFFICRATE_RATE, --strict -> TRAFFICRATE_STRICT=1,
// ...).
std::map<std::string, std::string> ConfigEnvironment(
    const ParsedArgs& args, const std::map<std::string, std::string>& base);

// A configuration error message ("TRAFFICRATE_RATE: ...") worded for the
// command line: the variable becomes the option that set it, if one did
// ("--rate: ...").
std::string ForOptions(const ParsedArgs& args, std::string message);

// The current process's TRAFFICRATE_* variables.
std::map<std::string, std::string> TrafficrateEnvironment();

int CliMain(int argc, char** argv);

// What `trafficrate --version` prints: the version, the zone layout version
// (zones of another layout are refused), the features and the build.
std::string VersionText();

// Subcommands (tools/run_check.cc, tools/zone_commands.cc, tools/top.cc).
// `args` excludes the subcommand's name.
int RunCommand(const std::vector<std::string>& args);
int CheckCommand(const std::vector<std::string>& args);
int StatCommand(const std::vector<std::string>& args);
int TopCommand(const std::vector<std::string>& args);
int SetCommand(const std::vector<std::string>& args);
int GcCommand(const std::vector<std::string>& args);
int RmCommand(const std::vector<std::string>& args);
int ReloadCommand(const std::vector<std::string>& args);
int HelpCommand(const std::vector<std::string>& args);

// Parses a subcommand's arguments, whose options are those its
// documentation gives (tools/manual.h: an option with an argument takes a
// value). Returns true to go on; false when it printed the command's help
// (asked for, *exit_code 0) or a usage error (*exit_code 2).
bool Parse(const char* command, const std::vector<std::string>& args,
           bool allow_command, ParsedArgs* out, int* exit_code);
// The zone to read: --zone, else $TRAFFICRATE_ZONE, else "default",
// validated; false with a usage error (*exit_code 2) if invalid.
bool ZoneName(const char* command, const ParsedArgs& args, std::string* zone,
              int* exit_code);
// False with a usage error (*exit_code 2) if there are positional arguments.
bool NoPositionals(const char* command, const ParsedArgs& args, int* exit_code);

// Prints "trafficrate: <command>: <text>" and the help hint; returns 2.
int UsageError(const std::string& command, const std::string& text);
// Prints "trafficrate: <text>"; returns 1.
int Failure(const std::string& text);

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_CLI_H_
