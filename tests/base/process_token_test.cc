// ProcessToken: armed in the process that made it, wiped in a child made
// with fork() or with a raw clone system call (which skips pthread_atfork),
// intact in a vfork child (which shares its parent's memory).

#include "src/base/process_token.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::ExitedWith;
using testing_util::WaitChild;

// A child made as vsftpd makes its sessions: the clone system call itself,
// without glibc's fork() (no pthread_atfork handlers).
pid_t RawClone() {
  return static_cast<pid_t>(
      syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0));
}

// In the child: the token reads wiped until one caller renews it.
[[noreturn]] void CheckWipedAndRenew(ProcessToken& token) {
  TRAFFICRATE_CHILD_CHECK(!token.Current());
  TRAFFICRATE_CHILD_CHECK(token.BeginRenew());
  TRAFFICRATE_CHILD_CHECK(!token.BeginRenew());
  TRAFFICRATE_CHILD_CHECK(!token.Current());
  token.Arm();
  TRAFFICRATE_CHILD_CHECK(token.Current());
  TRAFFICRATE_CHILD_CHECK(!token.BeginRenew());
  _exit(0);
}

TEST(ProcessTokenTest, ArmedInTheProcessThatMadeIt) {
  ProcessToken token;
  ASSERT_TRUE(token.supported()) << "MADV_WIPEONFORK (Linux 4.14)";
  EXPECT_TRUE(token.Current());
  EXPECT_FALSE(token.BeginRenew());
  EXPECT_TRUE(token.Current());
}

TEST(ProcessTokenTest, WipedInAForkedChildUntilRenewedOnce) {
  ProcessToken token;
  ASSERT_TRUE(token.supported());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) CheckWipedAndRenew(token);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_TRUE(token.Current()) << "the parent's token is its own";
}

TEST(ProcessTokenTest, WipedInAChildOfARawCloneSystemCall) {
  ProcessToken token;
  ASSERT_TRUE(token.supported());
  const pid_t pid = RawClone();
  ASSERT_GE(pid, 0);
  if (pid == 0) CheckWipedAndRenew(token);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_TRUE(token.Current());
}

TEST(ProcessTokenTest, AGrandchildIsNewToo) {
  ProcessToken token;
  ASSERT_TRUE(token.supported());
  const pid_t pid = RawClone();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TRAFFICRATE_CHILD_CHECK(token.BeginRenew());
    token.Arm();
    const pid_t grandchild = RawClone();
    TRAFFICRATE_CHILD_CHECK(grandchild >= 0);
    if (grandchild == 0) CheckWipedAndRenew(token);
    TRAFFICRATE_CHILD_CHECK(ExitedWith(WaitChild(grandchild), 0));
    TRAFFICRATE_CHILD_CHECK(token.Current());
    _exit(0);
  }
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
}

TEST(ProcessTokenTest, IntactInAVforkChildWhichSharesTheMemory) {
  ProcessToken token;
  ASSERT_TRUE(token.supported());
  const pid_t pid = vfork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(token.Current() ? 0 : 1);
  EXPECT_TRUE(ExitedWith(WaitChild(pid), 0));
  EXPECT_TRUE(token.Current());
}

}  // namespace
}  // namespace trafficrate
