// The host's epoll fds as the library sees them made: added, found, found
// in a range, forgotten one by one or by range, unknown once more were made
// than fit; and RemoveFromAll, on a real epoll set and a real socket, after
// which the set no longer reports the socket.

#include "src/runtime/host_epolls.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>

#include "gtest/gtest.h"

namespace trafficrate {
namespace {

TEST(HostEpollsTest, KnowsWhatWasAddedAndIgnoresNegativeFds) {
  HostEpolls epolls;
  EXPECT_FALSE(epolls.Has(0));
  EXPECT_FALSE(epolls.Has(7));
  EXPECT_FALSE(epolls.AnyIn(0, UINT_MAX));
  epolls.Add(7);
  epolls.Add(0);  // fd 0 is a valid epoll fd (a closed stdin reused)
  EXPECT_TRUE(epolls.Has(7));
  EXPECT_TRUE(epolls.Has(0));
  EXPECT_FALSE(epolls.Has(8));
  EXPECT_FALSE(epolls.Has(6));
  for (int i = 0; i < 2 * HostEpolls::kMaxEpolls; ++i) epolls.Add(-1);
  EXPECT_FALSE(epolls.unknown()) << "negative fds take no slot";
  EXPECT_FALSE(epolls.Has(-1)) << "a free slot is no fd -1";
  EXPECT_FALSE(epolls.AnyIn(1, 6));
  EXPECT_FALSE(epolls.AnyIn(8, UINT_MAX));
}

TEST(HostEpollsTest, AnyInTakesBothEndsOfTheRange) {
  HostEpolls epolls;
  epolls.Add(5);
  epolls.Add(10);
  epolls.Add(20);
  EXPECT_TRUE(epolls.AnyIn(0, 5));
  EXPECT_TRUE(epolls.AnyIn(5, 5));
  EXPECT_TRUE(epolls.AnyIn(10, 10));
  EXPECT_TRUE(epolls.AnyIn(20, UINT_MAX));
  EXPECT_TRUE(epolls.AnyIn(0, UINT_MAX));
  EXPECT_FALSE(epolls.AnyIn(0, 4));
  EXPECT_FALSE(epolls.AnyIn(6, 9));
  EXPECT_FALSE(epolls.AnyIn(11, 19));
  EXPECT_FALSE(epolls.AnyIn(21, UINT_MAX));
}

TEST(HostEpollsTest, ForgetAndForgetInDropOnlyTheirFds) {
  HostEpolls epolls;
  epolls.Add(5);
  epolls.Add(10);
  epolls.Add(20);
  epolls.Add(30);
  epolls.Forget(10);
  EXPECT_FALSE(epolls.Has(10));
  EXPECT_TRUE(epolls.Has(5));
  EXPECT_TRUE(epolls.Has(20));
  epolls.Forget(11);  // not one of them: nothing changes
  EXPECT_TRUE(epolls.Has(5));
  EXPECT_TRUE(epolls.Has(20));
  EXPECT_TRUE(epolls.Has(30));
  // Inclusive at both ends.
  epolls.ForgetIn(5, 20);
  EXPECT_FALSE(epolls.Has(5));
  EXPECT_FALSE(epolls.Has(20));
  EXPECT_TRUE(epolls.Has(30));
  EXPECT_FALSE(epolls.AnyIn(0, 29));
  epolls.ForgetIn(30, UINT_MAX);
  EXPECT_FALSE(epolls.AnyIn(0, UINT_MAX));
}

TEST(HostEpollsTest, AnEpollFdDuplicatedTwiceIsKnownUnderEachNumber) {
  HostEpolls epolls;
  epolls.Add(4);
  epolls.Add(9);  // dup(4): the same set under another number
  epolls.Forget(4);
  EXPECT_FALSE(epolls.Has(4));
  EXPECT_TRUE(epolls.Has(9)) << "still open under its other number";
}

TEST(HostEpollsTest, PastTheLimitTheSetsAreUnknownForGood) {
  HostEpolls epolls;
  for (int i = 0; i < HostEpolls::kMaxEpolls; ++i) epolls.Add(100 + i);
  EXPECT_FALSE(epolls.unknown()) << "exactly kMaxEpolls fit";
  for (int i = 0; i < HostEpolls::kMaxEpolls; ++i) {
    EXPECT_TRUE(epolls.Has(100 + i)) << i;
  }
  epolls.Add(500);
  EXPECT_TRUE(epolls.unknown());
  EXPECT_FALSE(epolls.Has(500)) << "not kept";
  // Closing known ones frees slots, but the one that did not fit is still
  // open somewhere: the sets stay unknown.
  epolls.Forget(100);
  epolls.ForgetIn(101, 104);
  EXPECT_TRUE(epolls.unknown());
  epolls.Add(600);
  EXPECT_TRUE(epolls.Has(600)) << "a freed slot is used again";
  EXPECT_TRUE(epolls.unknown());
}

// A socket the library keeps open past the host's close must leave every
// known set first, or the sets would go on reporting it.
TEST(HostEpollsTest, RemoveFromAllTakesTheSocketOutOfEveryKnownSet) {
  int pair[2] = {-1, -1};
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const int fd = pair[0];
  const int first = epoll_create1(EPOLL_CLOEXEC);
  const int second = epoll_create1(EPOLL_CLOEXEC);
  const int unknown = epoll_create1(EPOLL_CLOEXEC);  // never Added
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  ASSERT_GE(unknown, 0);
  for (const int epfd : {first, second, unknown}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    ASSERT_EQ(epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event), 0);
  }
  ASSERT_EQ(write(pair[1], "x", 1), 1);  // fd is readable
  const auto ready = [fd](int epfd) {
    epoll_event events[4];
    const int n = epoll_wait(epfd, events, 4, 0);
    return n == 1 && events[0].data.fd == fd;
  };
  ASSERT_TRUE(ready(first));
  ASSERT_TRUE(ready(second));
  ASSERT_TRUE(ready(unknown));

  HostEpolls epolls;
  epolls.Add(first);
  epolls.Add(second);
  epolls.RemoveFromAll(fd);
  epoll_event events[4];
  EXPECT_EQ(epoll_wait(first, events, 4, 0), 0);
  EXPECT_EQ(epoll_wait(second, events, 4, 0), 0);
  EXPECT_TRUE(ready(unknown)) << "only the sets it knows";
  // Not in the sets any more: a second removal fails quietly (ENOENT).
  epolls.RemoveFromAll(fd);
  EXPECT_EQ(epoll_wait(first, events, 4, 0), 0);
  // The socket itself is untouched.
  char c = 0;
  EXPECT_EQ(read(fd, &c, 1), 1);
  EXPECT_EQ(c, 'x');
  for (const int f : {first, second, unknown, pair[0], pair[1]}) close(f);
}

TEST(HostEpollsTest, RemoveFromAllWithNoSetsKnownDoesNothing) {
  int pair[2] = {-1, -1};
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const int epfd = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(epfd, 0);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = pair[0];
  ASSERT_EQ(epoll_ctl(epfd, EPOLL_CTL_ADD, pair[0], &event), 0);
  ASSERT_EQ(write(pair[1], "x", 1), 1);
  HostEpolls epolls;
  epolls.Add(epfd);
  epolls.Forget(epfd);  // closed as far as the library knows
  epolls.RemoveFromAll(pair[0]);
  epoll_event events[2];
  EXPECT_EQ(epoll_wait(epfd, events, 2, 0), 1);
  for (const int f : {epfd, pair[0], pair[1]}) close(f);
}

}  // namespace
}  // namespace trafficrate
