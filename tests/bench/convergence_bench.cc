// Convergence benchmark: the time from a join (or leave) in one process until
// every sibling socket of the same key in another process carries its new
// share, read back from the kernel with getsockopt(SO_MAX_PACING_RATE).
//
//   convergence_bench [--changes N] [--gap-ms G] [--siblings S] [--others O]
//
// A child process owns S accepted sockets of one key (its own Governor and
// watcher thread) and a monitor thread that polls their pacing. The parent,
// N times, accepts a connection of the same key and sends on it (a join), then
// closes it (a leave); for each change it records the clock before the call
// and the monitor records when the last sibling showed the new share.
// --gap-ms spaces the changes (0: back to back, the worst case for the
// watcher's coalescing). Prints median, 99th percentile and maximum. Both
// sides poll every 10 us, which bounds the resolution.
//
// --others O adds the scale: O more connections, each of its own key (client
// addresses from 127.1.0.1 up), joined and held over the whole run, spread
// evenly over the sibling process and kOtherProcs - 1 more processes (as over
// nginx's 4 workers), each with its own Governor and watcher. Their client
// ends are closed once accepted: a process here may hold 20 000 fds.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/budget/share.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"

namespace trafficrate {
namespace {

constexpr uint64_t kRate = 100'000'000;
constexpr int64_t kChangeTimeoutNs = 2 * kNsPerSec;
// Both sides poll with short sleeps rather than spin, so that on a 2-core
// machine the watcher threads being measured get a core.
constexpr int64_t kPollNs = 10'000;
constexpr int kOtherProcs = 4;

// Shared between parent and child (MAP_SHARED | MAP_ANONYMOUS).
struct Channel {
  std::atomic<uint32_t> seq;       // parent: a new change was made
  std::atomic<uint32_t> ack;       // child: all siblings show it
  std::atomic<uint64_t> expected;  // the share siblings must show
  std::atomic<int64_t> start_ns;   // parent: clock before the change
  std::atomic<int64_t> done_ns;    // child: clock when converged
  std::atomic<uint32_t> ready;
  std::atomic<uint32_t> others_ready;  // processes holding their others
  std::atomic<uint32_t> stop;
};

uint64_t PacingOf(int fd) {
  uint64_t rate = 0;
  socklen_t len = sizeof(rate);
  if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len) != 0) {
    return 0;
  }
  return rate;
}

int Listen(sockaddr_in* addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  *addr = sockaddr_in{};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(addr), len) != 0 ||
      listen(fd, 1024) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    std::perror("listen");
    std::exit(1);
  }
  return fd;
}

// Connects a client and accepts it; registers the server side with gov.
int AcceptOne(int listener, const sockaddr_in& addr, Governor& gov,
              std::vector<int>* clients) {
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(client, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    std::perror("connect");
    std::exit(1);
  }
  clients->push_back(client);
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  const int fd = accept(listener, reinterpret_cast<sockaddr*>(&peer), &len);
  if (fd < 0) {
    std::perror("accept");
    std::exit(1);
  }
  gov.OnAccept(fd, reinterpret_cast<sockaddr*>(&peer), len);
  return fd;
}

// The n-th usable address from 127.1.0.1 (x.y.z.0 and x.y.z.255 left out).
in_addr_t OtherSource(int n) {
  return htonl((127u << 24) + (1u << 16) + (n / 254) * 256 + 1 + n % 254);
}

// Others number first .. first + count - 1: each connected from its own
// address, accepted, registered and joined; the client end closed.
void HoldOthers(int listener, const sockaddr_in& addr, Governor& gov, int first,
                int count) {
  for (int i = first; i < first + count; ++i) {
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = OtherSource(i);
    if (client < 0 ||
        bind(client, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
        connect(client, reinterpret_cast<const sockaddr*>(&addr),
                sizeof(addr)) != 0) {
      std::perror("other connection");
      std::exit(1);
    }
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    const int fd = accept(listener, reinterpret_cast<sockaddr*>(&peer), &len);
    if (fd < 0) {
      std::perror("accept");
      std::exit(1);
    }
    close(client);
    gov.OnAccept(fd, reinterpret_cast<sockaddr*>(&peer), len);
    gov.BeforeSend(fd);  // a join of its own key
  }
}

GovernorOptions BenchOptions() {
  GovernorOptions options;
  options.idle_ns = 60 * kNsPerSec;  // never idle during the run
  return options;
}

// One of the kOtherProcs - 1 processes that only hold others.
[[noreturn]] void RunOthers(Zone& zone, int first, int count, Channel* ch) {
  static Logger logger;
  FdTable* table = FdTable::Create(65536);
  Governor gov(&zone, table, &logger, BenchOptions());
  sockaddr_in addr{};
  const int listener = Listen(&addr);
  HoldOthers(listener, addr, gov, first, count);
  ch->others_ready.fetch_add(1);
  while (!ch->stop.load()) SleepNs(kNsPerMs);
  gov.StopWatcher();
  _exit(0);
}

void RunChild(Zone& zone, int listener, const sockaddr_in& addr, int siblings,
              int others, Channel* ch) {
  static Logger logger;
  FdTable* table = FdTable::Create(65536);
  Governor gov(&zone, table, &logger, BenchOptions());
  HoldOthers(listener, addr, gov, 0, others);
  std::vector<int> clients;
  std::vector<int> fds;
  for (int i = 0; i < siblings; ++i) {
    fds.push_back(AcceptOne(listener, addr, gov, &clients));
    gov.BeforeSend(fds.back());  // join
  }
  ch->ready.store(1);
  uint32_t handled = 0;
  while (!ch->stop.load()) {
    const uint32_t seq = ch->seq.load(std::memory_order_acquire);
    if (seq == handled) {
      SleepNs(kPollNs);
      continue;
    }
    const uint64_t want = ch->expected.load();
    const int64_t deadline = MonotonicNowNs() + kChangeTimeoutNs;
    bool all = false;
    while (!all && MonotonicNowNs() < deadline) {
      all = true;
      for (int fd : fds) all = all && PacingOf(fd) == want;
      if (!all) SleepNs(kPollNs);
    }
    ch->done_ns.store(all ? MonotonicNowNs() : -1);
    handled = seq;
    ch->ack.store(seq, std::memory_order_release);
  }
  gov.StopWatcher();
  _exit(0);
}

void Report(const char* what, std::vector<int64_t> samples_ns) {
  if (samples_ns.empty()) return;
  std::sort(samples_ns.begin(), samples_ns.end());
  const auto at = [&](double q) {
    size_t i = static_cast<size_t>(q * (samples_ns.size() - 1) + 0.5);
    return samples_ns[i] / 1000.0;
  };
  std::printf("%-6s n=%zu  median %.0f us  p99 %.0f us  max %.0f us\n", what,
              samples_ns.size(), at(0.5), at(0.99), samples_ns.back() / 1000.0);
}

int Main(int argc, char** argv) {
  int changes = 1000;
  int gap_ms = 0;
  int siblings = 4;
  int others = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--changes") changes = value;
    if (flag == "--gap-ms") gap_ms = value;
    if (flag == "--siblings") siblings = value;
    if (flag == "--others") others = std::max(0, value);
  }
  prctl(PR_SET_TIMERSLACK, 1UL);  // 10 us polls, not 60 us (inherited)
  const std::string name = "bench-conv-" + std::to_string(getpid());
  // Room for every key and connection (a slot of each per entry, about
  // 270 bytes with the process table's part), twice over.
  const uint64_t zone_bytes =
      std::max<uint64_t>(1 << 20, 2 * 300 * uint64_t(others + siblings + 16));
  auto zone = Zone::OpenOrCreate(name, zone_bytes, kRate);
  if (!zone.ok()) {
    std::fprintf(stderr, "%s\n", zone.status().ToString().c_str());
    return 1;
  }
  sockaddr_in addr{};
  const int listener = Listen(&addr);
  auto* ch = static_cast<Channel*>(mmap(nullptr, sizeof(Channel),
                                        PROT_READ | PROT_WRITE,
                                        MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  // Others: a share to the sibling process, the rest to the holders.
  const int per_proc = (others + kOtherProcs - 1) / kOtherProcs;
  const int child_others = std::min(others, per_proc);
  std::vector<pid_t> holders;
  for (int first = child_others; first < others; first += per_proc) {
    const pid_t pid = fork();
    if (pid == 0) {
      RunOthers(**zone, first, std::min(per_proc, others - first), ch);
    }
    holders.push_back(pid);
  }
  const pid_t child = fork();
  if (child == 0) RunChild(**zone, listener, addr, siblings, child_others, ch);
  const int64_t ready_deadline =
      MonotonicNowNs() + (10 + others / 1000) * kNsPerSec;
  while ((!ch->ready.load() ||
          ch->others_ready.load() != static_cast<uint32_t>(holders.size())) &&
         MonotonicNowNs() < ready_deadline) {
    SleepNs(kNsPerMs);
  }
  static Logger logger;
  FdTable* table = FdTable::Create(65536);
  GovernorOptions options;
  options.idle_ns = 60 * kNsPerSec;
  Governor gov(zone->get(), table, &logger, options);
  std::vector<int64_t> joins, leaves;
  int failures = 0;
  std::vector<int> clients;
  const bool ready =
      ch->ready.load() &&
      ch->others_ready.load() == static_cast<uint32_t>(holders.size());
  for (int i = 0; i < changes && ready; ++i) {
    const bool join = i % 2 == 0;
    static int fd = -1;
    if (join) fd = AcceptOne(listener, addr, gov, &clients);
    ch->expected.store(ShareBytesPerSec(kRate, siblings + (join ? 1 : 0)));
    const int64_t start = MonotonicNowNs();
    ch->start_ns.store(start);
    const uint32_t seq = ch->seq.fetch_add(1) + 1;
    if (join) {
      gov.BeforeSend(fd);
    } else {
      gov.OnClose(fd);
      close(fd);
      close(clients.back());
      clients.pop_back();
    }
    const int64_t deadline = MonotonicNowNs() + 2 * kChangeTimeoutNs;
    while (ch->ack.load(std::memory_order_acquire) != seq &&
           MonotonicNowNs() < deadline) {
      SleepNs(kPollNs);
    }
    const int64_t done = ch->done_ns.load();
    if (ch->ack.load() != seq || done < 0) {
      ++failures;
    } else {
      (join ? joins : leaves).push_back(done - start);
    }
    SleepNs(int64_t{gap_ms} * kNsPerMs);
  }
  ch->stop.store(1);
  int status = 0;
  waitpid(child, &status, 0);
  for (pid_t pid : holders) waitpid(pid, &status, 0);
  gov.StopWatcher();
  (void)ZoneSegment::Unlink(name);
  std::printf(
      "convergence: %d changes, %d siblings in another process, gap "
      "%d ms, %d others in %zu processes, %d failed\n",
      changes, siblings, gap_ms, others, holders.size() + (others > 0),
      failures);
  if (!ready) std::printf("not ready: the connections were not all held\n");
  Report("join", joins);
  Report("leave", leaves);
  std::vector<int64_t> all = joins;
  all.insert(all.end(), leaves.begin(), leaves.end());
  Report("all", all);
  return failures == 0 && ready ? 0 : 1;
}

}  // namespace
}  // namespace trafficrate

int main(int argc, char** argv) { return trafficrate::Main(argc, argv); }
