// Says, in one log line per process, when the library is loaded but will
// pace nothing because the program goes around libc:
//
// * a Go program (checked once at start-up on /proc/self/exe, a few KB of
//   reads: src/base/elf_probe.h): it makes its system calls itself;
// * a process that listens on a TCP port (through libc's listen, which the
//   library interposes) and then holds open connections on that port that
//   no accept() or accept4() call of the process returned: it accepts
//   through io_uring or a raw system call, so its connections are never
//   registered.
//
//   if (!LogIfGoProgram(logger, "/proc/self/exe")) {
//     watch = new ListenWatch(&logger, ListenWatchTiming(), &MarkThread);
//   }
//   ... in accept/accept4, after a successful call:  watch->NoteAccept();
//   ... in listen, after a successful call:          watch->OnListen(fd);
//
// Costs, measured here (2026-12-06, Debian 12 VM, 2 cores): the Go check
// 14 us per exec (7 system calls, ~3 KB read). The second check costs
// nothing until the process's first listen(), which then takes ~160 us
// more (the thread), later ones ~3 us (getsockname, getsockopt; nothing
// past 8 ports or once the thread has ended). The thread (64 KiB stack)
// sleeps and looks a few times (5 s after the listen, then 10, 20 ... 320
// s later) and ends at the first accept() seen, at the line, when the
// port's connections are held by other processes (a master whose workers
// accept: nothing to tell from here), when sock_diag is refused, or after
// the last look. A look is one sock_diag dump the kernel filters to the
// port's open connections (0.9-1.2 ms with no connection, 1.9-2.2 ms with
// 9 000 in the namespace: the kernel walks its whole established hash)
// and, only if some are found, a stat through each link /proc/self/fd
// lists until one of them is found (25 us with a few fds, about 4 us per
// fd: 66-77 ms with 18 000). The accept path pays one relaxed atomic load;
// no send path pays anything.
//
// What it cannot see (no line): connections accepted by forked workers
// of the listening process (it checks its own fds only), a process that
// listens before it daemonizes (the thread stays in the parent), sockets
// io_uring keeps as fixed files (not in the fd table), connections that
// come and go between two looks. A line that is wrong: a process that
// listens on a port and is handed that port's connections by another
// process (SCM_RIGHTS) without accepting any itself, or one that calls
// listen() again after an exec and still holds connections the program
// accepted before it, and accepts none in the first seconds.

#ifndef TRAFFICRATE_SRC_RUNTIME_BYPASS_WATCH_H_
#define TRAFFICRATE_SRC_RUNTIME_BYPASS_WATCH_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "src/base/clock.h"

namespace trafficrate {

class Logger;

// Logs one warning if `exe` is a Go program and returns true (false for
// anything else, or if it cannot be read). Reads a few KB.
bool LogIfGoProgram(const Logger& logger, const char* exe);

// A TCP listening address, as getsockname gave it.
struct ListenAddr {
  int family = 0;         // AF_INET or AF_INET6
  uint16_t port = 0;      // host order
  bool any = true;        // bound to every address (0.0.0.0, ::)
  uint8_t addr[16] = {};  // network order: 4 bytes (AF_INET) or 16
};

// The inodes (sorted) of the open connections whose local address is
// `listener`'s (any address when it is bound to all): states from
// ESTABLISHED to CLOSING, held by a socket file (inode != 0: accepted;
// connections still in the accept queue have none). At most `max` of
// them. From one sock_diag (NETLINK_SOCK_DIAG) dump the kernel filters
// to the port; an error if netlink is refused (a sandbox) or fails.
absl::StatusOr<std::vector<uint64_t>> OpenConnectionInodes(
    const ListenAddr& listener, size_t max);

// Those of `inodes` (sorted) that are sockets of this process's fd table
// (/proc/self/fd), sorted; at most `limit`: the walk stops there.
std::vector<uint64_t> OwnedSockets(const std::vector<uint64_t>& inodes,
                                   size_t limit);

struct ListenWatchTiming {
  int64_t first_ns = 5'000'000'000;  // first look, after the first listen
  int looks = 7;                     // each one twice as long after the last
  // Where the waits take the time from (not owned; outlives the watch).
  const Clock* clock = &MonotonicClock();
};

class ListenWatch {
 public:
  enum class Look {
    kNothingYet,  // no open connection on the ports (look again later)
    kAccepted,    // an accept() was seen: the process is as expected
    kOthers,      // connections there, none of them this process's
    kCannotTell,  // sock_diag refused (a sandbox) or failed
    kUnaccepted,  // this process holds connections it never accepted
  };

  // `logger` must outlive the ListenWatch (never destroyed in the
  // library). `thread_start`, if not null, runs first in its thread (the
  // library marks the thread as its own there, so that its calls are not
  // taken for the host's).
  ListenWatch(const Logger* logger, const ListenWatchTiming& timing,
              void (*thread_start)());
  ListenWatch(const ListenWatch&) = delete;
  ListenWatch& operator=(const ListenWatch&) = delete;

  // An accept() or accept4() of the process returned a connection.
  // Hot path (accept): one relaxed load, a store the first time.
  void NoteAccept() {
    if (!accepted_.load(std::memory_order_relaxed)) {
      accepted_.store(true, std::memory_order_relaxed);
    }
  }
  // listen(fd) succeeded. A TCP socket's address is kept (up to
  // kMaxListeners); the first one starts the thread. No allocation;
  // getsockname and getsockopt, pthread_create once.
  void OnListen(int fd);
  // In the child after fork: the thread did not survive; the child's own
  // listen() starts one of its own.
  void AfterForkChild();
  // The thread is running (started, not yet at its end).
  bool looking() const {
    return state_.load(std::memory_order_acquire) == kLooking;
  }

  // One look now, at the ports kept so far. Logs the line for
  // kUnaccepted. The thread's step, public for tests.
  Look LookOnce();

  static constexpr int kMaxListeners = 8;
  static constexpr size_t kMaxConnections = 4096;  // per port and look

 private:
  // kIdle until the first listen, then kLooking; kDone for good (in this
  // process) after the last look, kFailed if the thread could not start.
  enum State : int { kIdle, kLooking, kDone, kFailed };
  struct Slot {
    std::atomic<bool> ready{false};
    ListenAddr addr;
  };

  static void* Main(void* self);
  void Run();
  // The ports kept, without repeats.
  std::vector<ListenAddr> Listeners() const;

  const Logger* const logger_;
  const ListenWatchTiming timing_;
  void (*const thread_start_)();
  std::atomic<bool> accepted_{false};
  std::atomic<int> state_{kIdle};
  std::atomic<int> listeners_{0};  // slots claimed
  Slot slots_[kMaxListeners];
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_BYPASS_WATCH_H_
