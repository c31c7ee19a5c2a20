#include "src/runtime/classify.h"

#include <netinet/in.h>
#include <sys/stat.h>

#include <cstring>

#include "src/net/address.h"

namespace trafficrate {
namespace {

// The 16-byte form of an address (IPv4 as v4-mapped) and its port; zero
// for anything but AF_INET and AF_INET6.
void PeerBytes(const sockaddr* peer, socklen_t len, uint8_t out[16],
               uint16_t* port) {
  *port = 0;
  if (!ToAddress16(peer, len, out, port)) std::memset(out, 0, 16);
}

bool IsInetWithLength(const sockaddr* addr, socklen_t len) {
  if (addr == nullptr || len < sizeof(sa_family_t)) return false;
  if (addr->sa_family == AF_INET) return len >= sizeof(sockaddr_in);
  if (addr->sa_family == AF_INET6) return len >= sizeof(sockaddr_in6);
  return false;
}

// The peer of an accepted socket: `peer` if accept filled in a whole
// AF_INET or AF_INET6 address, else the kernel's (getpeername, into *buf).
// Null if it has none; *peer_len follows the address returned.
const sockaddr* PeerAddress(int fd, const sockaddr* peer, socklen_t* peer_len,
                            sockaddr_storage* buf) {
  if (IsInetWithLength(peer, *peer_len)) return peer;
  socklen_t len = sizeof(*buf);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(buf), &len) != 0) {
    return nullptr;
  }
  peer = reinterpret_cast<const sockaddr*>(buf);
  if (!IsInetWithLength(peer, len)) return nullptr;
  *peer_len = len;
  return peer;
}

}  // namespace

uint16_t PortOf(const sockaddr* addr, socklen_t len) {
  uint8_t addr16[16];
  uint16_t port = 0;
  PeerBytes(addr, len, addr16, &port);
  return port;
}

namespace {

// Classifies an accepted socket: a TCP (stream) socket with an AF_INET or
// AF_INET6 peer, on a governed local port, from a client that is not exempt;
// and its key. peer may be null or truncated: then the kernel is asked. The
// local address is asked for only when the key or the port rules need it.
// With a rules file: the first rule matching the local endpoint and the
// client decides, and the key carries its zone rule in byte kKeyRuleByte.
bool ClassifyByRules(const RuleTable& table, const sockaddr* peer,
                     socklen_t peer_len, const sockaddr* local,
                     socklen_t local_len, const uint8_t peer16[16],
                     ConnKey* key) {
  uint8_t local16[16];
  uint16_t local_port = 0;
  PeerBytes(local, local_len, local16, &local_port);
  const int match = FirstMatchingRule(table.rules, local16, local_port, peer16);
  if (match < 0) return false;
  const Rule& rule = table.rules[match];
  const uint32_t slot = table.slots[match];
  if (rule.unlimited || slot >= kZoneRules) return false;
  for (const Cidr& cidr : rule.exempt) {
    if (CidrContains(cidr, peer16)) return false;
  }
  if (!MakeConnKey(rule.key, peer, peer_len, local, local_len, key)) {
    return false;
  }
  key->bytes[kKeyRuleByte] = static_cast<uint8_t>(slot);
  return true;
}

}  // namespace

bool ClassifyConn(int fd, const KeySpec& key_spec,
                  const AcceptRules& accept_rules, const RuleTable* table,
                  const sockaddr* peer, socklen_t peer_len, ConnKey* key,
                  uint8_t peer16[16], uint16_t* peer_port) {
  int type = 0;
  socklen_t type_len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 ||
      type != SOCK_STREAM) {
    return false;
  }
  sockaddr_storage peer_buf;
  peer = PeerAddress(fd, peer, &peer_len, &peer_buf);
  if (peer == nullptr) return false;
  PeerBytes(peer, peer_len, peer16, peer_port);
  if (accept_rules.Exempts(peer16)) return false;
  sockaddr_storage local_buf;
  const sockaddr* local = nullptr;
  socklen_t local_len = 0;
  const bool by_rules = table != nullptr;
  if (by_rules || key_spec.mode == KeyMode::kLocal ||
      accept_rules.restricts_ports()) {
    local_len = sizeof(local_buf);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local_buf), &local_len) !=
        0) {
      return false;
    }
    local = reinterpret_cast<const sockaddr*>(&local_buf);
    if (local_len < sizeof(sa_family_t) ||
        (local->sa_family != AF_INET && local->sa_family != AF_INET6)) {
      return false;
    }
    if (by_rules) {
      return ClassifyByRules(*table, peer, peer_len, local, local_len, peer16,
                             key);
    }
    if (!accept_rules.GovernsPort(PortOf(local, local_len))) return false;
  }
  return MakeConnKey(key_spec, peer, peer_len, local, local_len, key);
}

uint64_t SocketInode(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace trafficrate
