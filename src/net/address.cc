#include "src/net/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trafficrate {
namespace {

constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0,    0,
                                         0, 0, 0, 0, 0xff, 0xff};

}  // namespace

bool IsV4Mapped(const uint8_t addr16[16]) {
  return std::memcmp(addr16, kV4MappedPrefix, sizeof(kV4MappedPrefix)) == 0;
}

void MapV4(const uint8_t v4[4], uint8_t addr16[16]) {
  std::memcpy(addr16, kV4MappedPrefix, sizeof(kV4MappedPrefix));
  std::memcpy(addr16 + 12, v4, 4);
}

bool ToAddress16(const sockaddr* addr, socklen_t len, uint8_t addr16[16],
                 uint16_t* port) {
  constexpr size_t kFamilyEnd =
      offsetof(sockaddr, sa_family) + sizeof(sa_family_t);
  if (addr == nullptr || len < kFamilyEnd) return false;
  sa_family_t family;
  std::memcpy(
      &family,
      reinterpret_cast<const char*>(addr) + offsetof(sockaddr, sa_family),
      sizeof(family));
  if (family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in in;
    std::memcpy(&in, addr, sizeof(in));
    MapV4(reinterpret_cast<const uint8_t*>(&in.sin_addr), addr16);
    *port = ntohs(in.sin_port);
    return true;
  }
  if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 in6;
    std::memcpy(&in6, addr, sizeof(in6));
    std::memcpy(addr16, &in6.sin6_addr, 16);
    *port = ntohs(in6.sin6_port);
    return true;
  }
  return false;
}

int ClampPrefixBits(int bits, int max_bits) {
  return bits < 0 ? 0 : (bits > max_bits ? max_bits : bits);
}

void MaskAddress(uint8_t* addr, int addr_bytes, int prefix_bits) {
  for (int i = 0; i < addr_bytes; ++i) {
    const int keep = prefix_bits - i * 8;
    if (keep >= 8) continue;
    addr[i] &= keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
  }
}

bool SamePrefix(const uint8_t a[16], const uint8_t b[16], int bits) {
  bits = ClampPrefixBits(bits, kV6Bits);
  const int whole = bits / 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return ((a[whole] ^ b[whole]) & mask) == 0;
}

bool ParseAddress16(absl::string_view text, uint8_t addr16[16], bool* v4) {
  char buf[INET6_ADDRSTRLEN + 1] = {};
  if (text.size() >= sizeof(buf)) return false;
  std::memcpy(buf, text.data(), text.size());
  uint8_t v4_bytes[4];
  if (inet_pton(AF_INET, buf, v4_bytes) == 1) {
    MapV4(v4_bytes, addr16);
    *v4 = true;
    return true;
  }
  uint8_t v6_bytes[16];
  if (inet_pton(AF_INET6, buf, v6_bytes) == 1) {
    std::memcpy(addr16, v6_bytes, sizeof(v6_bytes));
    *v4 = false;
    return true;
  }
  return false;
}

std::string FormatAddress16(const uint8_t addr16[16]) {
  return FormatAddress16(addr16, IsV4Mapped(addr16));
}

std::string FormatAddress16(const uint8_t addr16[16], bool v4) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? addr16 + 12 : addr16, text,
                sizeof(text)) == nullptr) {
    return "?";  // cannot happen: the buffer fits any address
  }
  return text;
}

std::string FormatAddressPort(const uint8_t addr16[16], uint16_t port) {
  const std::string text = FormatAddress16(addr16);
  return IsV4Mapped(addr16) ? absl::StrCat(text, ":", port)
                            : absl::StrCat("[", text, "]:", port);
}

}  // namespace trafficrate
