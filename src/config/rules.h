// Which accepted connections trafficrate governs at all: TRAFFICRATE_PORTS
// (the server's local ports whose connections are governed) and
// TRAFFICRATE_EXEMPT (client addresses and networks that never are). The
// parsers give lists, for Config and for the CLI to print; AcceptRules is the
// fixed-size form the Governor consults once per accepted connection.
//
//   absl::StatusOr<std::vector<PortRange>> ports = ParsePorts("80,8000-8099");
//   absl::StatusOr<std::vector<Cidr>> exempt = ParseExempt("10.0.0.0/8,::1");
//   absl::StatusOr<AcceptRules> rules = AcceptRules::Make(*ports, *exempt);
//   if (rules->GovernsPort(8080) && !rules->Exempts(peer16)) { /* govern */ }
//
// Addresses are 16 bytes in network order, an IPv4 address in its
// IPv4-mapped form (::ffff:a.b.c.d), as in ConnKey (key.h): so an IPv4 rule
// also matches a dual-stack socket's mapped peer (see CidrContains).

#ifndef TRAFFICRATE_SRC_CONFIG_RULES_H_
#define TRAFFICRATE_SRC_CONFIG_RULES_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trafficrate {

// TRAFFICRATE_EXEMPT holds at most this many entries: the Governor checks
// them all, linearly, on every accept.
inline constexpr int kMaxExemptEntries = 64;

// An inclusive range of local ports; a single port has first == last.
struct PortRange {
  uint16_t first = 0;  // 1..65535
  uint16_t last = 0;   // first..65535
};

inline bool operator==(const PortRange& a, const PortRange& b) {
  return a.first == b.first && a.last == b.last;
}

// A client network.
struct Cidr {
  int family = AF_INET;  // AF_INET or AF_INET6: how the user wrote it
  // Network order, bits after the prefix cleared. AF_INET: IPv4-mapped, the
  // IPv4 address in bytes 12..15.
  uint8_t addr[16] = {};
  int prefix = 0;  // in the family's bits: 0..32 for AF_INET, 0..128 else
};

bool operator==(const Cidr& a, const Cidr& b);

// Parses TRAFFICRATE_PORTS: a comma-separated list of items, each a port
// 1..65535 ("443") or an inclusive range N-M with N <= M ("8000-8099").
// Spaces and tabs around an item are ignored; an empty item ("80,,443",
// "80,") is an error; duplicates and overlaps are allowed. Returns the ranges
// sorted and merged (overlapping or adjacent ranges become one), never empty.
// Errors are InvalidArgument, one line, naming TRAFFICRATE_PORTS and the
// accepted form. Thread-safe.
ABSL_MUST_USE_RESULT absl::StatusOr<std::vector<PortRange>> ParsePorts(
    absl::string_view value);

// Parses TRAFFICRATE_EXEMPT: a comma-separated list of at most
// kMaxExemptEntries items, each an IPv4 or IPv6 address ("127.0.0.3", "::1")
// or network ("10.0.0.0/8", "2001:db8::/32"); prefix lengths 0..32 (IPv4)
// and 0..128 (IPv6), no prefix meaning the one address. Bits after the prefix
// are cleared ("10.1.2.3/8" is 10.0.0.0/8). Spaces and tabs around an item
// are ignored; an empty item is an error; a duplicate (after clearing) is kept
// once. IPv6 scope ids ("fe80::1%eth0") are refused. Returns the networks in
// the order given, never empty. Errors as for ParsePorts, naming
// TRAFFICRATE_EXEMPT. Thread-safe.
ABSL_MUST_USE_RESULT absl::StatusOr<std::vector<Cidr>> ParseExempt(
    absl::string_view value);

// One item of those lists on its own, for the rules file (rules_file.h):
// "8000-8099" or "80"; "10.0.0.0/8" or "::1". On error, returns the problem
// in words that quote the item ("\"x\" is not a port or port range") and
// leaves *out unspecified; returns "" on success. Thread-safe; allocates.
// REQUIRES: out != nullptr.
std::string ParsePortItem(absl::string_view item, PortRange* out);
std::string ParseCidrItem(absl::string_view item, Cidr* out);

// "10.0.0.0/8", "127.0.0.3", "2001:db8::/32", "::1": the prefix is shown only
// when shorter than the full length, and the text parses back to `cidr`.
// Thread-safe; allocates.
std::string FormatCidr(const Cidr& cidr);

// "80,443,8000-8099"; "all" for an empty list (TRAFFICRATE_PORTS unset).
// Thread-safe; allocates.
std::string FormatPorts(const std::vector<PortRange>& ports);

// Whether `addr16` (IPv6, or IPv4 as IPv4-mapped) lies in `cidr`. An IPv4
// network matches IPv4 clients, whether their socket shows them as AF_INET or
// as IPv4-mapped IPv6; an IPv6 network matches IPv6 clients only ("::/0" is
// every IPv6 client), unless it lies inside ::ffff:0:0/96. Prefix lengths out
// of range are clamped. Async-signal-safe; no allocation.
bool CidrContains(const Cidr& cidr, const uint8_t addr16[16]);

// The rules in the form the Governor reads at accept: a bitmap of the
// governed ports and a fixed array of exempt networks. Trivially copyable,
// about 9 KiB; built once at init. The default governs every connection.
class AcceptRules {
 public:
  AcceptRules() = default;

  // `ports` empty: every port is governed. Returns InvalidArgument naming
  // TRAFFICRATE_EXEMPT if `exempt` has more than kMaxExemptEntries entries
  // (ParseExempt never returns that many). Thread-safe.
  ABSL_MUST_USE_RESULT static absl::StatusOr<AcceptRules> Make(
      const std::vector<PortRange>& ports, const std::vector<Cidr>& exempt);

  // Whether only some ports are governed: then the accepted socket's local
  // port must be looked up (getsockname).
  bool restricts_ports() const { return !all_ports_; }
  // Hot path: no allocation, errno untouched, async-signal-safe.
  bool GovernsPort(uint16_t port) const {
    return all_ports_ || (port_bits_[port >> 6] >> (port & 63)) & 1;
  }
  // Whether the client `addr16` (IPv6, or IPv4 as IPv4-mapped) is exempt.
  // Hot path: no allocation, errno untouched, async-signal-safe.
  bool Exempts(const uint8_t addr16[16]) const;
  int exempt_count() const { return exempt_count_; }

 private:
  bool all_ports_ = true;
  uint64_t port_bits_[65536 / 64] = {};
  Cidr exempt_[kMaxExemptEntries] = {};
  int exempt_count_ = 0;
};
static_assert(std::is_trivially_copyable_v<AcceptRules>);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CONFIG_RULES_H_
