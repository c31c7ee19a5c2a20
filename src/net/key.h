// What groups connections into one shared rate: the TRAFFICRATE_KEY setting
// (KeySpec) and the fixed-size key computed for each accepted connection
// (ConnKey).
//
//   absl::StatusOr<KeySpec> spec = ParseKeySpec("peer/24");
//   ConnKey key;
//   if (MakeConnKey(*spec, peer, peer_len, local, local_len, &key)) {
//     // 10.1.2.7 and 10.1.2.99 now have equal keys: one rate for the /24.
//   }
//
// The key is plain bytes compared with memcmp so that it can be hashed and
// stored in the shared-memory table as is, identically in every process.

#ifndef TRAFFICRATE_SRC_NET_KEY_H_
#define TRAFFICRATE_SRC_NET_KEY_H_

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trafficrate {

enum class KeyMode {
  kPeer,   // the client's address, optionally reduced to its network
  kLocal,  // the server's address and port: one rate per listening endpoint
  kAll,    // every connection shares one rate
};

struct KeySpec {
  KeyMode mode = KeyMode::kPeer;
  // Network prefix lengths for kPeer; the full lengths keep one key per
  // client address. Ignored by kLocal, which always uses the exact endpoint.
  int v4_prefix = 32;   // 0..32
  int v6_prefix = 128;  // 0..128; "peer/24" alone keeps 128
};

// Parses TRAFFICRATE_KEY: "peer", "peer/N", "peer/N,M", "local" or "all",
// lower case, no spaces; N is the IPv4 prefix length (0..32) and M the IPv6
// one (0..128). Errors are InvalidArgument, one line, naming TRAFFICRATE_KEY
// and listing the accepted forms. Thread-safe.
// Parses a prefix length: 1 to 3 ASCII digits, at most max_bits (written by
// hand because absl::SimpleAtoi would also accept "+24" and " 24"). Used for
// TRAFFICRATE_KEY and TRAFFICRATE_EXEMPT.
bool ParsePrefixLength(absl::string_view text, int max_bits, int* bits);

ABSL_MUST_USE_RESULT absl::StatusOr<KeySpec> ParseKeySpec(
    absl::string_view value);

// 20 bytes, compared with memcmp; every unused byte is zero.
//  bytes[0..15]: the address as IPv6, an IPv4 address as IPv4-mapped
//    (::ffff:a.b.c.d), so a dual-stack socket's mapped peer and the same
//    plain IPv4 peer get the same key. Masked to the KeySpec's prefix (for
//    IPv4 the prefix applies to bytes 12..15).
//  bytes[16..17]: the port in network order, for KeyMode::kLocal only.
//  bytes[18..19]: zero.
// KeyMode::kAll: all 20 bytes are zero.
struct ConnKey {
  uint8_t bytes[20] = {};
};
static_assert(sizeof(ConnKey) == 20);
static_assert(std::is_trivially_copyable_v<ConnKey> &&
              std::is_standard_layout_v<ConnKey>);

inline bool operator==(const ConnKey& a, const ConnKey& b) {
  return std::memcmp(a.bytes, b.bytes, sizeof(a.bytes)) == 0;
}
inline bool operator!=(const ConnKey& a, const ConnKey& b) { return !(a == b); }

// Builds the key of an accepted connection from its peer address (kPeer), its
// local address (kLocal) or nothing (kAll). Returns false, leaving *out all
// zero, if the address needed is null, shorter than its family's sockaddr, or
// neither AF_INET nor AF_INET6 (e.g. AF_UNIX: such connections are not
// governed). The sockaddrs need not be aligned. Prefix lengths outside their
// range are clamped. The caller keeps ownership of every argument.
// Hot path: no allocation, errno untouched, async-signal-safe.
// REQUIRES: out != nullptr.
bool MakeConnKey(const KeySpec& spec, const sockaddr* peer, socklen_t peer_len,
                 const sockaddr* local, socklen_t local_len, ConnKey* out);

// Formats a key made with `spec` for the CLI and logs: "127.0.0.2",
// "10.1.2.0/24", "2001:db8::/64", "::1", "127.0.0.1:8080" (kLocal),
// "[::1]:8080" (kLocal, IPv6), "all" (kAll). An IPv4-mapped key prints as
// IPv4; the prefix is shown only when shorter than the full length.
// Thread-safe; allocates.
std::string FormatConnKey(const ConnKey& key, const KeySpec& spec);

// TRAFFICRATE_KEY as written: "peer", "peer/24,64", "local", "all".
std::string DescribeKeySpec(const KeySpec& spec);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_NET_KEY_H_
