// The process's view of its zone connection slots: the refs word counts
// this process's fds per registration (cookie), an older registration's
// count starts again and never goes below zero; Reset forgets what was
// known of the slot but not its refs; StartRest begins a new rest; ok() is
// false without memory; ConnValid tells a reused slot from the
// registration an fd state names.

#include "src/runtime/local_conns.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "src/runtime/fd_table.h"
#include "src/shm/conn_table.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

constexpr uint32_t kCapacity = 64;
constexpr uint32_t kCookie = 7;

TEST(LocalConnsTest, ReservesTheCapacityZeroFilled) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local.capacity(), kCapacity);
  for (uint32_t i : {0u, 1u, kCapacity / 2, kCapacity - 1}) {
    EXPECT_EQ(local[i].refs.load(), 0u) << i;
    EXPECT_EQ(local[i].last_send_ns.load(), 0) << i;
    EXPECT_EQ(local.Refs(i, 0), 0u) << i;
  }
  // Entries are distinct memory.
  EXPECT_NE(&local[0], &local[1]);
  EXPECT_EQ(&local[kCapacity - 1] - &local[0],
            static_cast<ptrdiff_t>(kCapacity - 1));
}

TEST(LocalConnsTest, NotOkWithoutMemory) {
  // A zero-sized reservation is refused by the kernel: nothing is governed.
  LocalConns none(0);
  EXPECT_FALSE(none.ok());
  EXPECT_EQ(none.capacity(), 0u);
}

TEST(LocalConnsTest, RefsCountTheFdsOfOneRegistration) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local.Refs(3, kCookie), 0u);
  local.AddRef(3, kCookie);
  EXPECT_EQ(local.Refs(3, kCookie), 1u);
  local.AddRef(3, kCookie);
  local.AddRef(3, kCookie);
  EXPECT_EQ(local.Refs(3, kCookie), 3u);
  // Other entries and other cookies see none of it.
  EXPECT_EQ(local.Refs(4, kCookie), 0u);
  EXPECT_EQ(local.Refs(3, kCookie + 1), 0u);
  EXPECT_FALSE(local.DropRef(3, kCookie));
  EXPECT_FALSE(local.DropRef(3, kCookie));
  EXPECT_EQ(local.Refs(3, kCookie), 1u);
  EXPECT_TRUE(local.DropRef(3, kCookie)) << "the last fd on it went";
  EXPECT_EQ(local.Refs(3, kCookie), 0u);
  EXPECT_EQ(local[3].refs.load(), uint64_t{kCookie} << 32);
}

TEST(LocalConnsTest, DropRefNeverGoesBelowZero) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local.DropRef(5, 0)) << "nothing held";
  EXPECT_EQ(local[5].refs.load(), 0u);
  local.AddRef(5, kCookie);
  EXPECT_TRUE(local.DropRef(5, kCookie));
  EXPECT_FALSE(local.DropRef(5, kCookie)) << "already at zero";
  EXPECT_EQ(local.Refs(5, kCookie), 0u);
  EXPECT_EQ(local[5].refs.load(), uint64_t{kCookie} << 32);
}

TEST(LocalConnsTest, ANewerRegistrationStartsAgainAtOne) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  local.AddRef(9, kCookie);
  local.AddRef(9, kCookie);
  // The slot was freed and taken again (a new cookie) while two fds of
  // the old registration were still open here.
  local.AddRef(9, kCookie + 2);
  EXPECT_EQ(local.Refs(9, kCookie + 2), 1u);
  EXPECT_EQ(local.Refs(9, kCookie), 0u) << "the old count is gone";
  // The old registration's fds closing change nothing.
  EXPECT_FALSE(local.DropRef(9, kCookie));
  EXPECT_FALSE(local.DropRef(9, kCookie));
  EXPECT_EQ(local.Refs(9, kCookie + 2), 1u);
  EXPECT_TRUE(local.DropRef(9, kCookie + 2));
  EXPECT_EQ(local.Refs(9, kCookie + 2), 0u);
}

TEST(LocalConnsTest, TheCookieTakesTheUpperHalfOfTheWord) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  const uint32_t cookie = 0x7fffffffu;  // the largest a zone gives
  local.AddRef(0, cookie);
  local.AddRef(0, cookie);
  EXPECT_EQ(local[0].refs.load(), uint64_t{cookie} << 32 | 2);
  EXPECT_EQ(local.Refs(0, cookie), 2u);
  EXPECT_EQ(local.Refs(0, 2), 0u) << "the count is not taken for a cookie";
}

TEST(LocalConnsTest, ResetForgetsTheSlotButKeepsItsRefs) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  LocalConn& c = local[11];
  // What an earlier registration of this slot left.
  c.last_send_ns.store(111);
  c.next_measure_ns.store(222);
  c.next_idle_check_ns.store(444);
  c.idle_queued.store(555);
  c.idle_queued_ns.store(666);
  c.applied_ns.store(777);
  c.piece.store(1200);
  c.first_left.store(3);
  c.mss.store(1448);
  c.kernel_base.store(999);
  c.rest_written.store(1000);
  c.rest_look_ns.store(1001);
  c.rest_gap_ns.store(1002);
  c.meter.measured_left.store(5000);
  c.meter.measured_ns.store(6000);
  c.meter.left_rate.store(7000);
  c.meter.packet_bytes.store(2896);
  c.meter.slow.store(true);
  // As the registry does: the new registration's ref, then the reset.
  local.AddRef(11, kCookie);
  local.Reset(11, /*now_ns=*/123'456, /*first_pieces=*/10);
  EXPECT_EQ(local.Refs(11, kCookie), 1u);
  EXPECT_EQ(c.last_send_ns.load(), 123'456) << "sending as of now";
  EXPECT_EQ(c.next_measure_ns.load(), 0);
  EXPECT_EQ(c.next_idle_check_ns.load(), 0);
  EXPECT_EQ(c.idle_queued.load(), 0u);
  EXPECT_EQ(c.idle_queued_ns.load(), 0);
  EXPECT_EQ(c.applied_ns.load(), 0);
  EXPECT_EQ(c.piece.load(), 0u);
  EXPECT_EQ(c.mss.load(), 0u);
  EXPECT_EQ(c.first_left.load(), 10u);
  EXPECT_EQ(c.kernel_base.load(), kNoKernelBase);
  EXPECT_EQ(c.rest_written.load(), kNoKernelBase);
  EXPECT_EQ(c.rest_look_ns.load(), 0);
  EXPECT_EQ(c.rest_gap_ns.load(), 0);
  EXPECT_EQ(c.meter.measured_left.load(), 0u);
  EXPECT_EQ(c.meter.measured_ns.load(), 0);
  EXPECT_EQ(c.meter.left_rate.load(), 0u);
  EXPECT_EQ(c.meter.packet_bytes.load(), 0u);
  EXPECT_FALSE(c.meter.slow.load());
  // Its neighbours are untouched.
  EXPECT_EQ(local[10].last_send_ns.load(), 0);
  EXPECT_EQ(local[12].kernel_base.load(), 0u);
}

TEST(LocalConnsTest, StartRestForgetsOnlyTheRestLooks) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  local.AddRef(2, kCookie);
  local.Reset(2, 50, 0);
  LocalConn& c = local[2];
  c.rest_written.store(4096);
  c.rest_look_ns.store(70);
  c.rest_gap_ns.store(80);
  c.kernel_base.store(12);
  c.idle_queued.store(34);
  local.StartRest(2);
  EXPECT_EQ(c.rest_written.load(), kNoKernelBase) << "not looked yet";
  EXPECT_EQ(c.rest_look_ns.load(), 0);
  EXPECT_EQ(c.rest_gap_ns.load(), 0);
  EXPECT_EQ(c.last_send_ns.load(), 50);
  EXPECT_EQ(c.kernel_base.load(), 12u);
  EXPECT_EQ(c.idle_queued.load(), 34u);
  EXPECT_EQ(local.Refs(2, kCookie), 1u);
}

// Any thread may use any entry: fds of one registration opened and closed
// on many threads at once leave an exact count, and exactly one DropRef
// reports the last one.
TEST(LocalConnsTest, RefsFromManyThreadsAddUp) {
  LocalConns local(kCapacity);
  ASSERT_TRUE(local.ok());
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  local.AddRef(1, kCookie);  // held throughout: no DropRef is the last
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&local] {
      for (int i = 0; i < kRounds; ++i) {
        local.AddRef(1, kCookie);
        local.AddRef(1, kCookie);
        EXPECT_FALSE(local.DropRef(1, kCookie));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(local.Refs(1, kCookie), 1u + kThreads * kRounds);
  std::atomic<int> last{0};
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        if (local.DropRef(1, kCookie)) last.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(local.Refs(1, kCookie), 1u);
  EXPECT_EQ(last.load(), 0);
  EXPECT_TRUE(local.DropRef(1, kCookie));
  EXPECT_EQ(local.Refs(1, kCookie), 0u);
}

using ConnValidTest = testing_util::ZoneFixture;

// An fd state names one registration of a slot: once the slot is freed,
// and when it is taken again by another connection, the state no longer
// names it.
TEST_F(ConnValidTest, OnlyTheRegistrationTheStateNamesIsValid) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const ConnSlotShm& slot = zone->conns().slot(c);
  const uint64_t state =
      FdState::Conn(c, ConnTable::CookieOf(slot.seq.load())).word();
  EXPECT_TRUE(ConnValid(slot, state));
  EXPECT_FALSE(ConnValid(
      slot, FdState::Conn(c, FdState::From(state).cookie() + 2).word()));
  zone->conns().DeregisterLocked(c);
  EXPECT_FALSE(ConnValid(slot, state)) << "freed";
  ASSERT_EQ(RegisterLocked(*zone, 2, 0), c) << "the free list is LIFO";
  EXPECT_FALSE(ConnValid(slot, state)) << "reused by another connection";
  const uint64_t fresh =
      FdState::Conn(c, ConnTable::CookieOf(slot.seq.load())).word();
  EXPECT_TRUE(ConnValid(slot, fresh));
  EXPECT_NE(fresh, state);
}

}  // namespace
}  // namespace trafficrate
