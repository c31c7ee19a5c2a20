// The rules file (TRAFFICRATE_CONFIG, `trafficrate check --config`): named
// rules, each with its own listening ports, clients, key, rate and burst
// allowance. A connection is governed by the first rule that matches it at
// accept; a rule's keys are its own (the same client under two rules has two
// budgets).
//
//   # Downloads: 500 KB/s per client on port 80 and 8000-8099.
//   [downloads]
//   listen  = 80, 8000-8099
//   rate    = 500k
//
//   # The internal network is never paced (first: it wins).
//   [internal]
//   clients = 10.0.0.0/8, fd00::/8
//   rate    = unlimited
//
//   absl::StatusOr<RulesFile> file = ReadRulesFile("/etc/trafficrate.rules");
//   if (!file.ok()) { /* one line: "PATH:LINE:COLUMN: what; expected" */ }
//
// The syntax (INI-like, as in systemd units):
//   * A line is blank, a comment ('#' or ';' first), a section header
//     "[NAME]" (the rule's name: 1 to 31 of [A-Za-z0-9_.-]), or "FIELD = VALUE"
//     inside a section. A '#' after blanks starts a trailing comment. Blanks
//     around names and values are ignored. At most kMaxRules sections, each
//     name once; at most 1 MiB, lines of at most 4096 bytes, no NUL bytes.
//   * Fields (each at most once per rule; any other name is an error):
//       listen   local endpoints: "80", "8000-8099", "127.0.0.1:80",
//                "[::1]:8080", "127.0.0.1:8000-8099", "*:80", "127.0.0.1"
//                or "[::1]" (every port), comma-separated, at most
//                kMaxListenEntries; "*", "0.0.0.0" and "[::]" mean every
//                local address. Default: every local address and port.
//       clients  client addresses and networks, IPv4 and IPv6, at most
//                kMaxClientEntries ("10.0.0.0/8, 2001:db8::/32, ::1").
//                Default: every client. IPv4 networks also match IPv4
//                clients of dual-stack sockets (::ffff:a.b.c.d).
//       exempt   clients this rule matches and leaves unpaced, same form.
//       key      peer | peer/N | peer/N,M | local | all (as TRAFFICRATE_KEY).
//       rate     bytes/s per key with nginx's units (k, m), or "unlimited":
//                the rule matches and leaves its connections unpaced.
//                Required.
//       after    bytes each connection sends unpaced first (k, m, g), as
//                TRAFFICRATE_AFTER. Default 0.
//       burst    budget mode: unused allowance a key may bank (k, m, g), as
//                TRAFFICRATE_BURST. Default: 50 ms of the rate, >= 16 KiB.
// Errors are InvalidArgument, one line: "PATH:LINE:COLUMN: problem; what
// was expected", the column (from 1) where the problem starts.

#ifndef TRAFFICRATE_SRC_CONFIG_RULES_FILE_H_
#define TRAFFICRATE_SRC_CONFIG_RULES_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/config/rules.h"
#include "src/net/key.h"

namespace trafficrate {

inline constexpr int kMaxRules = 16;
inline constexpr int kMaxRuleNameBytes = 31;
inline constexpr int kMaxListenEntries = 32;
inline constexpr int kMaxClientEntries = 64;
inline constexpr uint64_t kMaxRulesFileBytes = uint64_t{1} << 20;

// One local endpoint pattern of `listen`.
struct ListenEntry {
  bool any_address = true;
  Cidr address;     // the one local address (full prefix) unless any_address
  PortRange ports;  // {1, 65535} for every port
};

bool operator==(const ListenEntry& a, const ListenEntry& b);

struct Rule {
  std::string name;
  int line = 0;                     // of its section header
  std::vector<ListenEntry> listen;  // empty: every local endpoint
  std::vector<Cidr> clients;        // empty: every client
  std::vector<Cidr> exempt;
  KeySpec key;
  bool unlimited = false;           // rate = unlimited: matches, never paces
  uint64_t rate_bytes_per_sec = 0;  // when !unlimited
  uint64_t after_bytes = 0;
  uint64_t burst_bytes = 0;  // 0: the default for the rate
};

struct RulesFile {
  std::string path;         // as given, for messages
  std::vector<Rule> rules;  // in the file's order, 1..kMaxRules of them
};

// Parses the text of a rules file; `path` only names it in errors. An empty
// file, or one with no section, is an error (a rules file that governs
// nothing is a mistake, not a way to turn the library off). Thread-safe.
ABSL_MUST_USE_RESULT absl::StatusOr<RulesFile> ParseRulesText(
    absl::string_view path, absl::string_view text);

// Reads and parses the file at `path` (at most kMaxRulesFileBytes; a
// directory, a missing file or a read error is a one-line error naming the
// path). Thread-safe; not for the hot path.
ABSL_MUST_USE_RESULT absl::StatusOr<RulesFile> ReadRulesFile(
    const std::string& path);

// Whether a connection to local endpoint (`local16`, IPv6 or v4-mapped, and
// `local_port`) from client `peer16` falls under `rule`'s listen and clients
// (exempt clients match too: the rule governs them by leaving them
// unpaced). The index of the first matching rule, or -1.
bool RuleMatches(const Rule& rule, const uint8_t local16[16],
                 uint16_t local_port, const uint8_t peer16[16]);
int FirstMatchingRule(const std::vector<Rule>& rules, const uint8_t local16[16],
                      uint16_t local_port, const uint8_t peer16[16]);

// For each rule that can never match because one earlier rule matches
// everything it does, one line naming both, e.g. `rule "api" (line 9) can
// never match: rule "all" (line 2) matches every connection it would`. Only
// certain cases are reported (an earlier rule covering each of its listen
// entries and client networks); empty when there are none.
std::vector<std::string> ShadowedRules(const RulesFile& file);

// The rules as the library applies them, in order, one block per rule with
// every field (defaults spelled out), for `trafficrate check`.
std::string FormatRules(const RulesFile& file);

// No zone rule (zone_layout.h, RuleSlotShm): an unlimited rule never
// reaches the zone.
inline constexpr uint32_t kNoRuleSlot = ~0u;

// "80", "8000-8099", "127.0.0.1:80", "[::1]:8000-8099", "127.0.0.1" (every
// port): parses back to the same entry.
std::string FormatListenEntry(const ListenEntry& entry);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CONFIG_RULES_FILE_H_
