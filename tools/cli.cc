#include "tools/cli.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/config/config.h"
#include "src/shm/zone_layout.h"
#include "tools/manual.h"

extern char** environ;

namespace trafficrate {

std::string VersionText() {
  const std::string sanitizers = TRAFFICRATE_SANITIZERS;
  return absl::StrCat(
      "trafficrate ", TRAFFICRATE_VERSION, "\n", "zone layout ",
      kZoneLayoutVersion,
      " (a zone of another layout is refused, never read)\n",
      "features: shares equal and budget; rules files (TRAFFICRATE_CONFIG) "
      "with reload; IPv4 and IPv6; passed (SCM_RIGHTS) and inherited "
      "sockets; fleet sharing through Redis (TRAFFICRATE_CLUSTER); stat as a "
      "table, JSON and Prometheus\n",
      "build: ", TRAFFICRATE_BUILD_TYPE, ", ",
#if defined(__clang__)
      "clang ", __clang_version__,
#elif defined(__GNUC__)
      "gcc ", __VERSION__,
#else
      "compiler unknown",
#endif
      ", sanitizers ", sanitizers.empty() ? "none" : sanitizers, "\n");
}

std::string ParsedArgs::Get(const std::string& name,
                            const std::string& fallback) const {
  const auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     absl::Span<const OptionSpec> specs,
                                     bool allow_command) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (allow_command && arg == "--") {
      parsed.command.assign(args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      parsed.positional.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& s : specs) {
      if (name == s.name) spec = &s;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option \"", name, "\""));
    }
    if (!spec->takes_value) {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " takes no value"));
      }
      parsed.options[name] = "";
    } else if (eq != std::string::npos) {
      parsed.options[name] = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      const std::string& next = args[i + 1];
      const std::string next_name = next.substr(0, next.find('='));
      bool next_is_option = next_name == "--help" || next_name == "-h";
      for (const OptionSpec& s : specs) {
        if (next_name == s.name) next_is_option = true;
      }
      if (next_is_option) {
        // `--zone --json`: the value was left out, not "--json".
        return absl::InvalidArgumentError(
            absl::StrCat(name, " needs a value before ", next_name, " (write ",
                         name, "=VALUE for a value that starts with -)"));
      }
      parsed.options[name] = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    }
  }
  return parsed;
}

std::map<std::string, std::string> ConfigEnvironment(
    const ParsedArgs& args, const std::map<std::string, std::string>& base) {
  std::map<std::string, std::string> env = base;
  for (const Variable& v : Variables()) {
    if (v.option == nullptr || !args.Has(v.option)) continue;
    env[v.name] = *v.arg == '\0' ? v.switch_value : args.Get(v.option, "");
  }
  // --config FILE may be relative to here; the server may chdir, so the
  // library gets it absolute (TRAFFICRATE_CONFIG must be).
  if (const std::string file = args.Get("--config", "");
      !file.empty() && file[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) {
      env[kEnvConfig] = absl::StrCat(cwd, "/", file);
    }
  }
  return env;
}

std::string ForOptions(const ParsedArgs& args, std::string message) {
  for (const Variable& v : Variables()) {
    const std::string prefix = absl::StrCat(v.name, ": ");
    if (v.option != nullptr && args.Has(v.option) &&
        absl::StartsWith(message, prefix)) {
      return absl::StrCat(v.option, ": ", message.substr(prefix.size()));
    }
  }
  return message;
}

std::map<std::string, std::string> TrafficrateEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos ||
        !absl::StartsWith(entry, "TRAFFICRATE_")) {
      continue;
    }
    env[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
  }
  return env;
}

int UsageError(const std::string& command, const std::string& text) {
  std::fprintf(stderr, "trafficrate: %s%s%s (see `trafficrate %s--help`)\n",
               command.c_str(), command.empty() ? "" : ": ", text.c_str(),
               command.empty() ? "" : (command + " ").c_str());
  return kExitUsage;
}

int Failure(const std::string& text) {
  std::fprintf(stderr, "trafficrate: %s\n", text.c_str());
  return kExitFailed;
}

bool Parse(const char* command, const std::vector<std::string>& args,
           bool allow_command, ParsedArgs* out, int* exit_code) {
  const CommandDoc* doc = FindCommandDoc(command);
  std::vector<OptionSpec> specs;
  for (const OptionDoc& o : doc->options) {
    specs.push_back({o.flag, *o.arg != '\0'});
  }
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, specs, allow_command);
  if (!parsed.ok()) {
    *exit_code = UsageError(command, std::string(parsed.status().message()));
    return false;
  }
  if (parsed->help) {
    std::fputs(CommandHelp(*doc).c_str(), stdout);
    *exit_code = kExitOk;
    return false;
  }
  *out = std::move(*parsed);
  return true;
}

bool ZoneName(const char* command, const ParsedArgs& args, std::string* zone,
              int* exit_code) {
  const char* env = getenv(kEnvZone);
  const std::string value =
      args.Get("--zone", env != nullptr && *env != '\0' ? env : "default");
  if (absl::StartsWith(value, "/")) {
    *zone = value;  // a zone file's path (ZoneSegment::Locate)
    return true;
  }
  absl::StatusOr<std::string> parsed = ParseZoneName(value);
  if (!parsed.ok()) {
    *exit_code = UsageError(
        command, absl::StrCat("--zone: ", parsed.status().message()));
    return false;
  }
  *zone = *parsed;
  return true;
}

bool NoPositionals(const char* command, const ParsedArgs& args,
                   int* exit_code) {
  if (args.positional.empty()) return true;
  *exit_code = UsageError(command, absl::StrCat("unexpected argument \"",
                                                args.positional[0], "\""));
  return false;
}

int HelpCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(OverviewHelp().c_str(), stdout);
    return kExitOk;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::fputs(CommandHelp(*FindCommandDoc("help")).c_str(), stdout);
    return kExitOk;
  }
  if (args.size() > 1) {
    return UsageError("help",
                      absl::StrCat("unexpected argument \"", args[1], "\""));
  }
  if (const CommandDoc* doc = FindCommandDoc(args[0]); doc != nullptr) {
    std::fputs(CommandHelp(*doc).c_str(), stdout);
    return kExitOk;
  }
  if (const TopicDoc* topic = FindTopicDoc(args[0]); topic != nullptr) {
    std::fputs(TopicHelp(*topic).c_str(), stdout);
    return kExitOk;
  }
  std::string topics;
  for (const TopicDoc& t : TopicDocs()) {
    absl::StrAppend(&topics, topics.empty() ? "" : ", ", t.topic);
  }
  return UsageError("help", absl::StrCat("no command or topic \"", args[0],
                                         "\"; the topics are ", topics));
}

int CliMain(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(OverviewHelp().c_str(), stderr);
    return kExitUsage;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "--version" || command == "version") {
    std::fputs(VersionText().c_str(), stdout);
    return kExitOk;
  }
  if (command == "--help" || command == "-h") {
    std::fputs(OverviewHelp().c_str(), stdout);
    return kExitOk;
  }
  struct Command {
    const char* name;
    int (*run)(const std::vector<std::string>&);
  };
  static constexpr Command kCommands[] = {
      {"run", RunCommand}, {"check", CheckCommand},   {"stat", StatCommand},
      {"top", TopCommand}, {"set", SetCommand},       {"gc", GcCommand},
      {"rm", RmCommand},   {"reload", ReloadCommand}, {"help", HelpCommand},
  };
  for (const Command& c : kCommands) {
    if (command == c.name) return c.run(args);
  }
  return UsageError("", absl::StrCat("unknown command \"", command, "\""));
}

}  // namespace trafficrate
