// trafficrate's whole configuration, read from TRAFFICRATE_* environment
// variables in one place at start-up (nginx wipes its workers' environment, so
// there is no second chance to read it).
//
//   absl::StatusOr<Config> config = ParseConfig(
//       [](const char* name) -> const char* { return getenv(name); });
//   if (!config.ok()) {
//     // One line naming the bad variable: print it, then pass through.
//   } else if (config->enabled) { ... }
//
// The variables, their forms and defaults are the table in config.cc
// (Variables()); `trafficrate help environment` shows it.
// A variable that is set but empty is an error, not "use the default": an
// empty value is usually a shell variable that was meant to hold something.

#ifndef TRAFFICRATE_SRC_CONFIG_CONFIG_H_
#define TRAFFICRATE_SRC_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "src/base/log.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/config/cluster_url.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/config/values.h"
#include "src/net/key.h"

namespace trafficrate {

struct Config {
  // What an unset variable means is its default_value in the table
  // (Variables()), read through its parser like a set one; these members
  // start empty.
  bool enabled = false;  // false when TRAFFICRATE_RATE is unset
  uint64_t rate_bytes_per_sec = 0;
  KeySpec key;
  std::string zone_name;
  uint64_t zone_size_bytes = 0;
  std::vector<PortRange> ports;  // sorted, merged; empty: every port
  std::vector<Cidr> exempt;      // empty: nobody is exempt
  uint64_t after_bytes = 0;
  LogTarget log = LogTarget::kStderr;
  std::string log_path;  // set when log == LogTarget::kFile
  bool strict = false;
  int64_t idle_ns = 0;
  ShareMode share = ShareMode::kBudget;
  uint64_t burst_bytes = 0;  // 0: DefaultBurstBytes(rate)
  // TRAFFICRATE_INHERITED: at start-up, govern the client connections the
  // process inherited (inetd, systemd Accept=yes): Governor::AdoptInherited.
  bool inherited = false;
  // TRAFFICRATE_SHAPE: the packet shaper (shaper.h) on.
  bool shape = false;
  // TRAFFICRATE_CONFIG: the rules file's rules, in order (empty without
  // one). With a file, rate_bytes_per_sec, key and burst_bytes are those
  // of its first rule that has a rate (the zone's rule 0), ports and
  // exempt are empty, and enabled is false when no rule has a rate (every
  // rule unlimited: nothing to govern).
  std::string rules_path;
  std::vector<Rule> rules;
  // TRAFFICRATE_CLUSTER and its companions (cluster_agent.h); cluster
  // false without it.
  bool cluster = false;
  ClusterUrl cluster_url;
  std::string cluster_secret;
  std::string cluster_name;  // the zone name unless set
  int64_t cluster_decay_ns = 0;
  std::string cluster_host;  // empty: the machine's hostname
};

struct ConfigReading;

// One TRAFFICRATE_* variable: its name, the option of `trafficrate run` and
// `check` that sets it, its default, its help, and how its value is read.
// The table of them (Variables()) is the one place a variable is described:
// ParseConfig reads the environment by walking it, the CLI maps options to
// variables with it, and --help, `trafficrate help environment` and the man
// pages are rendered from it (tools/manual.cc).
struct Variable {
  const char* name;          // "TRAFFICRATE_RATE"
  const char* option;        // "--rate", or nullptr: no option sets it
  const char* arg;           // "R"; "" for a switch (it sets switch_value)
  const char* switch_value;  // a switch's value ("1" for --strict)
  const char* help;          // the option's line in --help
  const char* manual;        // the variable's paragraph in trafficrate(7)
  // What an unset variable reads as, a value its parser takes ("200ms");
  // "" when unset means something no value says (see unset_means).
  const char* default_value;
  // What an unset variable means, as the documentation says it, when that
  // is not default_value as written ("every port", "the zone name"); "" if
  // it is (or there is nothing to say).
  const char* unset_means;
  // Set together with TRAFFICRATE_CONFIG, an error: each rule has its own.
  bool replaced_by_rules_file;
  // Reads a value into the configuration being made; InvalidArgument, one
  // line naming the variable and the accepted form.
  absl::Status (*read)(absl::string_view value, ConfigReading& reading);

  // The default as the documentation shows it ("" : nothing to say).
  const char* default_text() const {
    return *unset_means != '\0' ? unset_means : default_value;
  }
};

// Every variable, in the order ParseConfig reads them.
absl::Span<const Variable> Variables();
// The variable of that exact name, or nullptr.
const Variable* FindVariable(absl::string_view name);

// Looks a variable up; returns nullptr when it is unset. The returned string
// need only live until the next call. Production passes getenv; tests, a map.
using EnvLookup = absl::FunctionRef<const char*(const char*)>;

// Reads each variable of Variables() exactly once, in that order, and returns
// the first error: InvalidArgument, one line, naming the variable and the
// accepted form. With TRAFFICRATE_RATE unset the result has enabled == false
// and the other variables are still validated and filled in, so `trafficrate
// check` and a later `set` see the same zone and key settings.
// Thread-safe if `env` is (getenv races with setenv).
ABSL_MUST_USE_RESULT absl::StatusOr<Config> ParseConfig(EnvLookup env);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CONFIG_CONFIG_H_
