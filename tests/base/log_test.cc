#include "src/base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::SizeIs;

constexpr int64_t kSec = 1'000'000'000;

// The rate limit's clock in these tests (a plain global: the Logger takes a
// function pointer). Async-signal-safe.
std::atomic<int64_t> g_now_ns{1000 * kSec};
int64_t FakeNow() { return g_now_ns.load(); }
// Each reading one refill later: the bucket never runs dry.
int64_t AdvancingNow() { return g_now_ns.fetch_add(Logger::kRefillNs); }

std::string Pid(pid_t pid = getpid()) { return absl::StrCat(pid); }

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/log_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    path_ = dir_ + "/log";
    // Our stderr: a file, so the fallback lines can be read back.
    const std::string err_path = dir_ + "/stderr";
    err_fd_ =
        open(err_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(err_fd_, 0);
    saved_stderr_ = dup(2);
    ASSERT_GE(saved_stderr_, 0);
    ASSERT_EQ(dup2(err_fd_, 2), 2);
    g_now_ns.store(1000 * kSec);
    logger_.SetClockForTesting(&FakeNow);
  }

  void TearDown() override {
    if (saved_stderr_ >= 0) {
      dup2(saved_stderr_, 2);
      close(saved_stderr_);
    }
    if (err_fd_ >= 0) close(err_fd_);
    if (server_ >= 0) close(server_);
    unlink(path_.c_str());
    unlink((dir_ + "/stderr").c_str());
    rmdir(dir_.c_str());
  }

  // A syslog daemon of our own at path_.
  void Listen(int type = SOCK_DGRAM) {
    server_ = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    ASSERT_GE(server_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    ASSERT_LT(path_.size(), sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    ASSERT_EQ(bind(server_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0)
        << strerror(errno);
    if (type == SOCK_STREAM) {
      ASSERT_EQ(listen(server_, 4), 0);
    }
  }

  void UseSyslog() { logger_.Configure(LogTarget::kSyslog, -1, path_.c_str()); }

  // Every datagram queued now.
  std::vector<std::string> Received() {
    std::vector<std::string> out;
    char buf[2048];
    for (;;) {
      const ssize_t n = recv(server_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0) break;
      out.emplace_back(buf, static_cast<size_t>(n));
    }
    return out;
  }

  std::string Stderr() {
    std::string out;
    char buf[4096];
    off_t off = 0;
    for (;;) {
      const ssize_t n = pread(err_fd_, buf, sizeof(buf), off);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }

  std::vector<std::string> StderrLines() {
    return absl::StrSplit(Stderr(), '\n', absl::SkipEmpty());
  }

  std::string dir_;
  std::string path_;
  int err_fd_ = -1;
  int saved_stderr_ = -1;
  int server_ = -1;
  Logger logger_;
};

TEST_F(LogTest, SyslogLineHasPriorityIdentifierAndPid) {
  Listen();
  UseSyslog();
  logger_.Error("config %s refused", "x");
  logger_.Warning("zone %s is full", "z");
  logger_.Notice("reload: %d rule(s)", 3);
  const std::string head = "trafficrate[" + Pid() + "]: ";
  EXPECT_THAT(Received(), ElementsAre("<27>" + head + "config x refused",
                                      "<28>" + head + "zone z is full",
                                      "<29>" + head + "reload: 3 rule(s)"));
  EXPECT_EQ(Stderr(), "");
}

TEST_F(LogTest, SyslogLineIsOneLineAndBounded) {
  Listen();
  UseSyslog();
  logger_.Warning("two\nlines\n");
  logger_.Warning("%s", std::string(5000, 'a').c_str());
  const std::vector<std::string> got = Received();
  ASSERT_THAT(got, SizeIs(2));
  EXPECT_EQ(got[0], "<28>trafficrate[" + Pid() + "]: two lines ");
  EXPECT_THAT(got[1], MatchesRegex("<28>trafficrate\\[[0-9]+\\]: a+"));
  EXPECT_GT(got[1].size(), 400u);
  EXPECT_LT(got[1].size(), 1024u);
}

TEST_F(LogTest, StderrAndFileLinesKeepTheirFormat) {
  logger_.Warning("plain %d", 1);
  logger_.Error("plain %d", 2);
  logger_.Notice("plain %d", 3);
  EXPECT_EQ(Stderr(),
            "trafficrate: plain 1\ntrafficrate: plain 2\ntrafficrate: plain "
            "3\n");
}

TEST_F(LogTest, OffWritesNothing) {
  Listen();
  logger_.Configure(LogTarget::kOff, -1, path_.c_str());
  logger_.Error("nothing");
  EXPECT_THAT(Received(), SizeIs(0));
  EXPECT_EQ(Stderr(), "");
}

TEST_F(LogTest, NoSocketFallsBackToStderr) {
  UseSyslog();  // nobody listens at path_
  logger_.Error("no daemon %s", "here");
  EXPECT_EQ(Stderr(), "trafficrate: no daemon here\n");
}

TEST_F(LogTest, TooLongAPathFallsBackToStderr) {
  const std::string long_path = "/tmp/" + std::string(200, 'p');
  logger_.Configure(LogTarget::kSyslog, -1, long_path.c_str());
  logger_.Warning("long path");
  EXPECT_EQ(Stderr(), "trafficrate: long path\n");
}

TEST_F(LogTest, AFullReceiverFallsBackToStderr) {
  Listen();
  UseSyslog();
  // Fill the daemon's queue from another socket until it would block.
  const int filler = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(filler, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ASSERT_EQ(connect(filler, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  const std::string junk(1000, 'j');
  int queued = 0;
  while (queued < 100000 &&
         send(filler, junk.data(), junk.size(), MSG_DONTWAIT) > 0) {
    ++queued;
  }
  ASSERT_EQ(errno, EAGAIN);
  close(filler);
  logger_.Warning("queue full");  // must not block
  EXPECT_EQ(Stderr(), "trafficrate: queue full\n");
}

TEST_F(LogTest, AStreamSocketGetsTheMessageWithItsNul) {
  Listen(SOCK_STREAM);
  UseSyslog();
  logger_.Notice("over a stream");
  const int conn = accept4(server_, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(conn, 0);
  char buf[256];
  const ssize_t n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT);
  close(conn);
  ASSERT_GT(n, 0);
  EXPECT_EQ(
      std::string(buf, static_cast<size_t>(n)),
      std::string("<29>trafficrate[" + Pid() + "]: over a stream") + '\0');
  EXPECT_EQ(Stderr(), "");
}

TEST_F(LogTest, ErrnoIsPreservedOnEveryPath) {
  Listen();
  for (const LogTarget target :
       {LogTarget::kSyslog, LogTarget::kStderr, LogTarget::kOff}) {
    logger_.Configure(target, -1, path_.c_str());
    errno = EDOM;
    logger_.Warning("sent");
    EXPECT_EQ(errno, EDOM);
  }
  logger_.Configure(LogTarget::kSyslog, -1, "/nonexistent/log");
  errno = ERANGE;
  logger_.Error("fallback");  // connect fails with ENOENT
  EXPECT_EQ(errno, ERANGE);
  for (int i = 0; i < 3 * Logger::kBurstLines; ++i) logger_.Notice("flood");
  errno = EINTR;
  logger_.Notice("dropped");
  EXPECT_EQ(errno, EINTR);
}

TEST_F(LogTest, AtMostABurstThenOneLinePerRefillAndACountOfTheDropped) {
  Listen();
  UseSyslog();
  for (int i = 0; i < 25; ++i) logger_.Warning("distinct %d", i);
  std::vector<std::string> got = Received();
  ASSERT_THAT(got, SizeIs(Logger::kBurstLines));
  EXPECT_THAT(got.back(), HasSubstr("]: distinct 9"));
  g_now_ns += Logger::kRefillNs;  // one line's worth
  logger_.Notice("after a second");
  logger_.Notice("too soon");
  const std::string head = "trafficrate[" + Pid() + "]: ";
  EXPECT_THAT(Received(),
              ElementsAre("<28>" + head +
                              "15 message(s) suppressed (at most 10 lines "
                              "per 10 s)",
                          "<29>" + head + "after a second"));
  // A long pause refills the bucket to kBurstLines, not more.
  g_now_ns += 1000 * kSec;
  for (int i = 0; i < 25; ++i) logger_.Warning("again %d", i);
  got = Received();
  ASSERT_THAT(got, SizeIs(Logger::kBurstLines + 1));
  EXPECT_THAT(got[0], HasSubstr("]: 1 message(s) suppressed"));
  EXPECT_THAT(got[1], HasSubstr("]: again 0"));
  EXPECT_EQ(Stderr(), "");
}

TEST_F(LogTest, TheLimitAppliesToStderrToo) {
  for (int i = 0; i < 25; ++i) logger_.Warning("line %d", i);
  g_now_ns += 2 * Logger::kRefillNs;
  logger_.Warning("later");
  EXPECT_THAT(StderrLines(), SizeIs(Logger::kBurstLines + 2));
  EXPECT_EQ(StderrLines().back(), "trafficrate: later");
  EXPECT_EQ(
      StderrLines()[Logger::kBurstLines],
      "trafficrate: 15 message(s) suppressed (at most 10 lines per 10 s)");
}

TEST_F(LogTest, RealClockLimitsAFlood) {
  Listen();
  UseSyslog();
  logger_.SetClockForTesting(nullptr);
  for (int i = 0; i < 1000; ++i) logger_.Warning("flood %d", i);
  // At most a burst plus what refilled while the loop ran (well under 1 s).
  const size_t got = Received().size();
  EXPECT_GE(got, static_cast<size_t>(Logger::kBurstLines));
  EXPECT_LE(got, static_cast<size_t>(Logger::kBurstLines) + 2);
}

TEST_F(LogTest, AForkedChildLogsWithItsOwnPidAndAFullBucket) {
  Listen();
  UseSyslog();
  for (int i = 0; i < 3 * Logger::kBurstLines; ++i) logger_.Warning("parent");
  ASSERT_THAT(Received(), SizeIs(Logger::kBurstLines));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    logger_.Warning("child %d", 1);
    logger_.Warning("child %d", 2);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // No "suppressed" line: the parent's drops are not the child's.
  const std::string head = "<28>trafficrate[" + Pid(child) + "]: ";
  EXPECT_THAT(Received(), ElementsAre(head + "child 1", head + "child 2"));
  logger_.Warning("parent still limited");
  EXPECT_THAT(Received(), SizeIs(0));
}

// A signal handler that logs while the main thread is inside Logf: every
// line arrives whole, once, on the socket or (queue full) on stderr.
const Logger* g_signal_logger = nullptr;
std::atomic<int> g_signal_lines{0};

void LogFromHandler(int) {
  g_signal_logger->Notice("from the handler");
  g_signal_lines.fetch_add(1);
}

TEST_F(LogTest, ReentryFromASignalHandlerIsSafe) {
  Listen();
  int big = 4 << 20;
  setsockopt(server_, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  UseSyslog();
  logger_.SetClockForTesting(&AdvancingNow);
  g_signal_logger = &logger_;
  g_signal_lines = 0;
  struct sigaction action {};
  action.sa_handler = &LogFromHandler;
  sigemptyset(&action.sa_mask);
  struct sigaction old_action {};
  ASSERT_EQ(sigaction(SIGALRM, &action, &old_action), 0);
  itimerval timer{};
  timer.it_interval.tv_usec = 200;
  timer.it_value.tv_usec = 200;
  ASSERT_EQ(setitimer(ITIMER_REAL, &timer, nullptr), 0);
  constexpr int kMainLines = 2000;
  std::vector<std::string> got;
  for (int i = 0; i < kMainLines; ++i) {
    logger_.Warning("from the main loop %d", i);
    if (i % 16 == 0) {
      for (std::string& s : Received()) got.push_back(std::move(s));
    }
  }
  const itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old_action, nullptr);
  for (std::string& s : Received()) got.push_back(std::move(s));
  const std::vector<std::string> err = StderrLines();
  EXPECT_EQ(got.size() + err.size(),
            static_cast<size_t>(kMainLines + g_signal_lines.load()));
  EXPECT_GT(g_signal_lines.load(), 0);
  for (const std::string& line : got) {
    EXPECT_THAT(line, MatchesRegex("<2[89]>trafficrate\\[[0-9]+\\]: from the "
                                   "(main loop [0-9]+|handler)"));
  }
  for (const std::string& line : err) {
    EXPECT_THAT(line, MatchesRegex("trafficrate: from the (main loop "
                                   "[0-9]+|handler)"));
  }
}

TEST(LogAllowTest, OncePerIntervalPerWord) {
  std::atomic<int64_t> last{0};
  EXPECT_TRUE(Logger::Allow(last, 5 * kSec));
  EXPECT_FALSE(Logger::Allow(last, 5 * kSec + Logger::kRepeatIntervalNs - 1));
  EXPECT_TRUE(Logger::Allow(last, 5 * kSec + Logger::kRepeatIntervalNs));
}

}  // namespace
}  // namespace trafficrate
