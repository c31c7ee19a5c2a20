// The library's lines about programs it cannot pace
// (src/runtime/bypass_watch.h): a Go program at start-up, and a process holding
// connections on its listening port that no accept() returned. Real sockets on
// loopback.

#include "src/runtime/bypass_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/base/elf_probe.h"
#include "src/base/log.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint64_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return st.st_ino;
}

class BypassWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_path_ =
        absl::StrCat(::testing::TempDir(), "/bypass_watch_test.", getpid());
    log_fd_ = open(log_path_.c_str(),
                   O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    ASSERT_GE(log_fd_, 0);
    logger_.Configure(LogTarget::kFile, log_fd_);
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    close(log_fd_);
    unlink(log_path_.c_str());
  }

  std::string Log() const {
    std::string text(65536, '\0');
    const ssize_t n = pread(log_fd_, text.data(), text.size(), 0);
    text.resize(n > 0 ? n : 0);
    return text;
  }

  int Keep(int fd) {
    EXPECT_GE(fd, 0);
    fds_.push_back(fd);
    return fd;
  }

  // A TCP listener on `address`, any port.
  int Listen(const char* address = "127.0.0.1") {
    const int fd = Keep(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, address, &addr.sin_addr);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd, 16), 0);
    return fd;
  }

  static ListenAddr AddrOf(int listener) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    ListenAddr a;
    a.family = AF_INET;
    a.port = ntohs(addr.sin_port);
    a.any = addr.sin_addr.s_addr == htonl(INADDR_ANY);
    std::memcpy(a.addr, &addr.sin_addr, 4);
    return a;
  }

  int Connect(int listener) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    const int fd = Keep(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    return fd;
  }

  // As io_uring or a raw system call would: no accept() to see.
  int RawAccept(int listener) {
    return Keep(static_cast<int>(
        syscall(SYS_accept4, listener, nullptr, nullptr, SOCK_CLOEXEC)));
  }

  std::string log_path_;
  int log_fd_ = -1;
  Logger logger_;
  std::vector<int> fds_;
};

TEST_F(BypassWatchTest, GoProgramIsSaidOnce) {
  EXPECT_TRUE(LogIfGoProgram(logger_, TRAFFICRATE_FAKE_GO));
  EXPECT_EQ(Log(), absl::StrCat("trafficrate: process ", getpid(), " (",
                                TRAFFICRATE_FAKE_GO,
                                ") is a Go program: it makes its system calls "
                                "itself, so trafficrate cannot pace its "
                                "connections (",
                                kBypassHelp, ")\n"));
}

TEST_F(BypassWatchTest, OtherProgramsAreNotSaid) {
  EXPECT_FALSE(LogIfGoProgram(logger_, "/proc/self/exe"));
  EXPECT_FALSE(LogIfGoProgram(logger_, "/nonexistent"));
  // Static programs never load the library: not the library's to say.
  if (std::strlen(TRAFFICRATE_STATIC_HELLO) != 0) {
    EXPECT_FALSE(LogIfGoProgram(logger_, TRAFFICRATE_STATIC_HELLO));
  }
  EXPECT_EQ(Log(), "");
}

TEST_F(BypassWatchTest, OpenConnectionsAreThoseAccepted) {
  const int listener = Listen();
  const ListenAddr addr = AddrOf(listener);
  Connect(listener);
  Connect(listener);
  // In the accept queue: no socket file yet.
  absl::StatusOr<std::vector<uint64_t>> inodes =
      OpenConnectionInodes(addr, 100);
  ASSERT_TRUE(inodes.ok()) << inodes.status();
  EXPECT_TRUE(inodes->empty());

  const int accepted = RawAccept(listener);
  inodes = OpenConnectionInodes(addr, 100);
  ASSERT_TRUE(inodes.ok()) << inodes.status();
  EXPECT_THAT(*inodes, ElementsAre(InodeOf(accepted)));
  EXPECT_THAT(OwnedSockets(*inodes, 10), ElementsAre(InodeOf(accepted)));

  // Another port's connections, another address: not these.
  const int other = Listen();
  Connect(other);
  RawAccept(other);
  inodes = OpenConnectionInodes(addr, 100);
  ASSERT_TRUE(inodes.ok());
  EXPECT_EQ(inodes->size(), 1u);
  ListenAddr elsewhere = addr;
  elsewhere.any = false;
  inet_pton(AF_INET, "127.0.0.2", elsewhere.addr);
  inodes = OpenConnectionInodes(elsewhere, 100);
  ASSERT_TRUE(inodes.ok());
  EXPECT_TRUE(inodes->empty());
  // Bound to every address: any local address counts.
  elsewhere.any = true;
  EXPECT_EQ(OpenConnectionInodes(elsewhere, 100)->size(), 1u);

  RawAccept(listener);
  EXPECT_EQ(OpenConnectionInodes(addr, 1)->size(), 1u);  // at most max
  EXPECT_TRUE(OwnedSockets({1, 2, 3}, 10).empty());
}

// The looks of these tests are their own: the watch's thread looks no time.
const ListenWatchTiming kNoLooks{0, 0};

void WaitForTheThread(const ListenWatch& watch) {
  const int64_t deadline = MonotonicNowNs() + 10 * kNsPerSec;
  while (watch.looking() && MonotonicNowNs() < deadline) {
    SleepNs(kNsPerMs);
  }
  EXPECT_FALSE(watch.looking());
}

TEST_F(BypassWatchTest, LooksSayWhatTheProcessAccepted) {
  ListenWatch watch(&logger_, kNoLooks, nullptr);
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kNothingYet);  // no port
  const int listener = Listen();
  // Not TCP: not kept.
  const int unix_fd = Keep(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  ASSERT_EQ(
      bind(unix_fd, reinterpret_cast<sockaddr*>(&un), sizeof(sa_family_t)),
      0);  // autobind
  ASSERT_EQ(listen(unix_fd, 1), 0);
  watch.OnListen(unix_fd);
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kNothingYet);

  watch.OnListen(listener);
  WaitForTheThread(watch);
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kNothingYet);
  Connect(listener);
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kNothingYet);  // queued
  RawAccept(listener);
  EXPECT_EQ(Log(), "");
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kUnaccepted);
  EXPECT_EQ(Log(),
            absl::StrCat("trafficrate: process ", getpid(),
                         " holds connections on port ", AddrOf(listener).port,
                         " that no accept() or accept4() call returned "
                         "(accepted through io_uring or a raw system "
                         "call?): trafficrate cannot pace them (",
                         kBypassHelp, ")\n"));
  watch.NoteAccept();
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kAccepted);
}

TEST_F(BypassWatchTest, ConnectionsOfOtherProcessesTellNothing) {
  // A master that listens and a worker (here a forked child) that accepts
  // and holds the connection.
  ListenWatch watch(&logger_, kNoLooks, nullptr);
  const int listener = Listen();
  watch.OnListen(listener);
  WaitForTheThread(watch);
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  Connect(listener);
  const pid_t child = fork();
  if (child == 0) {
    const int fd =
        static_cast<int>(syscall(SYS_accept4, listener, nullptr, nullptr, 0));
    (void)!write(ready[1], &fd, 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  EXPECT_EQ(watch.LookOnce(), ListenWatch::Look::kOthers);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(Log(), "");
}

TEST_F(BypassWatchTest, TheThreadLooksAfterTheFirstListen) {
  ListenWatchTiming timing;
  timing.first_ns = 20 * kNsPerMs;
  timing.looks = 8;  // 20 ms ... 2.56 s
  ListenWatch watch(&logger_, timing, nullptr);
  const int listener = Listen();
  watch.OnListen(listener);
  watch.OnListen(listener);  // again: one thread, one port
  Connect(listener);
  RawAccept(listener);
  const int64_t deadline = MonotonicNowNs() + 10 * kNsPerSec;
  while (Log().empty() && MonotonicNowNs() < deadline) SleepNs(10 * kNsPerMs);
  EXPECT_THAT(Log(), HasSubstr("holds connections on port"));
  // The thread ended at its line: nothing more, ever.
  while (watch.looking() && MonotonicNowNs() < deadline) {
    SleepNs(10 * kNsPerMs);
  }
  EXPECT_FALSE(watch.looking());
  const std::string log = Log();
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
}

TEST_F(BypassWatchTest, TheThreadEndsAtTheFirstAccept) {
  ListenWatchTiming timing;
  timing.first_ns = 20 * kNsPerMs;
  timing.looks = 4;
  ListenWatch watch(&logger_, timing, nullptr);
  const int listener = Listen();
  watch.OnListen(listener);
  watch.NoteAccept();
  Connect(listener);
  RawAccept(listener);
  const int64_t deadline = MonotonicNowNs() + 10 * kNsPerSec;
  while (watch.looking() && MonotonicNowNs() < deadline) {
    SleepNs(10 * kNsPerMs);
  }
  EXPECT_FALSE(watch.looking());
  EXPECT_EQ(Log(), "");
}

}  // namespace
}  // namespace trafficrate
