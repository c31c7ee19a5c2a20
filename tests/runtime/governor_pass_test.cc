// Sockets passed between processes over a Unix socket (sendmsg/recvmsg with
// SCM_RIGHTS), as an acceptor/worker server does (Node.js cluster's
// round-robin scheduling, for one). Two Governors with their own fd tables
// share one zone, as two processes of a server would; the test plays the
// interposers: BeforePassFds/AfterPassFds around ::sendmsg, OnReceivedFds
// after ::recvmsg, and calls the watcher's handoff expiry (ExpireHandoffs)
// at the times it means, on the Governors' clock. The fixture is in
// governor_fixture.h.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::kTableSize;
using testing_util::Pacing;

class GovernorPassTest : public testing_util::GovernorFixture {
 protected:
  void SetUp() override {
    GovernorFixture::SetUp();
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, unix_), 0);
    other_table_.reset(FdTable::Create(kTableSize));
    ASSERT_NE(other_table_, nullptr);
    GovernorOptions options;
    options.idle_ns = kLongIdleNs;
    StartGovernor(options);
    other_ = std::make_unique<Governor>(zone_.get(), other_table_.get(),
                                        &logger_, Driven(options));
  }

  void TearDown() override {
    if (received_ >= 0) CloseReceived();
    other_.reset();
    close(unix_[0]);
    close(unix_[1]);
    GovernorFixture::TearDown();
  }

  // Passes fd from gov_ over the Unix socket as the sendmsg interposer
  // does; returns sendmsg's result.
  ssize_t Pass(int fd, int flags = 0) {
    char byte = 'p';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    const int published = gov_->BeforePassFds(&msg);
    const ssize_t sent = ::sendmsg(unix_[0], &msg, flags);
    if (published > 0) gov_->AfterPassFds(&msg, sent >= 0);
    return sent;
  }

  // Receives one fd into `receiver` (other_ unless given) as the recvmsg
  // interposer does; -1 if none came. tell = false: as a process without
  // the library does.
  int Receive(Governor* receiver = nullptr, bool tell = true) {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    if (::recvmsg(unix_[1], &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) != 1) {
      return -1;
    }
    if (tell) {
      (receiver != nullptr ? receiver : other_.get())->OnReceivedFds(&msg);
    }
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
  }

  uint64_t OtherState(int fd) const {
    return other_table_->Get(fd)->state.load();
  }
  // other_'s close of the fd it received, as the close interposer does.
  void CloseReceived() {
    other_->OnClose(received_);
    close(received_);
    received_ = -1;
  }
  // other_'s send on the fd it received.
  ssize_t SendReceived(size_t bytes = 100) {
    std::string data(bytes, 'r');
    other_->BeforeSend(received_);
    const ssize_t sent = ::send(received_, data.data(), data.size(),
                                MSG_DONTWAIT | MSG_NOSIGNAL);
    other_->AfterSend(received_, sent);
    return sent;
  }

  int unix_[2] = {-1, -1};
  std::unique_ptr<FdTable> other_table_;
  std::unique_ptr<Governor> other_;
  int received_ = -1;
};

TEST_F(GovernorPassTest, PassedSocketIsGovernedByItsReceiverAndCountedOnce) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  ASSERT_NE(conn, kNoSlot);
  ASSERT_EQ(Pass(c.server), 1);
  received_ = Receive();
  ASSERT_GE(received_, 0);
  const uint64_t state = OtherState(received_);
  ASSERT_NE(state, 0u) << "the received socket is governed";
  EXPECT_EQ(FdState::From(state).conn(), conn)
      << "the same registration, not a new one";
  const uint32_t receiver = other_->proc_index();
  ASSERT_NE(receiver, kNoSlot);
  EXPECT_NE(receiver, gov_->proc_index());
  EXPECT_EQ(zone_->conns().slot(conn).proc_index.load(), receiver);
  EXPECT_EQ(zone_->conns().slot(conn).fd.load(), received_);
  // The sender's copy closes (Node's primary does at once): nothing ends.
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  ASSERT_EQ(SendReceived(), 100);
  EXPECT_EQ(zone_->keys()
                .slot(zone_->conns().slot(conn).key_index.load())
                .active.load(),
            1u);
  EXPECT_EQ(Pacing(received_), kRate);
  CloseReceived();
  EXPECT_EQ(ConnsUsed(), 0u) << "the receiver's close ends it";
  EXPECT_EQ(KeysUsed(), 0u);
}

TEST_F(GovernorPassTest, SenderClosingBeforeTheReceiveKeepsTheRegistration) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  ASSERT_EQ(Pass(c.server), 1);
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u) << "kept for its receiver";
  received_ = Receive();
  ASSERT_GE(received_, 0);
  ASSERT_NE(OtherState(received_), 0u);
  EXPECT_EQ(FdState::From(OtherState(received_)).conn(), conn);
  ASSERT_EQ(SendReceived(), 100);
  EXPECT_EQ(Pacing(received_), kRate);
  // Expiry does not touch what was received.
  gov_->ExpireHandoffs(Now() + 3 * kNsPerSec);
  EXPECT_EQ(ConnsUsed(), 1u);
  CloseReceived();
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorPassTest, SocketsThatWereNeverAcceptedAreNotGoverned) {
  // The client end: a socket this process connected, like a proxy's
  // upstream connection. Passing it publishes nothing.
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.client, 0);
  ASSERT_EQ(Pass(c.client), 1);
  received_ = Receive();
  ASSERT_GE(received_, 0);
  EXPECT_EQ(OtherState(received_), 0u);
  EXPECT_EQ(other_->proc_index(), kNoSlot) << "nothing made it claim a slot";
  EXPECT_EQ(ConnsUsed(), 1u) << "only the accepted end";
  // A non-socket fd passed: left alone too.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  ASSERT_EQ(Pass(pipe_fds[0]), 1);
  const int got = Receive();
  ASSERT_GE(got, 0);
  EXPECT_EQ(OtherState(got), 0u);
  close(got);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST_F(GovernorPassTest, UnreceivedSocketIsReleasedByItsSenderAfterExpiry) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Pass(c.server), 1);
  CloseServer(c.server);
  // Received by a process without the library: it never takes it over.
  const int fd = Receive(nullptr, /*tell=*/false);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ConnsUsed(), 1u);
  gov_->ExpireHandoffs(Now());
  EXPECT_EQ(ConnsUsed(), 1u) << "not before the expiry";
  gov_->ExpireHandoffs(Now() + Governor::kHandoffExpiryNs + kNsPerSec);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
  close(fd);
}

TEST_F(GovernorPassTest, ExpiryKeepsWhatTheSenderStillHolds) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  ASSERT_EQ(Pass(c.server), 1);
  gov_->ExpireHandoffs(Now() + Governor::kHandoffExpiryNs + kNsPerSec);
  EXPECT_EQ(ConnsUsed(), 1u) << "its sender still has its fd";
  // Received after the expiry: not taken over, so the receiver leaves it
  // alone; the sender's close ends it.
  received_ = Receive();
  ASSERT_GE(received_, 0);
  EXPECT_EQ(OtherState(received_), 0u);
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorPassTest, FailedSendWithdrawsTheHandoff) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  // Fill the Unix socket so that the pass fails with EAGAIN.
  const int size = 4096;
  setsockopt(unix_[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  std::string junk(4096, 'j');
  for (int i = 0; i < 10'000; ++i) {
    if (::send(unix_[0], junk.data(), junk.size(), MSG_DONTWAIT) < 0) break;
  }
  ASSERT_LT(Pass(c.server, MSG_DONTWAIT), 0);
  for (uint32_t i = 0; i < zone_->handoffs().capacity(); ++i) {
    EXPECT_EQ(zone_->handoffs().slot(i).inode.load(), 0u) << "withdrawn";
  }
  EXPECT_FALSE(zone_->handoffs().AnyPending());
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 0u) << "the sender's close ends it as usual";
}

TEST_F(GovernorPassTest, PassedToItselfIsOneConnectionWithTwoFds) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  ASSERT_EQ(Pass(c.server), 1);
  const int copy = Receive(gov_.get());
  ASSERT_GE(copy, 0);
  EXPECT_EQ(ConnIndex(copy), conn);
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u) << "its other fd still has it";
  gov_->OnClose(copy);
  close(copy);
  EXPECT_EQ(ConnsUsed(), 0u);
}

TEST_F(GovernorPassTest, MalformedControlMessagesAreReadWithinTheirBuffer) {
  const Conn c = Open("127.0.0.2");
  ASSERT_GE(c.server, 0);
  // cmsg_len claims far more than the buffer holds (AddressSanitizer
  // catches a read past it); then a length below a header.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = 1 << 20;
  std::memcpy(CMSG_DATA(h), &c.server, sizeof(int));
  EXPECT_LE(gov_->BeforePassFds(&msg), 1);
  other_->OnReceivedFds(&msg);
  h->cmsg_len = 3;
  EXPECT_EQ(gov_->BeforePassFds(&msg), 0);
  msg.msg_controllen = 2;
  EXPECT_EQ(gov_->BeforePassFds(&msg), 0);
  EXPECT_EQ(gov_->BeforePassFds(nullptr), 0);
  other_->OnReceivedFds(nullptr);
}

}  // namespace
}  // namespace trafficrate
