// Classifying an accepted socket: whether the connection is governed at all
// (a TCP socket with an AF_INET or AF_INET6 peer, on a governed local port,
// from a client that is not exempt), and its key. Decided once per
// connection, at accept (or at its first send when that was put off).
//
//   ConnKey key;
//   uint8_t peer16[16];
//   uint16_t peer_port;
//   const RuleSet::Read read(rules);
//   if (ClassifyConn(fd, options.key, options.rules, read.table(), peer,
//                    peer_len, &key, peer16, &peer_port)) { ... register ... }
//
// Thread-safe: no state. No allocation; errno may be clobbered (the
// interposer restores it).

#ifndef TRAFFICRATE_SRC_RUNTIME_CLASSIFY_H_
#define TRAFFICRATE_SRC_RUNTIME_CLASSIFY_H_

#include <sys/socket.h>

#include <cstdint>

#include "src/config/rules.h"
#include "src/net/key.h"
#include "src/runtime/rule_set.h"

namespace trafficrate {

// Classifies socket fd. peer may be null or truncated: then the kernel is
// asked (getpeername). The local address is asked for (getsockname) only
// when the key or the port rules need it. Without a rule table (table
// null): key_spec, then accept_rules' ports and exempt clients decide. With
// one: the first rule matching the local endpoint and the client decides
// (accept_rules' exempt clients first), and the key carries its zone rule in
// byte kKeyRuleByte; an unlimited rule, or one with no zone rule, governs
// nothing. On true, *key is the connection's key and peer16 / *peer_port
// its client (16-byte form, host-order port); on false they may be
// partly written.
bool ClassifyConn(int fd, const KeySpec& key_spec,
                  const AcceptRules& accept_rules, const RuleTable* table,
                  const sockaddr* peer, socklen_t peer_len, ConnKey* key,
                  uint8_t peer16[16], uint16_t* peer_port);

// The port of an AF_INET or AF_INET6 address, host order; 0 for others.
uint16_t PortOf(const sockaddr* addr, socklen_t len);

// The inode of the socket behind fd (which names the socket whatever fd
// number or process holds it); 0 if fd is not a socket. One fstat.
uint64_t SocketInode(int fd);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_CLASSIFY_H_
