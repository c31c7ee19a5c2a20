// The fixture of the Governor tests (tests/runtime/governor_*_test.cc,
// zone_garbage_test.cc): a zone, an fd table, a listener on 127.0.0.1 and a
// clock of the test's own; the test plays the interposers.
//
// The Governor is driven: it reads the fixture's FakeClock
// (tests/base/fake_clock.h) and runs no watcher thread (WatcherTiming::
// run_thread = false), so time moves only when the test moves it, and what
// the watcher would do the test does by calling that duty itself
// (ApplyChangedShares, ExpireIdle, TickBudget, CheckZone ...), then asserts
// its outcome. Only waits for the kernel (a queue emptying, bytes reaching a
// client) poll, bounded. StartLiveGovernor gives the real clock and the
// watcher thread instead, for the tests of the two together
// (governor_live_test.cc).
//
// Without a thread, the process slot is claimed by the thread of the
// Governor's first governed call (the test's main thread, in practice), and
// that thread holds the slot's liveness mutex (a robust mutex in the zone)
// until the Governor is destroyed or StopWatcher. Meanwhile that thread
// must not take the lock of another zone mapping (a ZoneLock on another
// Zone): glibc links a thread's held robust mutexes through the mutexes
// themselves, and HeldMutex refuses links that leave the mapping.

#ifndef TRAFFICRATE_TESTS_RUNTIME_GOVERNOR_FIXTURE_H_
#define TRAFFICRATE_TESTS_RUNTIME_GOVERNOR_FIXTURE_H_

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/config/config.h"
#include "src/config/rules.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/base/fake_clock.h"
#include "tests/shm/zone_fixture.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace testing_util {

// --- The Governor tests.

inline constexpr int64_t kLongIdleNs = 3600 * kNsPerSec;
inline constexpr int kTableSize = 4096;

// A new socket's SO_MAX_PACING_RATE: not paced.
inline constexpr uint64_t kNotPaced = ~uint64_t{0};

// Bytes still in the socket's send queue (SIOCOUTQ), or -1.
inline int Outq(int fd) {
  int queued = -1;
  if (ioctl(fd, SIOCOUTQ, &queued) != 0) return -1;
  return queued;
}

// The socket's SO_MAX_PACING_RATE, or 0 if it cannot be read.
inline uint64_t Pacing(int fd) {
  uint64_t rate = 0;
  socklen_t len = sizeof(rate);
  if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len) != 0) {
    return 0;
  }
  return len == sizeof(uint32_t) ? static_cast<uint32_t>(rate) : rate;
}

inline sockaddr_in Inet(const char* address, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, address, &addr.sin_addr);
  return addr;
}

// One accepted connection: the server end is governed, the client end is
// ours to read from.
struct Conn {
  int client = -1;
  int server = -1;
};

// Waits for the kernel (bounded): true once fd's send queue is empty, every
// byte sent and acknowledged.
inline bool QueueEmpties(int fd) {
  return PollUntil([&] { return Outq(fd) == 0; });
}

// A client connection to `listener` (any 127.x address `from`), accepted
// with plain ::accept4 and told to no Governor. {-1, -1} on failure.
inline Conn AcceptUntold(int listener, const char* from) {
  sockaddr_in server{};
  socklen_t len = sizeof(server);
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&server), &len) != 0) {
    return Conn{};
  }
  Conn conn;
  conn.client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local = Inet(from, 0);
  if (conn.client < 0 ||
      bind(conn.client, reinterpret_cast<sockaddr*>(&local), sizeof(local)) !=
          0 ||
      connect(conn.client, reinterpret_cast<sockaddr*>(&server),
              sizeof(server)) != 0) {
    if (conn.client >= 0) close(conn.client);
    return Conn{};
  }
  conn.server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  return conn;
}

// Options with TRAFFICRATE_PORTS (`ports`) and TRAFFICRATE_EXEMPT
// (`exempt`, as the variable spells it), and a long idle time.
inline GovernorOptions RuleOptions(const std::vector<PortRange>& ports,
                                   const char* exempt = nullptr) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  std::vector<Cidr> cidrs;
  if (exempt != nullptr) cidrs = ParseExempt(exempt).value();
  options.rules = AcceptRules::Make(ports, cidrs).value();
  return options;
}

// Fixture of the Governor tests: a zone, an fd table, a listener on
// 127.0.0.1 and the clock; StartGovernor() makes the Governor, driven (see
// the top of this file).
class GovernorFixture : public ZoneNameFixture {
 protected:
  void SetUp() override {
    ZoneNameFixture::SetUp();
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(zone_name_, uint64_t{1} << 20, kRate);
    ASSERT_TRUE(zone.ok()) << zone.status();
    zone_ = std::move(*zone);
    table_.reset(FdTable::Create(kTableSize));
    ASSERT_NE(table_, nullptr);
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listener_, 0);
    sockaddr_in addr = Inet("127.0.0.1", 0);
    ASSERT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0);
    ASSERT_EQ(listen(listener_, 128), 0);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len),
              0);
    port_ = ntohs(addr.sin_port);
  }

  void TearDown() override {
    for (Conn& conn : conns_) Close(conn);
    gov_.reset();
    table_.reset();
    zone_.reset();
    if (listener_ >= 0) close(listener_);
    ZoneNameFixture::TearDown();
  }

  // `options` for a Governor the test drives: the fixture's clock, no
  // watcher thread. For any Governor a test makes besides gov_.
  GovernorOptions Driven(GovernorOptions options) const {
    options.clock = &clock_;
    options.run_thread = false;
    return options;
  }
  void StartGovernor(int64_t idle_ns = kLongIdleNs,
                     KeyMode mode = KeyMode::kPeer) {
    GovernorOptions options;
    options.idle_ns = idle_ns;
    options.key.mode = mode;
    StartGovernor(options);
  }
  // With every option given: accept rules (TRAFFICRATE_PORTS,
  // TRAFFICRATE_EXEMPT), after_bytes (TRAFFICRATE_AFTER) and the rest. The
  // clock and run_thread are the fixture's (Driven).
  void StartGovernor(const GovernorOptions& options) {
    zone_->UseClock(&clock_);
    gov_ = std::make_unique<Governor>(zone_.get(), table_.get(), &logger_,
                                      Driven(options));
  }
  // The real clock and the watcher thread, as in the library: for the
  // tests of the Governor with its live watcher, which poll for what it
  // does.
  void StartLiveGovernor(GovernorOptions options) {
    options.clock = &MonotonicClock();
    options.run_thread = true;
    zone_->UseClock(&MonotonicClock());
    gov_ = std::make_unique<Governor>(zone_.get(), table_.get(), &logger_,
                                      options);
  }

  // The driven Governor's time, and moving it on.
  int64_t Now() const { return clock_.NowNs(); }
  void Advance(int64_t ns) { clock_.AdvanceNs(ns); }

  // Budget mode's watcher: TickBudget now, then at each time it asks for
  // (the clock moved there), until done() or limit_ns have passed on the
  // clock. Returns done(). For outcomes that take the budget's visits some
  // ticks, which this spares the test from counting.
  template <typename Done>
  bool TickBudgetUntil(Done done, int64_t limit_ns = 10 * kNsPerSec) {
    const int64_t end = Now() + limit_ns;
    for (int i = 0; i < 100'000; ++i) {
      const int64_t next = gov_->TickBudget(Now());
      if (done()) return true;
      if (next > end) break;
      if (next > Now()) clock_.SetNs(next);
    }
    return done();
  }

  // A thread that plays the watcher thread of the driven Governor: a pass of
  // its duties at the clock's time, over and over, until `stop` (for tests
  // of the host's threads racing the watcher's own use of their fds). Join
  // it before the Governor goes.
  std::thread PlayWatcher(const std::atomic<bool>& stop) {
    return std::thread([this, &stop] {
      while (!stop.load()) {
        const int64_t now = Now();
        if (!gov_->CheckZone(now)) break;
        if (gov_->BudgetWanted()) {
          gov_->TickBudget(now);
        } else {
          gov_->FinishDrains(now);
        }
        gov_->ApplyChangedShares();
        gov_->ExpireIdle(now);
        gov_->ReapDead();
      }
    });
  }

  // Connects from `from` (any 127.x address), accepts with plain ::accept and
  // tells the Governor. client_rcvbuf > 0 shrinks the client's receive
  // buffer; client_mss > 0 makes the server send segments of that size, as
  // on a 1500-byte path (this loopback's MTU is 64 KiB, and the kernel
  // sends a connection's first 10 segments unpaced). Returns {-1, -1} on
  // failure. Thread-safe.
  Conn Connect(const char* from = "127.0.0.1", int client_rcvbuf = 0,
               int client_mss = 0) const {
    Conn conn;
    conn.client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn.client < 0) return Conn{};
    if (client_rcvbuf > 0) {
      setsockopt(conn.client, SOL_SOCKET, SO_RCVBUF, &client_rcvbuf,
                 sizeof(client_rcvbuf));
    }
    if (client_mss > 0) {
      setsockopt(conn.client, IPPROTO_TCP, TCP_MAXSEG, &client_mss,
                 sizeof(client_mss));
    }
    sockaddr_in local = Inet(from, 0);
    sockaddr_in server = Inet("127.0.0.1", port_);
    if (bind(conn.client, reinterpret_cast<sockaddr*>(&local), sizeof(local)) !=
            0 ||
        connect(conn.client, reinterpret_cast<sockaddr*>(&server),
                sizeof(server)) != 0) {
      close(conn.client);
      return Conn{};
    }
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    conn.server =
        ::accept(listener_, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    if (conn.server < 0) {
      close(conn.client);
      return Conn{};
    }
    gov_->OnAccept(conn.server, reinterpret_cast<sockaddr*>(&peer), peer_len);
    return conn;
  }

  // Connects and keeps the connection for TearDown.
  Conn Open(const char* from = "127.0.0.1", int client_rcvbuf = 0,
            int client_mss = 0) {
    Conn conn = Connect(from, client_rcvbuf, client_mss);
    EXPECT_GE(conn.server, 0) << "cannot connect from " << from;
    conns_.push_back(conn);
    return conn;
  }

  // Closes the server end the way the close interposer does, then the client.
  void Close(Conn& conn) {
    if (conn.server >= 0) {
      gov_->OnClose(conn.server);
      close(conn.server);
    }
    if (conn.client >= 0) close(conn.client);
    conn = Conn{};
  }
  // The server end only, as the close interposer does; the client stays.
  void CloseServer(int server_fd) {
    gov_->OnClose(server_fd);
    close(server_fd);
    for (Conn& conn : conns_) {
      if (conn.server == server_fd) conn.server = -1;
    }
  }
  void CloseKept(int server_fd) {
    for (Conn& conn : conns_) {
      if (conn.server == server_fd) Close(conn);
    }
  }

  // BeforeSend + ::send + AfterSend, as the send interposer does.
  ssize_t Send(int fd, size_t bytes = 100) {
    std::vector<char> data(bytes, 'd');
    gov_->BeforeSend(fd);
    const ssize_t sent =
        ::send(fd, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    gov_->AfterSend(fd, sent);
    return sent;
  }

  uint32_t ConnIndex(int fd) const {
    const uint64_t state = table_->Get(fd)->state.load();
    return state == 0 ? kNoSlot : FdState::From(state).conn();
  }
  const ConnSlotShm& ConnOf(int fd) const {
    return zone_->conns().slot(ConnIndex(fd));
  }
  uint32_t KeyIndex(int fd) const {
    const uint32_t conn = ConnIndex(fd);
    return conn == kNoSlot ? kNoSlot
                           : zone_->conns().slot(conn).key_index.load();
  }
  uint32_t Active(int fd) const {
    const uint32_t k = KeyIndex(fd);
    return k == kNoSlot ? 0 : zone_->keys().slot(k).active.load();
  }
  uint32_t Refs(int fd) const {
    const uint32_t k = KeyIndex(fd);
    if (k == kNoSlot) return 0;
    ZoneLock lock(*zone_);
    return zone_->keys().slot(k).refs.load();
  }
  uint32_t ConnsUsed() const {
    ZoneLock lock(*zone_);
    return zone_->header().conns_used;
  }
  uint32_t KeysUsed() const {
    ZoneLock lock(*zone_);
    return zone_->header().keys_used;
  }

  // First: it outlives every Governor that reads it.
  FakeClock clock_;
  Logger logger_;
  std::unique_ptr<Zone> zone_;
  std::unique_ptr<FdTable> table_;
  std::unique_ptr<Governor> gov_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::vector<Conn> conns_;
};

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_RUNTIME_GOVERNOR_FIXTURE_H_
