#include "src/config/rules.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "src/base/units.h"
#include "src/net/address.h"
#include "src/net/key.h"

namespace trafficrate {
namespace {

// The names as in config.h, which includes this header (so cannot be
// included here); config_test checks that the errors use them.
constexpr char kPortsName[] = "TRAFFICRATE_PORTS";
constexpr char kExemptName[] = "TRAFFICRATE_EXEMPT";

constexpr char kPortsForm[] =
    "use a comma-separated list of ports 1..65535 or port ranges N-M, e.g. "
    "80,443,8000-8099";
constexpr char kExemptForm[] =
    "use a comma-separated list of at most 64 client addresses or networks, "
    "e.g. 10.0.0.0/8,127.0.0.3,2001:db8::/32,::1";

constexpr uint32_t kMaxPort = 65535;
absl::Status ListError(absl::string_view name, absl::string_view problem,
                       absl::string_view form) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", problem, "; ", form));
}

// Splits a list at commas and strips blanks around each item. Returns false
// if an item is empty.
bool SplitList(absl::string_view value, std::vector<absl::string_view>* items) {
  *items = absl::StrSplit(value, ',');
  for (absl::string_view& item : *items) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) return false;
  }
  return true;
}

// ASCII digits only (absl::SimpleAtoi would also take "+80" and " 80").
// Values above 65535 saturate at 65536, so long runs cannot overflow.
bool ParsePortNumber(absl::string_view text, uint32_t* port) {
  if (text.empty()) return false;
  uint32_t value = 0;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<uint8_t>(c))) return false;
    value = std::min<uint32_t>(value * 10 + (c - '0'), kMaxPort + 1);
  }
  *port = value;
  return true;
}

}  // namespace

std::string ParsePortItem(absl::string_view item, PortRange* range) {
  const size_t dash = item.find('-');
  uint32_t first = 0;
  uint32_t last = 0;
  if (!ParsePortNumber(item.substr(0, dash), &first) ||
      (dash != absl::string_view::npos &&
       !ParsePortNumber(item.substr(dash + 1), &last))) {
    return absl::StrCat(QuoteForMessage(item), " is not a port or port range");
  }
  if (dash == absl::string_view::npos) last = first;
  if (first < 1 || first > kMaxPort || last < 1 || last > kMaxPort) {
    return absl::StrCat(QuoteForMessage(item), " is outside 1..65535");
  }
  if (last < first) {
    return absl::StrCat(QuoteForMessage(item), " ends before it starts");
  }
  range->first = static_cast<uint16_t>(first);
  range->last = static_cast<uint16_t>(last);
  return "";
}

namespace {

// Sorts and merges overlapping or adjacent ranges.
std::vector<PortRange> MergeRanges(std::vector<PortRange> ranges) {
  std::sort(
      ranges.begin(), ranges.end(), [](const PortRange& a, const PortRange& b) {
        return a.first < b.first || (a.first == b.first && a.last < b.last);
      });
  std::vector<PortRange> merged;
  for (const PortRange& r : ranges) {
    if (!merged.empty() &&
        uint32_t{r.first} <= uint32_t{merged.back().last} + 1) {
      merged.back().last = std::max(merged.back().last, r.last);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// Fills cidr->family and cidr->addr from an address literal.
bool ParseAddress(absl::string_view text, Cidr* cidr) {
  bool v4 = false;
  if (!ParseAddress16(text, cidr->addr, &v4)) return false;
  cidr->family = v4 ? AF_INET : AF_INET6;
  return true;
}

}  // namespace

std::string ParseCidrItem(absl::string_view item, Cidr* cidr) {
  const size_t slash = item.find('/');
  if (!ParseAddress(item.substr(0, slash), cidr)) {
    return absl::StrCat(QuoteForMessage(item),
                        " is not an IP address or network");
  }
  const int full = cidr->family == AF_INET ? kV4Bits : kV6Bits;
  cidr->prefix = full;
  if (slash != absl::string_view::npos &&
      !ParsePrefixLength(item.substr(slash + 1), full, &cidr->prefix)) {
    return absl::StrCat(
        QuoteForMessage(item), " has a bad prefix length (",
        cidr->family == AF_INET ? "0..32 for IPv4" : "0..128 for IPv6", ")");
  }
  MaskAddress(
      cidr->addr, 16,
      cidr->family == AF_INET ? kV4MappedBits + cidr->prefix : cidr->prefix);
  return "";
}

bool operator==(const Cidr& a, const Cidr& b) {
  return a.family == b.family && a.prefix == b.prefix &&
         std::memcmp(a.addr, b.addr, sizeof(a.addr)) == 0;
}

absl::StatusOr<std::vector<PortRange>> ParsePorts(absl::string_view value) {
  if (value.empty()) return ListError(kPortsName, "empty", kPortsForm);
  std::vector<absl::string_view> items;
  if (!SplitList(value, &items)) {
    return ListError(kPortsName,
                     absl::StrCat(QuoteForMessage(value), " has an empty item"),
                     kPortsForm);
  }
  std::vector<PortRange> ranges(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string problem = ParsePortItem(items[i], &ranges[i]);
    if (!problem.empty()) return ListError(kPortsName, problem, kPortsForm);
  }
  return MergeRanges(std::move(ranges));
}

absl::StatusOr<std::vector<Cidr>> ParseExempt(absl::string_view value) {
  if (value.empty()) return ListError(kExemptName, "empty", kExemptForm);
  std::vector<absl::string_view> items;
  if (!SplitList(value, &items)) {
    return ListError(kExemptName,
                     absl::StrCat(QuoteForMessage(value), " has an empty item"),
                     kExemptForm);
  }
  if (items.size() > static_cast<size_t>(kMaxExemptEntries)) {
    return ListError(kExemptName,
                     absl::StrCat(items.size(), " entries, above the maximum ",
                                  kMaxExemptEntries),
                     kExemptForm);
  }
  std::vector<Cidr> networks;
  for (const absl::string_view item : items) {
    Cidr cidr;
    const std::string problem = ParseCidrItem(item, &cidr);
    if (!problem.empty()) return ListError(kExemptName, problem, kExemptForm);
    if (std::find(networks.begin(), networks.end(), cidr) == networks.end()) {
      networks.push_back(cidr);
    }
  }
  return networks;
}

std::string FormatCidr(const Cidr& cidr) {
  const bool v4 = cidr.family == AF_INET;
  std::string text = FormatAddress16(cidr.addr, v4);
  if (cidr.prefix >= (v4 ? kV4Bits : kV6Bits)) return text;
  return absl::StrCat(text, "/", cidr.prefix);
}

std::string FormatPorts(const std::vector<PortRange>& ports) {
  if (ports.empty()) return "all";
  return absl::StrJoin(ports, ",", [](std::string* out, const PortRange& r) {
    if (r.first == r.last) {
      absl::StrAppend(out, r.first);
    } else {
      absl::StrAppend(out, r.first, "-", r.last);
    }
  });
}

bool CidrContains(const Cidr& cidr, const uint8_t addr16[16]) {
  const bool v4 = cidr.family == AF_INET;
  const int bits = v4 ? kV4MappedBits + ClampPrefixBits(cidr.prefix, kV4Bits)
                      : ClampPrefixBits(cidr.prefix, kV6Bits);
  // An IPv6 network does not reach into the IPv4-mapped range (so "::/0"
  // means every IPv6 client, not every client) unless it lies inside it.
  if (IsV4Mapped(addr16) !=
      (v4 || (bits >= kV4MappedBits && IsV4Mapped(cidr.addr)))) {
    return false;
  }
  return SamePrefix(cidr.addr, addr16, bits);
}

absl::StatusOr<AcceptRules> AcceptRules::Make(
    const std::vector<PortRange>& ports, const std::vector<Cidr>& exempt) {
  if (exempt.size() > static_cast<size_t>(kMaxExemptEntries)) {
    return ListError(kExemptName,
                     absl::StrCat(exempt.size(), " entries, above the maximum ",
                                  kMaxExemptEntries),
                     kExemptForm);
  }
  AcceptRules rules;
  rules.all_ports_ = ports.empty();
  for (const PortRange& r : ports) {
    for (uint32_t port = r.first; port <= r.last; ++port) {
      rules.port_bits_[port >> 6] |= uint64_t{1} << (port & 63);
    }
  }
  for (const Cidr& cidr : exempt) rules.exempt_[rules.exempt_count_++] = cidr;
  return rules;
}

bool AcceptRules::Exempts(const uint8_t addr16[16]) const {
  for (int i = 0; i < exempt_count_; ++i) {
    if (CidrContains(exempt_[i], addr16)) return true;
  }
  return false;
}

}  // namespace trafficrate
