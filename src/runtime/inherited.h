// Inherited sockets: at start-up (the library's constructor,
// TRAFFICRATE_INHERITED), the client connections a process inherited from
// its parent, such as inetd's or systemd's (Accept=yes) fd 0/1, or
// socket-activation fds, are marked to be governed: each is registered (and
// classified: client, key, rules) at its first send (FdState::PendingGroup).
//
// A connected TCP socket found then was made by no code of this program
// yet; it is taken as a client's (accepted by the parent) if its local port
// is in TRAFFICRATE_PORTS, or, without TRAFFICRATE_PORTS, if its local port
// is outside the kernel's ephemeral range (net.ipv4.ip_local_port_range),
// where the local ports of outgoing connections come from. Listening
// sockets are left alone (accepts follow). The fds of one socket are one
// connection: the first one found is marked, the others are made its
// duplicates by the caller (on_dup, as after a dup).
//
//   int n = AdoptInheritedSockets(options.rules, table, OnDupFn, governor);
//
// Init only, on one thread (it uses a static buffer); not the hot path.

#ifndef TRAFFICRATE_SRC_RUNTIME_INHERITED_H_
#define TRAFFICRATE_SRC_RUNTIME_INHERITED_H_

#include "src/config/rules.h"
#include "src/runtime/fd_table.h"

namespace trafficrate {

// Makes fd a duplicate of first_fd's connection (Governor::OnDup).
using InheritedDupFn = void (*)(void* context, int first_fd, int fd);

// Marks the inherited client connections in `table` (see above) and calls
// on_dup(context, first, fd) for each further fd of a socket marked. Returns
// how many sockets it marked. REQUIRES: table outlives the call; init only.
int AdoptInheritedSockets(const AcceptRules& rules, FdTable* table,
                          InheritedDupFn on_dup, void* context);

// The kernel's ephemeral port range (net.ipv4.ip_local_port_range of this
// network namespace); the kernel's default if it cannot be read.
void EphemeralPorts(int* lo, int* hi);

// The open fds of this process, ascending, into fds (at most max); returns
// how many. From /proc/self/fd, else every number below 1024.
int OpenFds(int* fds, int max);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_INHERITED_H_
