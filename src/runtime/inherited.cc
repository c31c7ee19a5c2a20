#include "src/runtime/inherited.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "src/runtime/classify.h"

namespace trafficrate {

void EphemeralPorts(int* lo, int* hi) {
  *lo = 32768;
  *hi = 60999;
  const int fd =
      open("/proc/sys/net/ipv4/ip_local_port_range", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[64] = {};
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  int a = 0, b = 0;
  if (n > 0 && std::sscanf(buf, "%d %d", &a, &b) == 2 && a > 0 && a <= b &&
      b <= 65535) {
    *lo = a;
    *hi = b;
  }
}

int OpenFds(int* fds, int max) {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    const int own = dirfd(dir);
    while (dirent* e = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd < 0 || fd == own ||
          fd > INT32_MAX) {
        continue;
      }
      if (n < max) fds[n++] = static_cast<int>(fd);
    }
    closedir(dir);
    std::sort(fds, fds + n);
    return n;
  }
  for (int fd = 0; fd < 1024 && n < max; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0) fds[n++] = fd;
  }
  return n;
}

int AdoptInheritedSockets(const AcceptRules& rules, FdTable* table,
                          InheritedDupFn on_dup, void* context) {
  constexpr int kMaxFds = 4096;
  static int fds[kMaxFds];  // the constructor runs once, on one thread
  const int n = OpenFds(fds, kMaxFds);
  int lo = 0, hi = 0;
  EphemeralPorts(&lo, &hi);
  // The sockets governed so far (inode, fd), so that a duplicate (fd 0 and
  // 1 of one socket) joins its first fd's registration.
  constexpr int kMaxSockets = 256;
  uint64_t inodes[kMaxSockets];
  int firsts[kMaxSockets];
  int sockets = 0;
  int governed = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = fds[i];
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &value, &len) != 0 ||
        value != IPPROTO_TCP) {
      continue;
    }
    len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &value, &len) != 0 ||
        value != 0) {
      continue;  // a listening socket (systemd Accept=no): accepts follow
    }
    const uint64_t inode = SocketInode(fd);
    int seen = 0;
    while (seen < sockets && inodes[seen] != inode) ++seen;
    if (seen < sockets) {
      on_dup(context, firsts[seen], fd);
      continue;
    }
    sockaddr_storage local{};
    len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      continue;
    }
    const int port = PortOf(reinterpret_cast<const sockaddr*>(&local), len);
    const bool client = rules.restricts_ports()
                            ? rules.GovernsPort(port)
                            : port != 0 && (port < lo || port > hi);
    if (!client) continue;  // an outgoing connection the parent made
    FdEntry* entry = table->Get(fd);
    if (entry == nullptr) continue;
    // Registered (and classified: client, key, rules) at its first send.
    entry->state.store(FdState::PendingGroup(fd).word(),
                       std::memory_order_release);
    table->NoteTracked(fd);
    ++governed;
    if (sockets < kMaxSockets) {
      inodes[sockets] = inode;
      firsts[sockets] = fd;
      ++sockets;
    }
  }
  return governed;
}

}  // namespace trafficrate
