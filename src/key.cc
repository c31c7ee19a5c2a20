#include "src/key.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "src/units.h"

namespace trafficrate {
namespace {

constexpr int kV4Bits = 32;
constexpr int kV6Bits = 128;
constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0,    0,
                                         0, 0, 0, 0, 0xff, 0xff};

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

int ClampBits(int bits, int max_bits) {
  return bits < 0 ? 0 : (bits > max_bits ? max_bits : bits);
}

// Clears every bit of `addr` after the first `prefix_bits`.
void MaskAddress(uint8_t* addr, int addr_bytes, int prefix_bits) {
  for (int i = 0; i < addr_bytes; ++i) {
    const int keep = prefix_bits - i * 8;
    if (keep >= 8) continue;
    addr[i] &= keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
  }
}

// Fills key bytes 0..17 from an AF_INET or AF_INET6 address; writes nothing
// when it returns false. The sockaddr is copied out with memcpy because the
// caller's buffer may be unaligned.
bool CopyAddress(const sockaddr* addr, socklen_t len, int v4_bits, int v6_bits,
                 bool with_port, ConnKey* out) {
  constexpr size_t kFamilyEnd =
      offsetof(sockaddr, sa_family) + sizeof(sa_family_t);
  if (addr == nullptr || len < kFamilyEnd) return false;
  sa_family_t family;
  std::memcpy(
      &family,
      reinterpret_cast<const char*>(addr) + offsetof(sockaddr, sa_family),
      sizeof(family));
  uint8_t* bytes = out->bytes;
  if (family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in in;
    std::memcpy(&in, addr, sizeof(in));
    std::memcpy(bytes, kV4MappedPrefix, sizeof(kV4MappedPrefix));
    std::memcpy(bytes + 12, &in.sin_addr, 4);
    MaskAddress(bytes + 12, 4, v4_bits);
    if (with_port) std::memcpy(bytes + 16, &in.sin_port, 2);
    return true;
  }
  if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 in6;
    std::memcpy(&in6, addr, sizeof(in6));
    std::memcpy(bytes, &in6.sin6_addr, 16);
    if (std::memcmp(bytes, kV4MappedPrefix, sizeof(kV4MappedPrefix)) == 0) {
      MaskAddress(bytes + 12, 4, v4_bits);
    } else {
      MaskAddress(bytes, 16, v6_bits);
    }
    if (with_port) std::memcpy(bytes + 16, &in6.sin6_port, 2);
    return true;
  }
  return false;
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
      return CopyAddress(peer, peer_len, ClampBits(spec.v4_prefix, kV4Bits),
                         ClampBits(spec.v6_prefix, kV6Bits),
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
  const bool v4 =
      std::memcmp(key.bytes, kV4MappedPrefix, sizeof(kV4MappedPrefix)) == 0;
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = v4 ? key.bytes + 12 : key.bytes;
  if (inet_ntop(v4 ? AF_INET : AF_INET6, addr, text, sizeof(text)) == nullptr) {
    return "?";  // cannot happen: the buffer fits any address
  }
  if (spec.mode == KeyMode::kLocal) {
    const int port = (key.bytes[16] << 8) | key.bytes[17];
    return v4 ? absl::StrCat(text, ":", port)
              : absl::StrCat("[", text, "]:", port);
  }
  const int full_bits = v4 ? kV4Bits : kV6Bits;
  const int bits = ClampBits(v4 ? spec.v4_prefix : spec.v6_prefix, full_bits);
  if (bits == full_bits) return text;
  return absl::StrCat(text, "/", bits);
}

}  // namespace trafficrate
