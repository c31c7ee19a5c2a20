// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD: the test plays the interposers, calling OnAccept after
// ::accept, BeforeSend/AfterSend around ::send and OnClose before ::close,
// and reads back the pacing with getsockopt(SO_MAX_PACING_RATE).
//
// This file: a forked child that sends takes ownership of a connection (also
// one made with a raw clone system call, which skips pthread_atfork), a
// vfork child leaves its parent's connections alone, a process about to
// lose the right to start threads starts its watcher first, a stopped
// watcher looks dead and its connections are reaped, and threads send while
// another closes and re-accepts. The single-process tests are in the other
// governor_*_test.cc; the fixture is in governor_fixture.h.
//
// The Governor is driven (no watcher thread; governor_fixture.h), in the
// parent and so in a forked child: after AfterForkChild the child's first
// governed call claims the child's own process slot, in that call, as the
// watcher thread it would start would. The test of that thread's start in a
// child (BeforeThreadLimit) runs the live watcher.

#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::ExitedWith;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::kTableSize;
using testing_util::kUnderTsan;
using testing_util::Pacing;
using testing_util::Pipe;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

using GovernorForkTest = testing_util::GovernorFixture;

TEST_F(GovernorForkTest, ForkedChildThatSendsTakesOwnership) {
  // No thread in either process: the child claims its slot in its send
  // (ThreadSanitizer supports this fork).
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
    TRAFFICRATE_CHILD_CHECK(zone_->conns().slot(conn).proc_index.load() == me);
    TRAFFICRATE_CHILD_CHECK(zone_->conns().slot(conn).active.load() == 1);
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
  const uint32_t owner = zone_->conns().slot(conn).proc_index.load();
  EXPECT_NE(owner, parent_proc);
  EXPECT_EQ(zone_->procs().slot(owner).pid.load(), pid);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(Active(c.server), 1u) << "counted once, by the child";
  // The parent's copy closing does not end the child's registration.
  const uint32_t key = KeyIndex(c.server);
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_EQ(ConnsUsed(), 0u) << "the owner's close deregistered it";
  EXPECT_EQ(KeysUsed(), 0u);
}

// A child made as vsftpd makes its sessions: the clone system call itself,
// not glibc's fork(), so no pthread_atfork handler runs in it.
pid_t RawClone() {
  return static_cast<pid_t>(
      syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0));
}

// The child's first interposed call finds the process token wiped (the test
// plays lib/interpose.h's ActiveGovernor) and sets the process up as the
// atfork handler would: its own watcher, its own slot, under its own pid.
TEST_F(GovernorForkTest, RawCloneChildIsRecognisedAndTakesOwnership) {
  // No thread in either process (ThreadSanitizer supports this clone).
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t conn = ConnIndex(c.server);
  const uint32_t parent_proc = gov_->proc_index();
  ASSERT_NE(parent_proc, kNoSlot);
  Pipe ready;
  Pipe finish;
  const pid_t pid = RawClone();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    finish.CloseWrite();
    TRAFFICRATE_CHILD_CHECK(!gov_->ProcessCurrent());
    TRAFFICRATE_CHILD_CHECK(gov_->RenewProcess());
    TRAFFICRATE_CHILD_CHECK(gov_->ProcessCurrent());
    TRAFFICRATE_CHILD_CHECK(gov_->proc_index() == kNoSlot);
    TRAFFICRATE_CHILD_CHECK(!gov_->SharedWithParent());
    char byte = 'c';
    gov_->BeforeSend(c.server);
    const ssize_t sent =
        ::send(c.server, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    gov_->AfterSend(c.server, sent);
    TRAFFICRATE_CHILD_CHECK(sent == 1);
    const uint32_t me = gov_->proc_index();
    TRAFFICRATE_CHILD_CHECK(me != kNoSlot && me != parent_proc);
    TRAFFICRATE_CHILD_CHECK(zone_->procs().slot(me).pid.load() == getpid());
    TRAFFICRATE_CHILD_CHECK(zone_->conns().slot(conn).proc_index.load() == me);
    TRAFFICRATE_CHILD_CHECK(zone_->conns().slot(conn).active.load() == 1);
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
  const uint32_t owner = zone_->conns().slot(conn).proc_index.load();
  EXPECT_NE(owner, parent_proc);
  EXPECT_EQ(zone_->procs().slot(owner).pid.load(), pid);
  EXPECT_EQ(Active(c.server), 1u) << "counted once, by the child";
  CloseServer(c.server);
  EXPECT_EQ(ConnsUsed(), 1u) << "the parent's close leaves it to its owner";
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_EQ(ConnsUsed(), 0u) << "the owner's close deregistered it";
  EXPECT_EQ(KeysUsed(), 0u);
}

// The clone system call clears the robust mutex list the kernel knows for
// the thread (glibc's fork registers it again). A child of a thread that
// never took the zone lock would then find the lock's links "damaged" at its
// first unlock and mark the zone corrupt for every process.
TEST_F(GovernorForkTest,
       RawCloneChildOfAThreadThatNeverLockedKeepsTheZoneSound) {
  if (kUnderTsan) {
    GTEST_SKIP() << "ThreadSanitizer does not support a raw clone of a "
                    "multithreaded process";
  }
  StartGovernor();
  pid_t pid = -1;
  std::thread fresh([&] {
    pid = RawClone();
    if (pid != 0) return;
    TRAFFICRATE_CHILD_CHECK(gov_->RenewProcess());
    void* head = nullptr;
    size_t len = 0;
    TRAFFICRATE_CHILD_CHECK(syscall(SYS_get_robust_list, 0, &head, &len) == 0 &&
                            head != nullptr);
    {
      ZoneLock lock(*zone_);
      TRAFFICRATE_CHILD_CHECK(lock.ok());
    }
    TRAFFICRATE_CHILD_CHECK(!zone_->segment().corrupt());
    const Conn c = Open("127.0.0.2");
    TRAFFICRATE_CHILD_CHECK(c.server >= 0 && Send(c.server) == 100);
    TRAFFICRATE_CHILD_CHECK(gov_->proc_index() != kNoSlot);
    TRAFFICRATE_CHILD_CHECK(!zone_->segment().corrupt());
    _exit(0);
  });
  fresh.join();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_TRUE(zone_->segment().CheckHeader()) << "the zone is sound";
}

// Python's subprocess starts its children with vfork and, in the child,
// closes every fd above 2 and dup2s the pipes through libc before its exec:
// the interposers run there, on the parent's memory (its fd table, its
// local references), but on the child's own fds. They must leave the
// parent's connections alone.
TEST_F(GovernorForkTest, VforkChildLeavesTheParentsConnectionsAlone) {
  StartGovernor();
  const Conn a = Open();
  const Conn b = Open("127.0.0.2");
  ASSERT_GE(b.server, 0);
  ASSERT_EQ(Send(a.server), 100);
  const uint64_t state_a = table_->Get(a.server)->state.load();
  const uint64_t state_b = table_->Get(b.server)->state.load();
  ASSERT_NE(state_a, 0u);
  ASSERT_NE(state_b, 0u);
  constexpr int kSpare = 900;  // not open here
  const pid_t pid = vfork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // dup2(b, kSpare), dup2 over a, close(a), close_range(3, ~0U).
    gov_->ReleaseDetached(gov_->Detach(kSpare));
    gov_->OnDup(b.server, kSpare);
    gov_->ReleaseDetached(gov_->Detach(a.server));
    gov_->OnClose(a.server);
    gov_->OnCloseRange(3, ~0U);
    _exit(0);
  }
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_EQ(table_->Get(a.server)->state.load(), state_a);
  EXPECT_EQ(table_->Get(b.server)->state.load(), state_b);
  EXPECT_EQ(table_->Get(kSpare)->state.load(), 0u);
  EXPECT_EQ(ConnsUsed(), 2u);
  EXPECT_EQ(ConnOf(a.server).active.load(), 1u);
  // The parent's own closes still end them: no reference was added or
  // dropped by the child.
  CloseServer(a.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  CloseServer(b.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

// vsftpd's processes set RLIMIT_NPROC to 0 after fork (no thread can be
// started once they run as their unprivileged user), then send on the
// control connection they inherited and receive their data connections.
// A process holding governed connections starts its watcher before the
// limit; one without any does not take a slot.
TEST_F(GovernorForkTest, ThreadLimitStartsTheWatcherOfAProcessWithConnections) {
  if (kUnderTsan) {
    GTEST_SKIP() << "ThreadSanitizer does not support threads started in a "
                    "child of a multithreaded process";
  }
  // The live watcher: what matters is that the thread is started before
  // the limit, so the child starts a real one.
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  StartLiveGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t parent_proc = gov_->proc_index();
  const pid_t with = fork();
  ASSERT_GE(with, 0);
  if (with == 0) {
    TRAFFICRATE_CHILD_CHECK(gov_->RenewProcess());
    TRAFFICRATE_CHILD_CHECK(gov_->proc_index() == kNoSlot);
    gov_->BeforeThreadLimit();
    const uint32_t me = gov_->proc_index();
    TRAFFICRATE_CHILD_CHECK(me != kNoSlot && me != parent_proc);
    _exit(0);
  }
  EXPECT_TRUE(ExitedWith(WaitChild(with), 0));
  const pid_t without = fork();
  ASSERT_GE(without, 0);
  if (without == 0) {
    TRAFFICRATE_CHILD_CHECK(gov_->RenewProcess());
    gov_->OnClose(c.server);
    close(c.server);
    gov_->BeforeThreadLimit();
    TRAFFICRATE_CHILD_CHECK(gov_->proc_index() == kNoSlot);
    _exit(0);
  }
  EXPECT_TRUE(ExitedWith(WaitChild(without), 0));
  EXPECT_EQ(ConnsUsed(), 1u) << "the children left the parent's alone";
}

TEST_F(GovernorForkTest, StoppedWatcherLooksDeadAndItsConnectionsAreReaped) {
  StartGovernor();
  const Conn sending = Open();
  const Conn quiet = Open("127.0.0.2");
  ASSERT_GE(quiet.server, 0);
  gov_->BeforeSend(sending.server);
  const uint32_t proc = gov_->proc_index();
  ASSERT_NE(proc, kNoSlot);
  EXPECT_FALSE(ProcTable::MaybeDead(zone_->procs().slot(proc)));
  gov_->StopWatcher();
  EXPECT_EQ(gov_->proc_index(), kNoSlot);
  EXPECT_TRUE(ProcTable::MaybeDead(zone_->procs().slot(proc)));
  EXPECT_EQ(ConnsUsed(), 2u) << "nothing is released until a reaper runs";

  std::unique_ptr<FdTable> other_table(FdTable::Create(kTableSize));
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  Governor other(zone_.get(), other_table.get(), &logger_, Driven(options));
  const uint32_t other_proc = other.EnsureProc();
  ASSERT_NE(other_proc, kNoSlot);
  EXPECT_NE(other_proc, proc);
  other.ReapDead();
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
  EXPECT_EQ(zone_->header().procs_reaped.load(), 1u);
  EXPECT_EQ(zone_->header().conns_reaped.load(), 2u);
  EXPECT_EQ(zone_->procs().slot(proc).state.load(), kProcFree);
  EXPECT_FALSE(ProcTable::MaybeDead(zone_->procs().slot(other_proc)));

  // The stopped process sends again: it registers anew and is counted.
  gov_->BeforeSend(sending.server);
  EXPECT_NE(gov_->proc_index(), kNoSlot);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(Active(sending.server), 1u);
  EXPECT_EQ(ConnOf(sending.server).proc_index.load(), gov_->proc_index());
  EXPECT_EQ(Pacing(sending.server), kRate);
}

// Host threads send on governed sockets while another thread closes them and
// accepts new connections that get the same fd numbers, and a thread plays
// the watcher (PlayWatcher). The senders and the watcher may see an fd
// number at any point of its close and reuse.
TEST_F(GovernorForkTest,
       ThreadsSendingWhileAnotherClosesAndReacceptsStayConsistent) {
  StartGovernor();
  constexpr int kSockets = 4;
  constexpr int kSenders = 3;
  constexpr int kRounds = 1'000;  // closes and re-accepts (0.3 s here)
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
  std::thread watcher = PlayWatcher(stop);
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
    for (int round = 0; round < kRounds; ++round) {
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
  closer.join();
  stop.store(true);
  for (std::thread& sender : senders) sender.join();
  watcher.join();
  RecordProperty("reaccepts", reaccepts.load());
  RecordProperty("sends", static_cast<int>(sends.load()));
  ASSERT_EQ(failures.load(), 0);
  EXPECT_EQ(reaccepts.load(), kRounds);
  EXPECT_GT(sends.load(), 100u);

  // Every open socket is registered exactly once, by this process; the keys'
  // counts match their connections.
  {
    ZoneLock lock(*zone_);
    const ZoneHeaderShm& h = zone_->header();
    EXPECT_EQ(h.conns_used, uint32_t{kSockets});
    EXPECT_LE(h.keys_used, 2u);
    std::vector<uint32_t> refs(zone_->keys().capacity(), 0);
    std::vector<uint32_t> active(zone_->keys().capacity(), 0);
    for (int i = 0; i < kSockets; ++i) {
      const uint64_t state = table_->Get(server[i].load())->state.load();
      ASSERT_NE(state, 0u) << "socket " << i << " lost its registration";
      const ConnSlotShm& c = zone_->conns().slot(FdState::From(state).conn());
      EXPECT_EQ(ConnTable::CookieOf(c.seq.load()),
                FdState::From(state).cookie());
      EXPECT_EQ(c.fd.load(), server[i].load());
      EXPECT_EQ(c.proc_index.load(), gov_->proc_index());
    }
    for (uint32_t c = 0; c < zone_->conns().capacity(); ++c) {
      const ConnSlotShm& slot = zone_->conns().slot(c);
      if ((slot.seq.load() & 1) == 0) continue;
      ++refs[slot.key_index.load()];
      active[slot.key_index.load()] += slot.active.load();
    }
    for (uint32_t k = 0; k < zone_->keys().capacity(); ++k) {
      const KeySlotShm& key = zone_->keys().slot(k);
      if (!key.in_use.load()) continue;
      EXPECT_EQ(key.refs.load(), refs[k]) << "key " << k;
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

// Host threads send on governed sockets and on duplicates of them while one
// thread dup2()s sockets over spare fd numbers (replacing an older duplicate
// there), another closes the duplicates, as the interposers would, and a
// thread plays the watcher (PlayWatcher). When all duplicates are gone,
// every socket is registered once and the counts match.
TEST_F(GovernorForkTest,
       ThreadsSendingWhileOthersDup2OverAndCloseStayConsistent) {
  StartGovernor();
  constexpr int kSockets = 4;
  constexpr int kSpares = 4;
  constexpr int kSenders = 2;
  constexpr int kRounds = 5'000;  // dup2s, and closes (0.2 s here)
  constexpr int kMaxSendRounds = 10'000'000;
  const char* const kFrom[2] = {"127.0.0.2", "127.0.0.3"};
  int server[kSockets];
  int client[kSockets];
  for (int i = 0; i < kSockets; ++i) {
    const Conn c = Connect(kFrom[i % 2]);
    ASSERT_GE(c.server, 0);
    server[i] = c.server;
    client[i] = c.client;
  }
  // Spare fd numbers, held open by plain sockets until a dup2 lands there.
  int spare[kSpares];
  for (int i = 0; i < kSpares; ++i) {
    spare[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(spare[i], 0);
  }
  // dup2 and close of one spare number must not interleave (the host would
  // not do both on one number at once either): one mutex per spare.
  std::mutex spare_mu[kSpares];
  std::atomic<bool> stop{false};
  std::atomic<int> dups{0};
  std::atomic<int> closes{0};
  std::atomic<int> failures{0};
  std::thread watcher = PlayWatcher(stop);
  std::vector<std::thread> senders;
  for (int t = 0; t < kSenders; ++t) {
    senders.emplace_back([&, t] {
      for (int round = 0; round < kMaxSendRounds && !stop.load(); ++round) {
        const int n = (round + t) % (kSockets + kSpares);
        const int fd = n < kSockets ? server[n] : spare[n - kSockets];
        gov_->BeforeSend(fd);
        gov_->AfterSend(fd, 1);
      }
    });
  }
  std::thread duplicator([&] {
    for (int round = 0; round < kRounds; ++round) {
      const int i = round % kSpares;
      const int from = server[(round / kSpares) % kSockets];
      std::lock_guard<std::mutex> hold(spare_mu[i]);
      // The dup2 interposer (lib/interpose_fds.cc, Replace).
      const uint64_t detached = gov_->Detach(spare[i]);
      if (dup2(from, spare[i]) < 0) {
        gov_->Reattach(spare[i], detached);
        failures.fetch_add(1);
        break;
      }
      gov_->ReleaseDetached(detached);
      gov_->OnDup(from, spare[i]);
      dups.fetch_add(1);
    }
  });
  std::thread closer([&] {
    for (int round = 0; round < kRounds; ++round) {
      const int i = (round * 3 + 1) % kSpares;
      std::lock_guard<std::mutex> hold(spare_mu[i]);
      // The close interposer, then a plain socket to hold the number.
      gov_->OnClose(spare[i]);
      close(spare[i]);
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        failures.fetch_add(1);
        break;
      }
      if (fd != spare[i]) {
        // Another thread's socket took the number: move ours there.
        if (dup2(fd, spare[i]) < 0) failures.fetch_add(1);
        close(fd);
      }
      closes.fetch_add(1);
    }
  });
  duplicator.join();
  closer.join();
  stop.store(true);
  for (std::thread& sender : senders) sender.join();
  watcher.join();
  RecordProperty("dups", dups.load());
  RecordProperty("closes", closes.load());
  ASSERT_EQ(failures.load(), 0);
  EXPECT_EQ(dups.load(), kRounds);
  EXPECT_EQ(closes.load(), kRounds);
  for (int i = 0; i < kSpares; ++i) {
    gov_->OnClose(spare[i]);
    close(spare[i]);
  }
  {
    ZoneLock lock(*zone_, kWatcherLockWaitNs);
    ASSERT_TRUE(lock.ok());
    EXPECT_EQ(zone_->header().conns_used, uint32_t{kSockets});
    for (int i = 0; i < kSockets; ++i) {
      const uint64_t state = table_->Get(server[i])->state.load();
      ASSERT_NE(state, 0u) << "socket " << i << " lost its registration";
      const ConnSlotShm& c = zone_->conns().slot(FdState::From(state).conn());
      EXPECT_EQ(ConnTable::CookieOf(c.seq.load()),
                FdState::From(state).cookie());
      EXPECT_EQ(c.proc_index.load(), gov_->proc_index());
    }
    std::vector<uint32_t> refs(zone_->keys().capacity(), 0);
    for (uint32_t c = 0; c < zone_->conns().capacity(); ++c) {
      const ConnSlotShm& slot = zone_->conns().slot(c);
      if ((slot.seq.load() & 1) != 0) ++refs[slot.key_index.load()];
    }
    for (uint32_t k = 0; k < zone_->keys().capacity(); ++k) {
      const KeySlotShm& key = zone_->keys().slot(k);
      if (!key.in_use.load()) continue;
      EXPECT_EQ(key.refs.load(), refs[k]) << k;
    }
  }
  for (int i = 0; i < kSockets; ++i) {
    gov_->OnClose(server[i]);
    close(server[i]);
    close(client[i]);
  }
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

}  // namespace
}  // namespace trafficrate
