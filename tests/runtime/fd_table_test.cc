#include "src/runtime/fd_table.h"

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::kWaitNs;
using testing_util::PollUntil;

std::unique_ptr<FdTable> MakeTable(int capacity) {
  return std::unique_ptr<FdTable>(FdTable::Create(capacity));
}

TEST(FdTableTest, PackedStateRoundTrips) {
  struct Case {
    uint32_t conn;
    uint32_t cookie;
  };
  for (const Case c : {Case{0, 0}, Case{1, 1}, Case{6895, 12345},
                       Case{0xfffffffe, 0x7fffffff}, Case{7, 0x40000001}}) {
    const uint64_t state = PackState(c.conn, c.cookie);
    EXPECT_NE(state, 0u) << "a tracked state is never 0";
    EXPECT_NE(state & kTracked, 0u);
    EXPECT_EQ(StateConn(state), c.conn);
    EXPECT_EQ(StateCookie(state), c.cookie);
  }
}

TEST(FdTableTest, PackStateKeepsThirtyOneCookieBits) {
  // Zone cookies are seq & 0x7fffffff; the top bit is the tracked flag.
  const uint64_t state = PackState(3, 0xffffffffu);
  EXPECT_EQ(StateCookie(state), 0x7fffffffu);
  EXPECT_EQ(StateConn(state), 3u);
  EXPECT_EQ(state, kTracked | (uint64_t{0x7fffffff} << 32) | 3u);
  EXPECT_EQ(PackState(3, 0x80000005u), PackState(3, 5));
}

TEST(FdTableTest, CreateRefusesNonPositiveCapacity) {
  EXPECT_EQ(FdTable::Create(0), nullptr);
  EXPECT_EQ(FdTable::Create(-5), nullptr);
}

TEST(FdTableTest, GetReturnsZeroedEntriesWithinCapacityOnly) {
  std::unique_ptr<FdTable> table = MakeTable(100);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->capacity(), 100);
  EXPECT_EQ(table->Get(-1), nullptr);
  EXPECT_EQ(table->Get(100), nullptr);
  EXPECT_EQ(table->Get(1 << 30), nullptr);
  ASSERT_NE(table->Get(0), nullptr);
  ASSERT_NE(table->Get(99), nullptr);
  EXPECT_EQ(table->Get(99) - table->Get(0), 99);
  for (int fd = 0; fd < 100; ++fd) {
    const FdEntry& e = *table->Get(fd);
    EXPECT_EQ(e.state.load(), 0u);
    EXPECT_EQ(e.applied.load(), 0u);
    EXPECT_EQ(e.busy.load(), 0u);
  }
}

TEST(FdTableTest, LargeTableCommitsOnlyWhatIsTouched) {
  // One million entries (24 MB) reserved; only touched pages are used.
  std::unique_ptr<FdTable> table = MakeTable(1 << 20);
  ASSERT_NE(table, nullptr);
  table->Get((1 << 20) - 1)->state.store(PackState(1, 1));
  EXPECT_EQ(StateConn(table->Get((1 << 20) - 1)->state.load()), 1u);
  EXPECT_EQ(table->Get(1 << 20), nullptr);
}

TEST(FdTableTest, HighWaterIsOnePastTheHighestTrackedFd) {
  std::unique_ptr<FdTable> table = MakeTable(64);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->high_water(), 0);
  table->NoteTracked(5);
  EXPECT_EQ(table->high_water(), 6);
  table->NoteTracked(3);
  EXPECT_EQ(table->high_water(), 6) << "it never goes down";
  table->NoteTracked(0);
  EXPECT_EQ(table->high_water(), 6);
  table->NoteTracked(41);
  EXPECT_EQ(table->high_water(), 42);
}

TEST(FdTableTest, HighWaterFromManyThreadsIsTheMaximum) {
  std::unique_ptr<FdTable> table = MakeTable(4096);
  ASSERT_NE(table, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&table, t] {
      for (int fd = t; fd < 4000; fd += kThreads) table->NoteTracked(fd);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(table->high_water(), 4000);
}

TEST(FdTableTest, TryPinPinsOnlyWhileTheStateMatches) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(3);
  const uint64_t state = PackState(10, 20);
  e.state.store(state);
  EXPECT_FALSE(FdTable::TryPin(e, PackState(10, 21), false));
  EXPECT_EQ(e.busy.load(), 0u) << "a failed pin leaves it free";
  EXPECT_FALSE(FdTable::TryPin(e, PackState(10, 21), true));
  EXPECT_EQ(e.busy.load(), 0u);
  ASSERT_TRUE(FdTable::TryPin(e, state, false));
  EXPECT_EQ(e.busy.load(), 1u);
  FdTable::Unpin(e);
  EXPECT_EQ(e.busy.load(), 0u);
  ASSERT_TRUE(FdTable::TryPin(e, state, true));
  FdTable::Unpin(e);
}

TEST(FdTableTest, TryPinWithoutWaitFailsWhileAnotherHoldsThePin) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(1);
  const uint64_t state = PackState(1, 1);
  e.state.store(state);
  ASSERT_TRUE(FdTable::TryPin(e, state, false));
  EXPECT_FALSE(FdTable::TryPin(e, state, false));
  EXPECT_EQ(e.busy.load(), 1u) << "the holder keeps its pin";
  FdTable::Unpin(e);
  EXPECT_TRUE(FdTable::TryPin(e, state, false));
  FdTable::Unpin(e);
}

TEST(FdTableTest, TryPinWithWaitGetsThePinOnlyAfterTheHolderUnpins) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(2);
  const uint64_t state = PackState(2, 2);
  e.state.store(state);
  ASSERT_TRUE(FdTable::TryPin(e, state, false));
  std::atomic<bool> started{false};
  std::atomic<bool> pinned{false};
  std::thread waiter([&] {
    started.store(true);
    // TryPin may give up after its bounded wait; a watcher would retry on
    // its next pass, and so does this one (bounded in time).
    const int64_t deadline = MonotonicNowNs() + kWaitNs;
    while (MonotonicNowNs() < deadline) {
      if (FdTable::TryPin(e, state, true)) {
        pinned.store(true);
        return;
      }
    }
  });
  EXPECT_TRUE(PollUntil([&] { return started.load(); }));
  bool pinned_twice = false;
  for (int i = 0; i < 200; ++i) {
    pinned_twice |= pinned.load();
    sched_yield();
  }
  FdTable::Unpin(e);
  waiter.join();
  EXPECT_FALSE(pinned_twice) << "two holders at once";
  EXPECT_TRUE(pinned.load());
  EXPECT_EQ(e.busy.load(), 1u);
  FdTable::Unpin(e);
}

TEST(FdTableTest, UntrackClearsTheStateAndReturnsIt) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(4);
  const uint64_t state = PackState(4, 9);
  e.state.store(state);
  EXPECT_EQ(FdTable::Untrack(e), state);
  EXPECT_EQ(e.state.load(), 0u);
  EXPECT_EQ(FdTable::Untrack(e), 0u) << "untracking twice returns 0";
  EXPECT_FALSE(FdTable::TryPin(e, state, false)) << "the old state is gone";
}

TEST(FdTableTest, UntrackWaitsForThePinHolder) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(5);
  const uint64_t state = PackState(5, 5);
  e.state.store(state);
  ASSERT_TRUE(FdTable::TryPin(e, state, false));
  std::atomic<bool> returned{false};
  std::atomic<uint64_t> untracked{0};
  std::thread closer([&] {
    untracked.store(FdTable::Untrack(e));
    returned.store(true);
  });
  // The closer cleared the state and is now waiting for our pin.
  const bool cleared = PollUntil([&] { return e.state.load() == 0; });
  bool returned_while_pinned = false;
  for (int i = 0; i < 200 && !returned_while_pinned; ++i) {
    returned_while_pinned = returned.load();
    sched_yield();
  }
  FdTable::Unpin(e);
  closer.join();
  EXPECT_TRUE(cleared);
  EXPECT_FALSE(returned_while_pinned) << "Untrack returned while pinned";
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(untracked.load(), state);
}

// A pin holder (the watcher, between its state check and setsockopt) can be
// preempted for milliseconds on a loaded machine. A close that stopped
// waiting then would let it act on a reused fd number.
TEST(FdTableTest, UntrackKeepsWaitingForAPreemptedPinHolder) {
  constexpr int64_t kPreemptedNs = 50 * kNsPerMs;
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(6);
  const uint64_t state = PackState(6, 6);
  e.state.store(state);
  ASSERT_TRUE(FdTable::TryPin(e, state, false));
  std::atomic<bool> returned{false};
  std::thread closer([&] {
    FdTable::Untrack(e);
    returned.store(true);
  });
  const bool cleared = PollUntil([&] { return e.state.load() == 0; });
  // Play a holder that is off the CPU for a while, checking all along.
  bool returned_while_pinned = false;
  const int64_t until = MonotonicNowNs() + kPreemptedNs;
  for (int i = 0; i < 1000 && MonotonicNowNs() < until; ++i) {
    returned_while_pinned |= returned.load();
    SleepNs(kNsPerMs);
  }
  returned_while_pinned |= returned.load();
  FdTable::Unpin(e);
  closer.join();
  EXPECT_TRUE(cleared);
  EXPECT_FALSE(returned_while_pinned)
      << "Untrack gave up while the holder was preempted";
}

TEST(FdTableTest, ClearPinsAfterForkReleasesPinsBelowHighWater) {
  std::unique_ptr<FdTable> table = MakeTable(16);
  for (int fd = 0; fd < 10; ++fd) {
    FdEntry& e = *table->Get(fd);
    e.state.store(PackState(fd, 1));
    ASSERT_TRUE(FdTable::TryPin(e, e.state.load(), false));
    table->NoteTracked(fd);
  }
  table->ClearPinsAfterFork();
  for (int fd = 0; fd < 10; ++fd) {
    FdEntry& e = *table->Get(fd);
    EXPECT_EQ(e.busy.load(), 0u) << fd;
    EXPECT_EQ(StateConn(e.state.load()), static_cast<uint32_t>(fd))
        << "states are kept";
    EXPECT_TRUE(FdTable::TryPin(e, e.state.load(), false));
    FdTable::Unpin(e);
  }
}

// The watcher-versus-close race. Closer threads play a host that closes fd
// numbers and accepts new sockets on the same numbers: Untrack, then (the
// fd is now closed) bump the entry's generation, then publish a new state
// whose cookie is that generation. A watcher thread pins entries and "acts"
// on them. While pinned, the entry's generation must equal the cookie of the
// state it pinned: otherwise it acted on an fd that was closed (and maybe
// reused) after Untrack returned.
TEST(FdTableTest, PinnedWatcherNeverActsOnAnEntryClosedAfterUntrack) {
  constexpr int kEntries = 8;
  constexpr int kClosers = 2;
  constexpr int64_t kRunNs = 200 * kNsPerMs;
  constexpr int kMaxRounds = 200'000;
  std::unique_ptr<FdTable> table = MakeTable(kEntries);
  ASSERT_NE(table, nullptr);
  std::atomic<uint32_t> generation[kEntries];
  for (int fd = 0; fd < kEntries; ++fd) {
    generation[fd].store(1);
    table->Get(fd)->state.store(PackState(fd, 1));
    table->NoteTracked(fd);
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acts{0};
  std::atomic<uint64_t> stale_acts{0};
  std::atomic<uint64_t> closes{0};
  std::atomic<uint64_t> bad_untracks{0};

  std::thread watcher([&] {
    for (int round = 0; round < kMaxRounds && !stop.load(); ++round) {
      for (int fd = 0; fd < kEntries; ++fd) {
        FdEntry& e = *table->Get(fd);
        const uint64_t state = e.state.load(std::memory_order_acquire);
        if (state == 0 || !FdTable::TryPin(e, state, round % 2 == 0)) continue;
        // Acting: the fd must be the one the state was published for, for
        // the whole time we hold the pin.
        bool stale = false;
        for (int i = 0; i < 4; ++i) {
          if (generation[fd].load() != StateCookie(state)) stale = true;
        }
        const uint64_t now = e.state.load();
        if (now != state && now != 0) stale = true;
        FdTable::Unpin(e);
        acts.fetch_add(1, std::memory_order_relaxed);
        if (stale) stale_acts.fetch_add(1, std::memory_order_relaxed);
      }
    }
  });
  std::vector<std::thread> closers;
  for (int t = 0; t < kClosers; ++t) {
    closers.emplace_back([&, t] {
      for (int round = 0; round < kMaxRounds && !stop.load(); ++round) {
        for (int fd = t; fd < kEntries; fd += kClosers) {
          FdEntry& e = *table->Get(fd);
          const uint32_t gen = generation[fd].load();
          // Only this thread writes this entry's state: Untrack returns it.
          if (FdTable::Untrack(e) != PackState(fd, gen)) {
            bad_untracks.fetch_add(1, std::memory_order_relaxed);
          }
          // close(fd) ran; accept() returns the same number.
          const uint32_t next = (gen + 1) & 0x7fffffffu;
          generation[fd].store(next);
          e.state.store(PackState(fd, next), std::memory_order_release);
          closes.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  const int64_t deadline = MonotonicNowNs() + kRunNs;
  PollUntil([&] { return MonotonicNowNs() >= deadline; }, kRunNs + kWaitNs);
  stop.store(true);
  watcher.join();
  for (std::thread& closer : closers) closer.join();

  EXPECT_EQ(stale_acts.load(), 0u) << "of " << acts.load() << " acts";
  EXPECT_EQ(bad_untracks.load(), 0u);
  EXPECT_GT(acts.load(), 100u) << "the watcher barely ran";
  EXPECT_GT(closes.load(), 100u) << "the closers barely ran";
  for (int fd = 0; fd < kEntries; ++fd) {
    EXPECT_EQ(table->Get(fd)->busy.load(), 0u);
  }
}

}  // namespace
}  // namespace trafficrate
