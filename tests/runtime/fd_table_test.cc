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

// FdState's encode and decode, tested here once: its users trust them.
TEST(FdStateTest, AConnectionRoundTripsItsIndexAndCookie) {
  struct Case {
    uint32_t conn;
    uint32_t cookie;
  };
  for (const Case c : {Case{0, 0}, Case{1, 1}, Case{6895, 12345},
                       Case{0xfffffffe, 0x7fffffff}, Case{7, 0x40000001}}) {
    const FdState state = FdState::Conn(c.conn, c.cookie);
    EXPECT_FALSE(state.empty()) << "a connection's state is never 0";
    EXPECT_TRUE(state.is_conn());
    EXPECT_EQ(state.conn(), c.conn);
    EXPECT_EQ(state.cookie(), c.cookie);
    EXPECT_FALSE(state.kept_drain()) << "whatever the cookie's bit 30";
    EXPECT_FALSE(state.pending());
    EXPECT_EQ(FdState::From(state.word()), state);
  }
}

TEST(FdStateTest, AConnectionKeepsThirtyOneCookieBits) {
  // Zone cookies are seq & 0x7fffffff; the top bit is the connection tag.
  const FdState state = FdState::Conn(3, 0xffffffffu);
  EXPECT_EQ(state.cookie(), 0x7fffffffu);
  EXPECT_EQ(state.conn(), 3u);
  EXPECT_EQ(state.word(), 1ULL << 63 | uint64_t{0x7fffffff} << 32 | 3u);
  EXPECT_EQ(FdState::Conn(3, 0x80000005u), FdState::Conn(3, 5));
}

TEST(FdStateTest, NotGovernedIsZero) {
  EXPECT_EQ(FdState().word(), 0u);
  EXPECT_TRUE(FdState().empty());
  EXPECT_TRUE(FdState::From(0).empty());
  EXPECT_FALSE(FdState().is_conn());
  EXPECT_FALSE(FdState().kept_drain());
  EXPECT_FALSE(FdState().pending());
}

TEST(FdStateTest, AKeptDrainRoundTripsItsSlotAndHasNoConnection) {
  for (const uint32_t slot : {0u, 1u, 1023u, 0x3fffffffu}) {
    const FdState state = FdState::KeptDrain(slot);
    EXPECT_EQ(state.word(), 1ULL << 62 | uint64_t{slot} << 32 | 0xffffffffu);
    EXPECT_TRUE(state.kept_drain());
    EXPECT_EQ(state.drain_slot(), slot);
    EXPECT_FALSE(state.empty());
    EXPECT_FALSE(state.is_conn());
    EXPECT_FALSE(state.pending());
    EXPECT_EQ(state.conn(), 0xffffffffu) << "beyond every zone's capacity";
  }
  EXPECT_EQ(FdState::KeptDrain(0x40000005u), FdState::KeptDrain(5))
      << "30 bits: the slot never reaches the tags";
}

TEST(FdStateTest, PendingAloneAndOfAGroupRoundTripTheirFirstFd) {
  const FdState alone = FdState::Pending();
  EXPECT_EQ(alone.word(), 1ULL << 61 | 0xffffffffu);
  EXPECT_TRUE(alone.pending());
  EXPECT_EQ(alone.pending_first_fd(), -1);
  EXPECT_FALSE(alone.kept_drain());
  EXPECT_FALSE(alone.is_conn());
  EXPECT_EQ(alone.conn(), 0xffffffffu) << "beyond every zone's capacity";
  for (const int fd : {0, 1, 1000, (1 << 29) - 2}) {
    const FdState group = FdState::PendingGroup(fd);
    EXPECT_EQ(group.word(), 1ULL << 61 | uint64_t(fd + 1) << 32 | 0xffffffffu);
    EXPECT_TRUE(group.pending());
    EXPECT_EQ(group.pending_first_fd(), fd);
    EXPECT_NE(group, alone);
    EXPECT_FALSE(group.kept_drain());
    EXPECT_FALSE(group.is_conn());
    EXPECT_EQ(group.conn(), 0xffffffffu);
  }
  // Another tag bit, or a connection index, is no pending state.
  EXPECT_FALSE(FdState::From(alone.word() | 1ULL << 62).pending());
  EXPECT_FALSE(FdState::From(alone.word() - 1).pending());
}

TEST(ShareGenerationsTest, RoundTripsBothGenerations) {
  const ShareGenerations token = ShareGenerations::Of(7, 0xfffffffeu);
  EXPECT_EQ(token.word(), uint64_t{7} << 32 | 0xfffffffeu);
  EXPECT_EQ(token.settings_generation(), 7u);
  EXPECT_EQ(token.key_generation(), 0xfffffffeu);
  EXPECT_EQ(ShareGenerations::From(token.word()), token);
  EXPECT_NE(ShareGenerations::Of(8, 0xfffffffeu), token);
  EXPECT_NE(ShareGenerations::Of(7, 0xffffffffu), token);
  EXPECT_EQ(ShareGenerations::NeverApplied().word(), ~uint64_t{0});
  EXPECT_NE(ShareGenerations::Of(0, 0), ShareGenerations::NeverApplied());
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
  table->Get((1 << 20) - 1)->state.store(FdState::Conn(1, 1).word());
  EXPECT_EQ(FdState::From(table->Get((1 << 20) - 1)->state.load()).conn(), 1u);
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
  const uint64_t state = FdState::Conn(10, 20).word();
  e.state.store(state);
  EXPECT_FALSE(FdTable::TryPin(e, FdState::Conn(10, 21).word(), false));
  EXPECT_EQ(e.busy.load(), 0u) << "a failed pin leaves it free";
  EXPECT_FALSE(FdTable::TryPin(e, FdState::Conn(10, 21).word(), true));
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
  const uint64_t state = FdState::Conn(1, 1).word();
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
  const uint64_t state = FdState::Conn(2, 2).word();
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
  const uint64_t state = FdState::Conn(4, 9).word();
  e.state.store(state);
  EXPECT_EQ(FdTable::Untrack(e), state);
  EXPECT_EQ(e.state.load(), 0u);
  EXPECT_EQ(FdTable::Untrack(e), 0u) << "untracking twice returns 0";
  EXPECT_FALSE(FdTable::TryPin(e, state, false)) << "the old state is gone";
}

TEST(FdTableTest, UntrackWaitsForThePinHolder) {
  std::unique_ptr<FdTable> table = MakeTable(8);
  FdEntry& e = *table->Get(5);
  const uint64_t state = FdState::Conn(5, 5).word();
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
  const uint64_t state = FdState::Conn(6, 6).word();
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
    e.state.store(FdState::Conn(fd, 1).word());
    ASSERT_TRUE(FdTable::TryPin(e, e.state.load(), false));
    table->NoteTracked(fd);
  }
  table->ClearPinsAfterFork();
  for (int fd = 0; fd < 10; ++fd) {
    FdEntry& e = *table->Get(fd);
    EXPECT_EQ(e.busy.load(), 0u) << fd;
    EXPECT_EQ(FdState::From(e.state.load()).conn(), static_cast<uint32_t>(fd))
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
    table->Get(fd)->state.store(FdState::Conn(fd, 1).word());
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
          if (generation[fd].load() != FdState::From(state).cookie())
            stale = true;
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
          if (FdTable::Untrack(e) != FdState::Conn(fd, gen).word()) {
            bad_untracks.fetch_add(1, std::memory_order_relaxed);
          }
          // close(fd) ran; accept() returns the same number.
          const uint32_t next = (gen + 1) & 0x7fffffffu;
          generation[fd].store(next);
          e.state.store(FdState::Conn(fd, next).word(),
                        std::memory_order_release);
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
