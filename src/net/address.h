// Client and local addresses in one 16-byte form: an IPv6 address as it is,
// an IPv4 address as its IPv4-mapped IPv6 form (::ffff:a.b.c.d), so that a
// dual-stack socket's mapped peer and the same client on an IPv4 socket are
// one address. Keys (key.h), rules (rules.h, rules_file.h), the Governor's
// classification and the zone's snapshot all hold addresses so.
//
//   uint8_t addr[16];
//   uint16_t port = 0;
//   if (ToAddress16(peer, peer_len, addr, &port) && IsV4Mapped(addr)) {
//     MaskAddress(addr + 12, 4, 24);  // the client's /24
//   }
//   FormatAddressPort(addr, port);    // "192.0.2.0:4711"
//
// Everything but the parsing and formatting is free of allocation and
// system calls, for the interposed calls' classification.

#ifndef TRAFFICRATE_SRC_NET_ADDRESS_H_
#define TRAFFICRATE_SRC_NET_ADDRESS_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace trafficrate {

inline constexpr int kV4Bits = 32;
inline constexpr int kV6Bits = 128;
// Where an IPv4 address starts in the 16-byte form, in bits.
inline constexpr int kV4MappedBits = 96;

// Whether addr16 is an IPv4 address (inside ::ffff:0:0/96).
bool IsV4Mapped(const uint8_t addr16[16]);

// Writes the 16-byte form of the IPv4 address v4 (4 bytes, network order).
void MapV4(const uint8_t v4[4], uint8_t addr16[16]);

// The 16-byte form and the port (host order) of an AF_INET or AF_INET6
// address at least as long as its family's sockaddr; false, with nothing
// written, for anything else. Copied out with memcpy: the caller's buffer
// may be unaligned.
bool ToAddress16(const sockaddr* addr, socklen_t len, uint8_t addr16[16],
                 uint16_t* port);

// bits, clamped to 0..max_bits.
int ClampPrefixBits(int bits, int max_bits);

// Clears every bit of addr (addr_bytes long) after the first prefix_bits.
void MaskAddress(uint8_t* addr, int addr_bytes, int prefix_bits);

// Whether a and b agree in their first `bits` bits (0..128).
bool SamePrefix(const uint8_t a[16], const uint8_t b[16], int bits);

// Parses an IPv4 or IPv6 literal (no brackets, no prefix length) into the
// 16-byte form; *v4 says which it was. False for anything else.
bool ParseAddress16(absl::string_view text, uint8_t addr16[16], bool* v4);

// "192.0.2.1" for an IPv4 address, "2001:db8::1" for an IPv6 one.
std::string FormatAddress16(const uint8_t addr16[16]);
// The same, told which: an address written in IPv6 form ("::ffff:192.0.2.1"
// in a rule) is shown as written.
std::string FormatAddress16(const uint8_t addr16[16], bool v4);

// With a port: "192.0.2.1:80", "[2001:db8::1]:80".
std::string FormatAddressPort(const uint8_t addr16[16], uint16_t port);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_NET_ADDRESS_H_
