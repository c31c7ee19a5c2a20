// What a TCP socket still has to send, and whether anyone will take it: the
// budget counts what left a socket as what it was handed minus what it
// still holds, and a connection closed with data unsent drains on only
// while its peer reads.
//
//   int64_t unsent = UnsentBytes(fd);     // -1 if unknown
//   if (unsent > 0 && PeerStillReading(fd)) ...
//
// One system call each. Thread-safe; errno may be clobbered.

#ifndef TRAFFICRATE_SRC_NET_SEND_QUEUE_H_
#define TRAFFICRATE_SRC_NET_SEND_QUEUE_H_

#include <cstdint>

namespace trafficrate {

// Bytes of fd's connection not yet sent (SIOCOUTQNSD), or -1 if unknown.
int64_t UnsentBytes(int fd);

// Whether the client has not closed its end: only then will the kernel
// really send what is queued. A download client that hung up (the server's
// close follows its FIN or RST) gets none of it.
bool PeerStillReading(int fd);

// Of `handed` bytes written to a socket, how many have left it with
// `unsent` still queued.
inline uint64_t LeftOf(uint64_t handed, int64_t unsent) {
  return handed > static_cast<uint64_t>(unsent) ? handed - unsent : 0;
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_NET_SEND_QUEUE_H_
