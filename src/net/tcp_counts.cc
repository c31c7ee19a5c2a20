#include "src/net/tcp_counts.h"

// The kernel's struct tcp_info (glibc's <netinet/tcp.h> stops before
// tcpi_bytes_sent); the two headers cannot be included together.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace trafficrate {

bool ReadTcpSendCounts(int fd, TcpSendCounts* counts) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_retrans) +
                sizeof(info.tcpi_bytes_retrans)) {
    return false;
  }
  counts->left = info.tcpi_bytes_sent > info.tcpi_bytes_retrans
                     ? info.tcpi_bytes_sent - info.tcpi_bytes_retrans
                     : 0;
  counts->unsent = info.tcpi_notsent_bytes;
  return true;
}

}  // namespace trafficrate
