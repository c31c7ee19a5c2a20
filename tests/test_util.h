// Helpers shared by the unit tests: unique zone names, bounded polling,
// forked children that report through their exit status, pipes, and
// sanitizer detection. The zone fixtures are tests/shm/zone_fixture.h, the
// Governor's tests/runtime/governor_fixture.h.

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
#include "src/base/clock.h"

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

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_TEST_UTIL_H_
