// A listening TCP socket on a loopback address, for the tests of the
// runtime's units that take real sockets (classify_test.cc,
// inherited_test.cc).

#ifndef TRAFFICRATE_TESTS_RUNTIME_LOOPBACK_LISTENER_H_
#define TRAFFICRATE_TESTS_RUNTIME_LOOPBACK_LISTENER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace trafficrate {
namespace testing_util {

// Listens on `address` (an IPv4 literal) at a port the kernel picks, which
// goes to *port (host order). Returns the fd, or -1.
inline int ListenLoopback(const char* address, uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (inet_pton(AF_INET, address, &addr.sin_addr) != 1 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 8) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_RUNTIME_LOOPBACK_LISTENER_H_
