#include "src/net/key.h"

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "src/base/units.h"
#include "src/net/address.h"

namespace trafficrate {
namespace {

constexpr char kKeyForms[] =
    "use peer, peer/N or peer/N,M (client network with IPv4 prefix N 0..32 "
    "and IPv6 prefix M 0..128), local or all";

absl::Status KeyError(absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("TRAFFICRATE_KEY: ", problem, "; ", kKeyForms));
}

// Parses the "N" or "N,M" after "peer/".
bool ParsePeerPrefixes(absl::string_view text, KeySpec* spec) {
  const size_t comma = text.find(',');
  if (!ParsePrefixLength(text.substr(0, comma), kV4Bits, &spec->v4_prefix)) {
    return false;
  }
  return comma == absl::string_view::npos ||
         ParsePrefixLength(text.substr(comma + 1), kV6Bits, &spec->v6_prefix);
}

// Fills key bytes 0..17 from an AF_INET or AF_INET6 address (the port, in
// network order, only `with_port`); writes nothing when it returns false.
bool CopyAddress(const sockaddr* addr, socklen_t len, int v4_bits, int v6_bits,
                 bool with_port, ConnKey* out) {
  uint8_t addr16[16];
  uint16_t port = 0;
  if (!ToAddress16(addr, len, addr16, &port)) return false;
  if (IsV4Mapped(addr16)) {
    MaskAddress(addr16 + 12, 4, v4_bits);
  } else {
    MaskAddress(addr16, 16, v6_bits);
  }
  std::memcpy(out->bytes, addr16, sizeof(addr16));
  if (with_port) {
    out->bytes[16] = static_cast<uint8_t>(port >> 8);
    out->bytes[17] = static_cast<uint8_t>(port & 0xff);
  }
  return true;
}

}  // namespace

bool ParsePrefixLength(absl::string_view text, int max_bits, int* bits) {
  if (text.empty() || text.size() > 3) return false;
  int value = 0;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<uint8_t>(c))) return false;
    value = value * 10 + (c - '0');
  }
  if (value > max_bits) return false;
  *bits = value;
  return true;
}

absl::StatusOr<KeySpec> ParseKeySpec(absl::string_view value) {
  if (value.empty()) return KeyError("empty");
  KeySpec spec;
  if (value == "peer") return spec;
  if (value == "local" || value == "all") {
    spec.mode = value == "local" ? KeyMode::kLocal : KeyMode::kAll;
    return spec;
  }
  absl::string_view prefixes = value;
  if (!absl::ConsumePrefix(&prefixes, "peer/") ||
      !ParsePeerPrefixes(prefixes, &spec)) {
    return KeyError(absl::StrCat(QuoteForMessage(value), " is not a key"));
  }
  return spec;
}

bool MakeConnKey(const KeySpec& spec, const sockaddr* peer, socklen_t peer_len,
                 const sockaddr* local, socklen_t local_len, ConnKey* out) {
  // Zeroed first: unused bytes take part in memcmp, and a refused address
  // leaves a well-defined key. CopyAddress writes nothing when it refuses.
  std::memset(out->bytes, 0, sizeof(out->bytes));
  switch (spec.mode) {
    case KeyMode::kPeer:
      return CopyAddress(peer, peer_len,
                         ClampPrefixBits(spec.v4_prefix, kV4Bits),
                         ClampPrefixBits(spec.v6_prefix, kV6Bits),
                         /*with_port=*/false, out);
    case KeyMode::kLocal:
      return CopyAddress(local, local_len, kV4Bits, kV6Bits,
                         /*with_port=*/true, out);
    case KeyMode::kAll:
      return true;
  }
  return false;
}

std::string FormatConnKey(const ConnKey& key, const KeySpec& spec) {
  if (spec.mode == KeyMode::kAll) return "all";
  if (spec.mode == KeyMode::kLocal) {
    return FormatAddressPort(
        key.bytes, static_cast<uint16_t>((key.bytes[16] << 8) | key.bytes[17]));
  }
  const bool v4 = IsV4Mapped(key.bytes);
  const int full_bits = v4 ? kV4Bits : kV6Bits;
  const int bits =
      ClampPrefixBits(v4 ? spec.v4_prefix : spec.v6_prefix, full_bits);
  if (bits == full_bits) return FormatAddress16(key.bytes);
  return absl::StrCat(FormatAddress16(key.bytes), "/", bits);
}

std::string DescribeKeySpec(const KeySpec& spec) {
  switch (spec.mode) {
    case KeyMode::kLocal:
      return "local";
    case KeyMode::kAll:
      return "all";
    case KeyMode::kPeer:
      break;
  }
  if (spec.v4_prefix == kV4Bits && spec.v6_prefix == kV6Bits) return "peer";
  return absl::StrCat("peer/", spec.v4_prefix, ",", spec.v6_prefix);
}

}  // namespace trafficrate
