// Helpers shared by the zone, fd table and governor tests: unique zone names,
// bounded polling, forked children that report through their exit status,
// sanitizer detection, and the fixtures of the zone tests (zone_test.cc,
// zone_recovery_test.cc) and of the Governor tests (governor_test.cc,
// governor_fork_test.cc), each suite split over two files.

#ifndef TRAFFICRATE_TESTS_TEST_UTIL_H_
#define TRAFFICRATE_TESTS_TEST_UTIL_H_

#include <arpa/inet.h>
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/clock.h"
#include "src/config.h"
#include "src/fd_table.h"
#include "src/governor.h"
#include "src/log.h"
#include "src/zone.h"
#include "src/zone_layout.h"

#if defined(__SANITIZE_THREAD__)
#define TRAFFICRATE_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRAFFICRATE_TEST_TSAN 1
#endif
#endif
#ifndef TRAFFICRATE_TEST_TSAN
#define TRAFFICRATE_TEST_TSAN 0
#endif

namespace trafficrate {
namespace testing_util {

inline constexpr bool kUnderTsan = TRAFFICRATE_TEST_TSAN != 0;
// Every wait for another thread or process gives up after this long.
inline constexpr int64_t kWaitNs = 5 * kNsPerSec;

// "ut<pid>_<suite>_<test>": unique per process and test, valid as a zone name.
inline std::string UniqueZoneName(absl::string_view suffix = "") {
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = absl::StrCat("ut", getpid(), "_", info->test_suite_name(),
                                  "_", info->name(), suffix);
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return name;
}

// Polls `done` every millisecond until it returns true or timeout_ns passed.
// Returns its last result.
template <typename Predicate>
bool PollUntil(Predicate done, int64_t timeout_ns = kWaitNs) {
  const int64_t deadline = MonotonicNowNs() + timeout_ns;
  for (int i = 0; i < 1'000'000; ++i) {
    if (done()) return true;
    if (MonotonicNowNs() >= deadline) break;
    SleepNs(kNsPerMs);
  }
  return done();
}

// Waits (bounded) until the send-stamp clock (CoarseMonotonicNowNs, a kernel
// tick's precision) has moved past `stamp`.
inline bool WaitForCoarseTick(int64_t stamp) {
  return PollUntil([&] { return CoarseMonotonicNowNs() > stamp; });
}

// Waits (bounded) for a child; returns its wait status, or -1 if it did not
// end in time (it is then killed and reaped).
inline int WaitChild(pid_t pid, int64_t timeout_ns = 4 * kWaitNs) {
  int status = 0;
  pid_t got = 0;
  PollUntil(
      [&] {
        got = waitpid(pid, &status, WNOHANG);
        return got != 0;
      },
      timeout_ns);
  if (got == pid) return status;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

inline bool ExitedWith(int status, int code) {
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

// Reads one byte from fd, waiting at most timeout_ns. False on timeout/EOF.
inline bool ReadByte(int fd, int64_t timeout_ns = 4 * kWaitNs) {
  const int64_t deadline = MonotonicNowNs() + timeout_ns;
  for (int i = 0; i < 10'000; ++i) {
    const int64_t left = deadline - MonotonicNowNs();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(left / kNsPerMs) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    char c;
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    return n == 1;
  }
  return false;
}

inline bool WriteByte(int fd) {
  const char c = 'x';
  for (int i = 0; i < 100; ++i) {
    const ssize_t n = send(fd, &c, 1, MSG_NOSIGNAL);
    if (n == 1) return true;
    if (n < 0 && errno != EINTR) return false;
  }
  return false;
}

// A one-way channel (a socket pair, so that writing to a reader that died
// fails with EPIPE instead of raising SIGPIPE) whose ends close on
// destruction.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~Pipe() {
    CloseRead();
    CloseWrite();
  }
  int read_end() const { return fds[0]; }
  int write_end() const { return fds[1]; }
  void CloseRead() {
    if (fds[0] >= 0) close(fds[0]);
    fds[0] = -1;
  }
  void CloseWrite() {
    if (fds[1] >= 0) close(fds[1]);
    fds[1] = -1;
  }
};

// In a forked child: exit with the line number (mod 250, never 0) of the
// first failed check, so the parent can tell which one failed.
#define TRAFFICRATE_CHILD_CHECK(cond)       \
  do {                                      \
    if (!(cond)) _exit(__LINE__ % 250 + 1); \
  } while (0)

// Unlocks a robust mutex the calling thread holds when the scope ends. A
// thread must never keep a robust mutex locked in memory that is unmapped:
// glibc links held robust mutexes into a per-thread list through the mutexes
// themselves.
class MutexReleaser {
 public:
  explicit MutexReleaser(pthread_mutex_t* mutex) : mutex_(mutex) {}
  ~MutexReleaser() {
    if (mutex_ != nullptr) pthread_mutex_unlock(mutex_);
  }
  MutexReleaser(const MutexReleaser&) = delete;
  MutexReleaser& operator=(const MutexReleaser&) = delete;

 private:
  pthread_mutex_t* mutex_;
};

// Base fixture for tests of a shm zone: a unique name, unlinked in TearDown.
class ZoneNameFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    zone_name_ = UniqueZoneName();
    (void)Zone::Unlink(zone_name_);  // a leftover of a crashed run
  }
  void TearDown() override { (void)Zone::Unlink(zone_name_); }

  std::string zone_name_;
};

// --- The zone tests (zone_test.cc, zone_recovery_test.cc).

inline constexpr uint64_t kOneMiB = uint64_t{1} << 20;
inline constexpr uint64_t kRate = 1'000'000;  // bytes/s

// Distinct 20-byte keys: n in the first four bytes, tag in the fifth.
struct TestKey {
  uint8_t bytes[kKeyBytes] = {};
};
inline TestKey MakeKey(uint32_t n, uint8_t tag = 0) {
  TestKey k;
  std::memcpy(k.bytes, &n, sizeof(n));
  k.bytes[4] = tag;
  k.bytes[19] = 0x5a;
  return k;
}

inline constexpr uint8_t kPeer[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                      0, 0, 0xff, 0xff, 127, 0, 0, 1};

// Fixture of the zone tests (zone_test.cc, zone_recovery_test.cc): a zone of
// its own, opened on demand.
class ZoneFixture : public ZoneNameFixture {
 protected:
  std::unique_ptr<Zone> Open(uint64_t size = kOneMiB, uint64_t rate = kRate) {
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(zone_name_, size, rate);
    EXPECT_TRUE(zone.ok()) << zone.status();
    return zone.ok() ? std::move(*zone) : nullptr;
  }

  // Claims a process slot for this process (its liveness mutex is then held
  // by the calling thread); kNoSlot if none is free.
  static uint32_t ClaimProc(Zone& zone) {
    ZoneLock lock(zone);
    return lock.ok() ? zone.ClaimProcLocked(getpid(), 1) : kNoSlot;
  }

  // Registers a connection for key n, owned by proc; returns its slot.
  static uint32_t RegisterLocked(Zone& zone, uint32_t n, uint32_t proc,
                                 int fd = 7) {
    const TestKey key = MakeKey(n);
    const uint32_t k = zone.FindOrInsertKeyLocked(key.bytes, 1);
    if (k == kNoSlot) return kNoSlot;
    const uint32_t c = zone.RegisterConnLocked(k, proc, fd, kPeer, 4242);
    if (c == kNoSlot) zone.ReleaseKeyIfUnusedLocked(k);
    return c;
  }
};

// --- The Governor tests (governor_test.cc, governor_fork_test.cc).

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

// Fixture of the Governor tests: a zone, an fd table and a listener on
// 127.0.0.1; StartGovernor() makes the Governor. The test plays the
// interposers (see governor_test.cc).
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

  void StartGovernor(int64_t idle_ns = kLongIdleNs,
                     KeyMode mode = KeyMode::kPeer) {
    GovernorOptions options;
    options.idle_ns = idle_ns;
    options.key.mode = mode;
    StartGovernor(options);
  }
  // With every option given: accept rules (TRAFFICRATE_PORTS,
  // TRAFFICRATE_EXEMPT), after_bytes (TRAFFICRATE_AFTER) and the rest.
  void StartGovernor(const GovernorOptions& options) {
    gov_ = std::make_unique<Governor>(zone_.get(), table_.get(), &logger_,
                                      options);
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
    return state == 0 ? kNoSlot : StateConn(state);
  }
  const ConnSlotShm& ConnOf(int fd) const { return zone_->conn(ConnIndex(fd)); }
  uint32_t KeyIndex(int fd) const {
    const uint32_t conn = ConnIndex(fd);
    return conn == kNoSlot ? kNoSlot : zone_->conn(conn).key_index.load();
  }
  uint32_t Active(int fd) const {
    const uint32_t k = KeyIndex(fd);
    return k == kNoSlot ? 0 : zone_->key(k).active.load();
  }
  uint32_t Refs(int fd) const {
    const uint32_t k = KeyIndex(fd);
    if (k == kNoSlot) return 0;
    ZoneLock lock(*zone_);
    return zone_->key(k).refs.load();
  }
  uint32_t ConnsUsed() const {
    ZoneLock lock(*zone_);
    return zone_->header().conns_used;
  }
  uint32_t KeysUsed() const {
    ZoneLock lock(*zone_);
    return zone_->header().keys_used;
  }
  bool PacingBecomes(int fd, uint64_t rate) const {
    return PollUntil([&] { return Pacing(fd) == rate; });
  }

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

#endif  // TRAFFICRATE_TESTS_TEST_UTIL_H_
