// What the kernel counts of a TCP socket's sending, whoever wrote to it: the
// process measuring it, a child it forked that runs as another user, or any
// other process holding the socket. The budget measures with it (a sender
// that cannot reach the zone still has its bytes counted).
//
//   TcpSendCounts counts;
//   if (ReadTcpSendCounts(fd, &counts)) use(counts.left, counts.unsent);
//
// One getsockopt(TCP_INFO). Thread-safe; errno may be clobbered.

#ifndef TRAFFICRATE_SRC_NET_TCP_COUNTS_H_
#define TRAFFICRATE_SRC_NET_TCP_COUNTS_H_

#include <cstdint>

namespace trafficrate {

struct TcpSendCounts {
  // Bytes that have left the socket (each sent once at least) since it was
  // made: tcpi_bytes_sent - tcpi_bytes_retrans.
  uint64_t left = 0;
  // Bytes written to it and not sent yet: tcpi_notsent_bytes (SIOCOUTQNSD).
  uint64_t unsent = 0;
};

// False if fd is no TCP socket, or the kernel is older than 4.19 (no
// tcpi_bytes_sent): then *counts is untouched.
bool ReadTcpSendCounts(int fd, TcpSendCounts* counts);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_NET_TCP_COUNTS_H_
