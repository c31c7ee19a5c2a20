// The watcher's schedule on a clock of the test's own (tests/base/
// fake_clock.h): which duty runs when, how changes are coalesced and pull
// the next budget tick forward, and how late a wake was. No thread, no
// zone, no sleep.

#include "src/runtime/watcher_loop.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "tests/base/fake_clock.h"

namespace trafficrate {
namespace {

constexpr int64_t kMs = kNsPerMs;

using testing_util::FakeClock;

// The change word, bumped at the times a test gives; a wait without a change
// lasts its timeout plus `late_ns` (a watcher that got no CPU).
class FakeChanges final : public ChangeSignal {
 public:
  explicit FakeChanges(FakeClock* clock) : clock_(clock) {}
  uint32_t Word() const override { return word_; }
  void Wait(uint32_t seen, int64_t timeout_ns) const override {
    if (word_ != seen) return;
    const int64_t deadline = clock_->NowNs() + std::max<int64_t>(timeout_ns, 0);
    if (next_ < changes_.size() && changes_[next_] <= deadline) {
      clock_->SetNs(std::max(clock_->NowNs(), changes_[next_++]));
      ++word_;
      return;
    }
    clock_->SetNs(deadline + late_ns);
  }
  // A join or leave somewhere at `at_ns` (in order).
  void ChangeAt(int64_t at_ns) { changes_.push_back(at_ns); }

  int64_t late_ns = 0;

 private:
  FakeClock* const clock_;
  std::vector<int64_t> changes_;
  mutable size_t next_ = 0;
  mutable uint32_t word_ = 7;
};

// Records each duty with the time it ran.
class RecordingDuties final : public WatcherDuties {
 public:
  explicit RecordingDuties(const FakeClock* clock) : clock_(clock) {}
  bool CheckZone(int64_t) override { return zone_ok; }
  bool BudgetWanted() const override { return budget; }
  int64_t TickBudget(int64_t now_ns) override {
    ticks.push_back(now_ns);
    return now_ns + next_tick_after_ns;
  }
  void FinishDrains(int64_t now_ns) override { drains.push_back(now_ns); }
  void ApplyChangedShares() override { scans.push_back(clock_->NowNs()); }
  void ExpireIdle(int64_t now_ns) override { idle.push_back(now_ns); }
  void ReapDead() override { reaps.push_back(clock_->NowNs()); }
  void NoteWatcherLate(int64_t late_ns, int64_t) override {
    late.push_back(late_ns);
  }

  bool zone_ok = true;
  bool budget = false;
  int64_t next_tick_after_ns = kBudgetTickNs;
  std::vector<int64_t> ticks, drains, scans, idle, reaps, late;

 private:
  const FakeClock* const clock_;
};

class WatcherLoopTest : public ::testing::Test {
 protected:
  WatcherLoopTest() : changes_(&clock_), duties_(&clock_) {}

  // Runs passes until `for_ns` of the fake clock have gone by (bounded).
  void RunFor(WatcherLoop& loop, int64_t for_ns) {
    const int64_t end = clock_.NowNs() + for_ns;
    for (int i = 0; i < 100'000 && clock_.NowNs() < end; ++i) {
      ASSERT_TRUE(loop.Pass());
    }
    ASSERT_GE(clock_.NowNs(), end) << "the loop stopped moving the clock";
  }
  // Times relative to the start, in ms.
  std::vector<int64_t> Ms(const std::vector<int64_t>& times) const {
    std::vector<int64_t> out;
    for (const int64_t t : times) out.push_back((t - start_) / kMs);
    return out;
  }

  FakeClock clock_;
  FakeChanges changes_;
  RecordingDuties duties_;
  WatcherTiming timing_;  // idle 200 ms, coalesce 2 ms, reap 250 ms
  const int64_t start_ = clock_.NowNs();
};

TEST_F(WatcherLoopTest, EqualModeRunsIdlePassesReapsAndDrainsOnTheirOwnTimes) {
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  RunFor(loop, 1'000 * kMs);
  // A quarter of TRAFFICRATE_IDLE apart; a reap at once, then every 250 ms.
  std::vector<int64_t> idle;
  for (int64_t t = 50; t <= 1'000; t += 50) idle.push_back(t);
  EXPECT_EQ(Ms(duties_.idle), idle);
  EXPECT_EQ(Ms(duties_.reaps), (std::vector<int64_t>{0, 250, 500, 750, 1'000}));
  EXPECT_TRUE(duties_.ticks.empty());
  // Drains are finished on every wake.
  EXPECT_EQ(duties_.drains.size(), duties_.late.size());
  EXPECT_TRUE(duties_.scans.empty());
  for (const int64_t late : duties_.late) EXPECT_EQ(late, 0);
}

TEST_F(WatcherLoopTest, BudgetModeTicksAndTheOtherDutiesRideOnTheTicks) {
  duties_.budget = true;
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  RunFor(loop, 1'000 * kMs);
  ASSERT_EQ(duties_.ticks.size(), 50u);
  for (size_t i = 0; i < duties_.ticks.size(); ++i) {
    EXPECT_EQ(duties_.ticks[i] - start_,
              static_cast<int64_t>(i + 1) * 20 * kMs);
  }
  // The thread wakes only for ticks: every idle pass and reap rides on the
  // tick at most half a tick before its time, so with 50 ms idle passes
  // and 20 ms ticks they come every other tick.
  EXPECT_EQ(duties_.late.size(), duties_.ticks.size());
  std::vector<int64_t> idle;
  for (int64_t t = 40; t <= 1'000; t += 40) idle.push_back(t);
  EXPECT_EQ(Ms(duties_.idle), idle);
  EXPECT_EQ(Ms(duties_.reaps), (std::vector<int64_t>{20, 260, 500, 740, 980}));
  EXPECT_TRUE(duties_.drains.empty());
}

TEST_F(WatcherLoopTest, ChangesAreScannedAtMostOncePerCoalesceTime) {
  changes_.ChangeAt(start_ + 10 * kMs);
  changes_.ChangeAt(start_ + 10 * kMs + kMs / 2);
  changes_.ChangeAt(start_ + 30 * kMs);
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  RunFor(loop, 100 * kMs);
  // The second change, half a millisecond after the first, waits for the
  // coalesce time (2 ms) since the first scan.
  EXPECT_EQ(Ms(duties_.scans), (std::vector<int64_t>{10, 12, 30}));
}

TEST_F(WatcherLoopTest, AChangeBringsAFarBudgetTickToTheNextTick) {
  duties_.budget = true;
  duties_.next_tick_after_ns = 1'000 * kMs;  // nothing to decide for a while
  changes_.ChangeAt(start_ + 100 * kMs);
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  RunFor(loop, 300 * kMs);
  // The first tick at 20 ms sets the next a second later; the join at
  // 100 ms brings it to 120 ms (and that one's next is at 1 120 ms).
  ASSERT_GE(duties_.ticks.size(), 2u);
  EXPECT_EQ(Ms(duties_.ticks)[0], 20);
  EXPECT_EQ(Ms(duties_.ticks)[1], 120);
  EXPECT_EQ(Ms(duties_.scans), (std::vector<int64_t>{100}));
}

TEST_F(WatcherLoopTest, AChangeBeforeTheLoopStartedIsNotLost) {
  const uint32_t seen = changes_.Word();
  changes_.ChangeAt(start_);  // after `seen` was read, before the first pass
  WatcherLoop loop(&duties_, timing_, clock_, changes_, seen);
  ASSERT_TRUE(loop.Pass());
  EXPECT_EQ(Ms(duties_.scans), (std::vector<int64_t>{0}));
}

TEST_F(WatcherLoopTest, ALateWakeIsReportedWithHowLate) {
  duties_.budget = true;
  changes_.late_ns = 30 * kMs;
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  ASSERT_TRUE(loop.Pass());
  ASSERT_TRUE(loop.Pass());
  ASSERT_EQ(duties_.late.size(), 2u);
  EXPECT_EQ(duties_.late[0], 30 * kMs);
  EXPECT_EQ(duties_.late[1], 30 * kMs);
  // The tick runs when the loop woke, 50 ms in.
  EXPECT_EQ(Ms(duties_.ticks).front(), 50);
}

TEST_F(WatcherLoopTest, ACorruptZoneEndsTheLoopBeforeAnyDuty) {
  duties_.zone_ok = false;
  WatcherLoop loop(&duties_, timing_, clock_, changes_, changes_.Word());
  EXPECT_FALSE(loop.Pass());
  EXPECT_TRUE(duties_.late.empty());
  EXPECT_TRUE(duties_.reaps.empty());
  EXPECT_EQ(clock_.NowNs(), start_);
}

TEST(WatcherLoopTimingTest, IdlePassesAreAQuarterOfTheIdleTimeWithinBounds) {
  EXPECT_EQ(WatcherLoop::IdleTickNs(200 * kMs), 50 * kMs);
  EXPECT_EQ(WatcherLoop::IdleTickNs(2 * kMs), kMs);
  EXPECT_EQ(WatcherLoop::IdleTickNs(60'000 * kMs), 100 * kMs);
}

}  // namespace
}  // namespace trafficrate
