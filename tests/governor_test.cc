// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD: the test plays the interposers, calling OnAccept after
// ::accept, BeforeSend/AfterSend around ::send and OnClose before ::close,
// and reads back the pacing with getsockopt(SO_MAX_PACING_RATE).

#include "src/governor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/clock.h"
#include "src/config.h"
#include "src/fd_table.h"
#include "src/log.h"
#include "src/zone.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::kUnderTsan;
using testing_util::Pipe;
using testing_util::PollUntil;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

constexpr uint64_t kRate = 1'000'000;         // bytes/s
constexpr uint64_t kNotPaced = ~uint64_t{0};  // a new socket's pacing
constexpr int64_t kLongIdleNs = 3600 * kNsPerSec;
constexpr int kTableSize = 4096;

uint64_t Pacing(int fd) {
  uint64_t rate = 0;
  socklen_t len = sizeof(rate);
  if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len) != 0) {
    return 0;
  }
  return len == sizeof(uint32_t) ? static_cast<uint32_t>(rate) : rate;
}

int Outq(int fd) {
  int queued = -1;
  if (ioctl(fd, SIOCOUTQ, &queued) != 0) return -1;
  return queued;
}

sockaddr_in Inet(const char* address, uint16_t port) {
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

class GovernorTest : public testing_util::ZoneNameFixture {
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
    gov_ = std::make_unique<Governor>(zone_.get(), table_.get(), &logger_,
                                      options);
  }

  // Connects from `from` (any 127.x address), accepts with plain ::accept and
  // tells the Governor. client_rcvbuf > 0 shrinks the client's receive
  // buffer. Returns {-1, -1} on failure. Thread-safe.
  Conn Connect(const char* from = "127.0.0.1", int client_rcvbuf = 0) const {
    Conn conn;
    conn.client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn.client < 0) return Conn{};
    if (client_rcvbuf > 0) {
      setsockopt(conn.client, SOL_SOCKET, SO_RCVBUF, &client_rcvbuf,
                 sizeof(client_rcvbuf));
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
  Conn Open(const char* from = "127.0.0.1", int client_rcvbuf = 0) {
    Conn conn = Connect(from, client_rcvbuf);
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
    return zone_->key(k).refs;
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

TEST_F(GovernorTest, AcceptedSocketRegistersWithoutJoining) {
  StartGovernor();
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  ASSERT_NE(ConnIndex(c.server), kNoSlot);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 0u);
  const ConnSlotShm& slot = ConnOf(c.server);
  EXPECT_EQ(slot.active.load(), 0u);
  EXPECT_EQ(slot.fd.load(), c.server);
  EXPECT_NE(gov_->proc_index(), kNoSlot);
  EXPECT_EQ(slot.proc_index.load(), gov_->proc_index());
  EXPECT_EQ(zone_->proc(gov_->proc_index()).pid.load(), getpid());
  const uint8_t mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                              0, 0, 0xff, 0xff, 127, 0, 0, 2};
  EXPECT_EQ(std::memcmp(slot.peer, mapped, 16), 0);
  sockaddr_in client{};
  socklen_t len = sizeof(client);
  ASSERT_EQ(getsockname(c.client, reinterpret_cast<sockaddr*>(&client), &len),
            0);
  EXPECT_EQ(slot.peer_port, ntohs(client.sin_port));
  EXPECT_EQ(table_->high_water(), c.server + 1);
  EXPECT_EQ(Pacing(c.server), kNotPaced) << "nothing applied before a send";
}

TEST_F(GovernorTest, AcceptWithoutPeerAddressAsksTheKernel) {
  StartGovernor();
  const Conn c = Open("127.0.0.3");
  ASSERT_GE(c.server, 0);
  // Replay the accept as if the host passed no address buffer.
  gov_->OnClose(c.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  gov_->OnAccept(c.server, nullptr, 0);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(ConnOf(c.server).peer[15], 3);
}

TEST_F(GovernorTest, NonInetSocketsAreNotGoverned) {
  StartGovernor();
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  gov_->OnAccept(pair[0], nullptr, 0);
  EXPECT_EQ(table_->Get(pair[0])->state.load(), 0u);
  const int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  gov_->OnAccept(udp, nullptr, 0);
  EXPECT_EQ(table_->Get(udp)->state.load(), 0u);
  gov_->BeforeSend(pair[0]);
  EXPECT_EQ(ConnsUsed(), 0u);
  close(udp);
  close(pair[0]);
  close(pair[1]);
}

TEST_F(GovernorTest, FirstSendJoinsAndAppliesTheWholeRate) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t generation = zone_->key(KeyIndex(c.server)).generation.load();
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_NE(zone_->key(KeyIndex(c.server)).generation.load(), generation);
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(ConnOf(c.server).share_bytes_per_sec.load(), kRate);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1000u);
  // Further sends change nothing but the byte count.
  EXPECT_EQ(Send(c.server, 500), 500);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1500u);
}

TEST_F(GovernorTest, SecondConnectionFromTheSameAddressHalvesBoth) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(Pacing(c1.server), kRate);
  gov_->BeforeSend(c2.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(KeyIndex(c1.server), KeyIndex(c2.server));
  EXPECT_EQ(Refs(c1.server), 2u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c2.server), kRate / 2) << "applied by the joiner";
  // c1 sends nothing more: the watcher pushes its new share.
  EXPECT_TRUE(PacingBecomes(c1.server, kRate / 2)) << Pacing(c1.server);
  EXPECT_EQ(ConnOf(c1.server).share_bytes_per_sec.load(), kRate / 2);
}

TEST_F(GovernorTest, DifferentClientAddressesGetSeparateKeys) {
  StartGovernor();
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 2u);
  EXPECT_NE(KeyIndex(a.server), KeyIndex(b.server));
  EXPECT_EQ(Active(a.server), 1u);
  EXPECT_EQ(Active(b.server), 1u);
  EXPECT_EQ(Pacing(a.server), kRate);
  EXPECT_EQ(Pacing(b.server), kRate);
  // A second connection from .2 halves .2 only.
  const Conn a2 = Open("127.0.0.2");
  gov_->BeforeSend(a2.server);
  EXPECT_EQ(Pacing(a2.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(a.server, kRate / 2));
  EXPECT_EQ(Pacing(b.server), kRate);
  EXPECT_EQ(KeysUsed(), 2u);
}

TEST_F(GovernorTest, KeyModeAllPutsEveryClientInOneKey) {
  StartGovernor(kLongIdleNs, KeyMode::kAll);
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(Active(a.server), 2u);
  EXPECT_EQ(Pacing(b.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(a.server, kRate / 2));
}

TEST_F(GovernorTest, ClosingOneConnectionGivesTheSiblingTheWholeRate) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
  const uint32_t key = KeyIndex(c1.server);
  CloseKept(c2.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->key(key).active.load(), 1u);
  EXPECT_EQ(Refs(c1.server), 1u);
  EXPECT_TRUE(PacingBecomes(c1.server, kRate)) << Pacing(c1.server);
  CloseKept(c1.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

TEST_F(GovernorTest, IdleConnectionLeavesAndRejoinsOnItsNextSend) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
  // Only c1 has been idle for idle_ns at this instant (nothing queued).
  const int64_t last1 = gov_->LastSendNs(c1.server);
  const int64_t last2 = gov_->LastSendNs(c2.server);
  ASSERT_LT(last1, last2);
  ASSERT_EQ(Outq(c1.server), 0);
  gov_->ExpireIdle(last1 + kLongIdleNs);
  EXPECT_EQ(ConnOf(c1.server).active.load(), 0u);
  EXPECT_EQ(ConnOf(c2.server).active.load(), 1u);
  EXPECT_EQ(Active(c1.server), 1u);
  EXPECT_EQ(Refs(c1.server), 2u) << "still registered";
  EXPECT_TRUE(PacingBecomes(c2.server, kRate)) << "the sender gets it all";
  // The next send rejoins.
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(ConnOf(c1.server).active.load(), 1u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c1.server), kRate / 2);
  EXPECT_TRUE(PacingBecomes(c2.server, kRate / 2));
}

TEST_F(GovernorTest, WatcherExpiresAnIdleConnection) {
  StartGovernor(/*idle_ns=*/50 * kNsPerMs);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Send(c.server, 100), 100);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  const uint32_t key = KeyIndex(c.server);
  // The client reads nothing, but 100 bytes fit its window: once they are
  // acknowledged the queue is empty and the watcher expires the connection.
  EXPECT_TRUE(PollUntil([&] { return zone_->key(key).active.load() == 0; }));
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Refs(c.server), 1u);
  gov_->BeforeSend(c.server);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_EQ(zone_->key(key).active.load(), 1u);
}

TEST_F(GovernorTest, ConnectionWithUnsentDataIsNotExpired) {
  StartGovernor();
  const Conn c = Open("127.0.0.1", /*client_rcvbuf=*/4096);
  ASSERT_GE(c.server, 0);
  const int sndbuf = 16384;
  ASSERT_EQ(
      setsockopt(c.server, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
  // The client does not read: fill its window and our send buffer.
  gov_->BeforeSend(c.server);
  std::vector<char> data(4096, 'q');
  for (int i = 0; i < 10'000; ++i) {
    const ssize_t n =
        ::send(c.server, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) break;
    gov_->AfterSend(c.server, n);
  }
  ASSERT_GT(Outq(c.server), 0);
  gov_->ExpireIdle(MonotonicNowNs() + 2 * kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u) << "expired with data queued";
  EXPECT_EQ(Active(c.server), 1u);
  // Once the client has read everything, the same check expires it.
  const bool drained = PollUntil([&] {
    char buf[65536];
    while (recv(c.client, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    return Outq(c.server) == 0;
  });
  ASSERT_TRUE(drained);
  gov_->ExpireIdle(MonotonicNowNs() + 2 * kLongIdleNs);
  EXPECT_EQ(ConnOf(c.server).active.load(), 0u);
  EXPECT_EQ(Active(c.server), 0u);
}

TEST_F(GovernorTest, DuplicatedFdCountsOnceUntilBothAreClosed) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const int dup_fd = dup(c.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(c.server, dup_fd);
  EXPECT_EQ(table_->Get(dup_fd)->state.load(),
            table_->Get(c.server)->state.load());
  gov_->BeforeSend(c.server);
  gov_->BeforeSend(dup_fd);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Pacing(dup_fd), kRate);
  const uint32_t key = KeyIndex(c.server);
  // Closing the original keeps the registration: the dup still holds it.
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->key(key).active.load(), 1u);
  gov_->BeforeSend(dup_fd);
  EXPECT_EQ(zone_->key(key).active.load(), 1u);
  // Closing the last one ends it.
  gov_->OnClose(dup_fd);
  close(dup_fd);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

// Idleness is a connection's, not an fd's: when a connection has two fds
// (dup, dup2 onto 0/1 as inetd-style servers do) and the host writes through
// only one of them, it must not leave its key (that would make the key's
// membership, and its siblings' shares, flap every idle period).
TEST_F(GovernorTest, ConnectionSendingThroughADupIsNotExpired) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  gov_->BeforeSend(c.server);
  const int64_t last_original = gov_->LastSendNs(c.server);
  const int dup_fd = dup(c.server);
  ASSERT_GE(dup_fd, 0);
  gov_->OnDup(c.server, dup_fd);
  // The clock must move on before the host writes through the dup only.
  for (int i = 0; i < 1000000 && MonotonicNowNs() <= last_original; ++i) {
  }
  gov_->BeforeSend(dup_fd);
  const int64_t last_dup = gov_->LastSendNs(dup_fd);
  ASSERT_LT(last_original, last_dup);
  EXPECT_EQ(gov_->LastSendNs(c.server), last_dup) << "idle is per connection";
  ASSERT_EQ(Outq(dup_fd), 0);
  // idle_ns after the original's last send, less after the dup's.
  gov_->ExpireIdle(last_original + kLongIdleNs);
  EXPECT_EQ(ConnOf(dup_fd).active.load(), 1u)
      << "a connection written through a dup was expired as idle";
  gov_->OnClose(dup_fd);
  close(dup_fd);
}

TEST_F(GovernorTest, ReusedFdNumberCarriesTheNewConnection) {
  StartGovernor();
  const Conn old_conn = Open("127.0.0.2");
  ASSERT_GE(old_conn.server, 0);
  gov_->BeforeSend(old_conn.server);
  const int fd = old_conn.server;
  const uint64_t old_state = table_->Get(fd)->state.load();
  CloseKept(fd);
  EXPECT_EQ(ConnsUsed(), 0u);
  const Conn fresh = Open("127.0.0.3");
  ASSERT_EQ(fresh.server, fd) << "the kernel reuses the lowest free fd";
  EXPECT_NE(table_->Get(fd)->state.load(), old_state);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(ConnOf(fd).peer[15], 3) << "the state is the new connection's";
  EXPECT_EQ(ConnOf(fd).active.load(), 0u);
  gov_->BeforeSend(fd);
  EXPECT_EQ(Active(fd), 1u);
  EXPECT_EQ(Pacing(fd), kRate);
}

TEST_F(GovernorTest, FdClosedBehindOurBackIsReleasedWhenItsNumberReturns) {
  StartGovernor();
  const Conn old_conn = Open("127.0.0.2");
  ASSERT_GE(old_conn.server, 0);
  gov_->BeforeSend(old_conn.server);
  const int fd = old_conn.server;
  // Closed without OnClose (e.g. a close the interposers did not see).
  close(fd);
  for (Conn& conn : conns_) {
    if (conn.server == fd) {
      conn.server = -1;
      close(conn.client);  // frees the number the next client socket takes
      conn.client = -1;
    }
  }
  EXPECT_EQ(ConnsUsed(), 1u);
  const Conn fresh = Open("127.0.0.3");
  ASSERT_EQ(fresh.server, fd);
  EXPECT_EQ(ConnsUsed(), 1u) << "the stale registration is released";
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(ConnOf(fd).peer[15], 3);
}

TEST_F(GovernorTest, RateChangeReachesSocketsThroughTheWatcher) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  const Conn other = Open("127.0.0.2");
  ASSERT_GE(other.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  gov_->BeforeSend(other.server);
  ASSERT_TRUE(PacingBecomes(c1.server, kRate / 2));
  zone_->SetRate(3 * kRate);
  EXPECT_TRUE(PacingBecomes(c1.server, 3 * kRate / 2)) << Pacing(c1.server);
  EXPECT_TRUE(PacingBecomes(c2.server, 3 * kRate / 2)) << Pacing(c2.server);
  EXPECT_TRUE(PacingBecomes(other.server, 3 * kRate)) << Pacing(other.server);
}

TEST_F(GovernorTest, FullZoneLeavesNewConnectionsUnpaced) {
  StartGovernor();
  // Fill the connection table behind the Governor's back.
  std::vector<uint32_t> fillers;
  {
    ZoneLock lock(*zone_);
    uint8_t key[kKeyBytes] = {9};
    const uint32_t k = zone_->FindOrInsertKeyLocked(key, 1);
    ASSERT_NE(k, kNoSlot);
    const uint8_t peer[16] = {};
    for (uint32_t i = 0; i < zone_->conn_capacity(); ++i) {
      const uint32_t c = zone_->RegisterConnLocked(k, 0, -1, peer, 0);
      ASSERT_NE(c, kNoSlot);
      fillers.push_back(c);
    }
  }
  const uint64_t full_before = zone_->header().table_full.load();
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(table_->Get(c.server)->state.load(), 0u) << "not governed";
  EXPECT_GT(zone_->header().table_full.load(), full_before);
  EXPECT_EQ(KeysUsed(), 1u) << "the new key was not left behind";
  EXPECT_EQ(Send(c.server), 100);
  EXPECT_EQ(Pacing(c.server), kNotPaced);
  // Room again: the next connection is governed.
  {
    ZoneLock lock(*zone_);
    for (const uint32_t conn : fillers) zone_->DeregisterConnLocked(conn);
  }
  const Conn next = Open("127.0.0.2");
  EXPECT_NE(table_->Get(next.server)->state.load(), 0u);
  gov_->BeforeSend(next.server);
  EXPECT_EQ(Pacing(next.server), kRate);
}

TEST_F(GovernorTest, ForkedChildThatSendsTakesOwnership) {
  if (kUnderTsan) {
    GTEST_SKIP() << "ThreadSanitizer does not support starting threads in a "
                    "child forked from a multithreaded process (the child's "
                    "watcher thread)";
  }
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  const uint32_t parent_proc = gov_->proc_index();
  ASSERT_NE(parent_proc, kNoSlot);
  Pipe ready;
  Pipe finish;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    finish.CloseWrite();
    gov_->AfterForkChild();
    char byte = 'c';
    gov_->BeforeSend(c.server);
    const ssize_t sent =
        ::send(c.server, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    gov_->AfterSend(c.server, sent);
    TRAFFICRATE_CHILD_CHECK(sent == 1);
    const uint32_t me = gov_->proc_index();
    TRAFFICRATE_CHILD_CHECK(me != kNoSlot && me != parent_proc);
    TRAFFICRATE_CHILD_CHECK(zone_->conn(conn).proc_index.load() == me);
    TRAFFICRATE_CHILD_CHECK(zone_->conn(conn).active.load() == 1);
    TRAFFICRATE_CHILD_CHECK(Pacing(c.server) == kRate);
    WriteByte(ready.write_end());
    TRAFFICRATE_CHILD_CHECK(ReadByte(finish.read_end()));
    gov_->OnClose(c.server);
    close(c.server);
    _exit(0);
  }
  finish.CloseRead();
  ready.CloseWrite();
  ASSERT_TRUE(ReadByte(ready.read_end())) << "child failed early";
  const uint32_t owner = zone_->conn(conn).proc_index.load();
  EXPECT_NE(owner, parent_proc);
  EXPECT_EQ(zone_->proc(owner).pid.load(), pid);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 1u) << "counted once, by the child";
  // The parent's copy closing does not end the child's registration.
  const uint32_t key = KeyIndex(c.server);
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->key(key).active.load(), 1u);
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_EQ(ConnsUsed(), 0u) << "the owner's close deregistered it";
  EXPECT_EQ(KeysUsed(), 0u);
}

TEST_F(GovernorTest, StoppedWatcherLooksDeadAndItsConnectionsAreReaped) {
  StartGovernor();
  const Conn sending = Open();
  const Conn quiet = Open("127.0.0.2");
  ASSERT_GE(quiet.server, 0);
  gov_->BeforeSend(sending.server);
  const uint32_t proc = gov_->proc_index();
  ASSERT_NE(proc, kNoSlot);
  EXPECT_FALSE(Zone::ProcMaybeDead(zone_->proc(proc)));
  gov_->StopWatcher();
  EXPECT_EQ(gov_->proc_index(), kNoSlot);
  EXPECT_TRUE(Zone::ProcMaybeDead(zone_->proc(proc)));
  EXPECT_EQ(ConnsUsed(), 2u) << "nothing is released until a reaper runs";

  std::unique_ptr<FdTable> other_table(FdTable::Create(kTableSize));
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  Governor other(zone_.get(), other_table.get(), &logger_, options);
  const uint32_t other_proc = other.EnsureProc();
  ASSERT_NE(other_proc, kNoSlot);
  EXPECT_NE(other_proc, proc);
  other.ReapDead();
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
  EXPECT_EQ(zone_->header().procs_reaped.load(), 1u);
  EXPECT_EQ(zone_->header().conns_reaped.load(), 2u);
  EXPECT_EQ(zone_->proc(proc).state.load(), kProcFree);
  EXPECT_FALSE(Zone::ProcMaybeDead(zone_->proc(other_proc)));

  // The stopped process sends again: it registers anew and is counted.
  gov_->BeforeSend(sending.server);
  EXPECT_NE(gov_->proc_index(), kNoSlot);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Active(sending.server), 1u);
  EXPECT_EQ(ConnOf(sending.server).proc_index.load(), gov_->proc_index());
  EXPECT_EQ(Pacing(sending.server), kRate);
}

// Host threads send on governed sockets while another thread closes them and
// accepts new connections that get the same fd numbers. The senders may see
// an fd number at any point of its close and reuse.
TEST_F(GovernorTest,
       ThreadsSendingWhileAnotherClosesAndReacceptsStayConsistent) {
  StartGovernor();
  constexpr int kSockets = 4;
  constexpr int kSenders = 3;
  constexpr int64_t kRunNs = 300 * kNsPerMs;
  constexpr int kMaxRounds = 100'000;         // closes and re-accepts
  constexpr int kMaxSendRounds = 10'000'000;  // per sender
  const char* const kFrom[2] = {"127.0.0.2", "127.0.0.3"};
  std::atomic<int> server[kSockets];
  int client[kSockets];
  for (int i = 0; i < kSockets; ++i) {
    const Conn c = Connect(kFrom[i % 2]);
    ASSERT_GE(c.server, 0);
    server[i].store(c.server);
    client[i] = c.client;
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sends{0};
  std::atomic<int> reaccepts{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < kSenders; ++t) {
    senders.emplace_back([&, t] {
      for (int round = 0; round < kMaxSendRounds && !stop.load(); ++round) {
        const int fd = server[(round + t) % kSockets].load();
        // No real send: that would race with the close in the test itself.
        // The Governor's own use of the fd (setsockopt, ioctl) must not
        // race with the close, and ThreadSanitizer checks that.
        gov_->BeforeSend(fd);
        gov_->AfterSend(fd, 1);
        sends.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::thread closer([&] {
    for (int round = 0; round < kMaxRounds && !stop.load(); ++round) {
      const int i = round % kSockets;
      gov_->OnClose(server[i].load());
      close(server[i].load());
      close(client[i]);
      const Conn c = Connect(kFrom[(i + round / kSockets) % 2]);
      if (c.server < 0) {
        failures.fetch_add(1);
        break;
      }
      server[i].store(c.server);
      client[i] = c.client;
      reaccepts.fetch_add(1);
      char buf[4096];
      for (int j = 0; j < kSockets; ++j) {
        (void)recv(client[j], buf, sizeof(buf), MSG_DONTWAIT);
      }
    }
  });
  const int64_t deadline = MonotonicNowNs() + kRunNs;
  PollUntil([&] { return MonotonicNowNs() >= deadline; },
            kRunNs + testing_util::kWaitNs);
  stop.store(true);
  for (std::thread& sender : senders) sender.join();
  closer.join();
  RecordProperty("reaccepts", reaccepts.load());
  RecordProperty("sends", static_cast<int>(sends.load()));
  ASSERT_EQ(failures.load(), 0);
  EXPECT_GT(reaccepts.load(), 10);
  EXPECT_GT(sends.load(), 100u);

  // Every open socket is registered exactly once, by this process; the keys'
  // counts match their connections.
  {
    ZoneLock lock(*zone_);
    const ZoneHeaderShm& h = zone_->header();
    EXPECT_EQ(h.conns_used, uint32_t{kSockets});
    EXPECT_LE(h.keys_used, 2u);
    std::vector<uint32_t> refs(zone_->key_capacity(), 0);
    std::vector<uint32_t> active(zone_->key_capacity(), 0);
    for (int i = 0; i < kSockets; ++i) {
      const uint64_t state = table_->Get(server[i].load())->state.load();
      ASSERT_NE(state, 0u) << "socket " << i << " lost its registration";
      const ConnSlotShm& c = zone_->conn(StateConn(state));
      EXPECT_EQ(Zone::CookieOf(c.seq.load()), StateCookie(state));
      EXPECT_EQ(c.fd.load(), server[i].load());
      EXPECT_EQ(c.proc_index.load(), gov_->proc_index());
    }
    for (uint32_t c = 0; c < zone_->conn_capacity(); ++c) {
      const ConnSlotShm& slot = zone_->conn(c);
      if ((slot.seq.load() & 1) == 0) continue;
      ++refs[slot.key_index.load()];
      active[slot.key_index.load()] += slot.active.load();
    }
    for (uint32_t k = 0; k < zone_->key_capacity(); ++k) {
      const KeySlotShm& key = zone_->key(k);
      if (!key.in_use) continue;
      EXPECT_EQ(key.refs, refs[k]) << "key " << k;
      EXPECT_EQ(key.active.load(), active[k]) << "key " << k;
    }
  }
  for (int i = 0; i < kSockets; ++i) {
    gov_->OnClose(server[i].load());
    close(server[i].load());
    close(client[i]);
  }
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

}  // namespace
}  // namespace trafficrate
