// The metering model (meter.h) on counts the test makes up: the rate and
// packet size a measurement learns, the estimate between measurements, the
// judgement of a connection that sends less than its pacing allows, and the
// gap to the next measurement.

#include "src/budget/meter.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/budget/cpu_budget.h"

namespace trafficrate {
namespace {

constexpr int64_t kMs = kNsPerMs;
constexpr int64_t kStart = 10 * kNsPerSec;

class ConnMeterTest : public ::testing::Test {
 protected:
  ConnMeterTest() { meter_.Reset(); }
  ConnMeter meter_;
};

TEST_F(ConnMeterTest, ARecordLearnsTheRateAveragedWithTheOneBefore) {
  meter_.Record(100'000, 1.0, kStart);
  EXPECT_EQ(meter_.left_rate.load(), 0u);  // one measurement: no rate yet
  meter_.Record(200'000, 1.0, kStart + 100 * kMs);
  EXPECT_EQ(meter_.left_rate.load(), 1'000'000u);
  meter_.Record(250'000, 1.0, kStart + 200 * kMs);
  EXPECT_EQ(meter_.left_rate.load(), 750'000u);  // (1 000 000 + 500 000) / 2
  EXPECT_EQ(meter_.measured_left.load(), 250'000u);
  EXPECT_EQ(meter_.measured_ns.load(), kStart + 200 * kMs);
}

TEST_F(ConnMeterTest, ThePacketIsTheSmallestStepAfterTheUnpacedStart) {
  // Within the first ten segments the kernel sends at once: no packet.
  meter_.Record(0, 1.0, kStart);
  meter_.Record(kUnpacedStartBytes - 1, 1.0, kStart + 10 * kMs);
  EXPECT_EQ(meter_.packet_bytes.load(), 0u);
  uint64_t left = kUnpacedStartBytes;
  meter_.Record(left, 1.0, kStart + 20 * kMs);
  left += 2 * 2896;  // a late visit: two packets
  meter_.Record(left, 1.0, kStart + 30 * kMs);
  EXPECT_EQ(meter_.packet_bytes.load(), 2u * 2896);
  left += 2896;  // one: a smaller step is taken at once
  meter_.Record(left, 1.0, kStart + 40 * kMs);
  EXPECT_EQ(meter_.packet_bytes.load(), 2896u);
  left += 65536;  // a larger one a quarter at a time
  meter_.Record(left, 1.0, kStart + 50 * kMs);
  EXPECT_EQ(meter_.packet_bytes.load(), 2896u + 2896u / 4);
  // Spaced out by a CPU stretch of 4, four packets' bytes are four packets.
  meter_.packet_bytes.store(2896);
  left += 4 * 2896;
  meter_.Record(left, 4.0, kStart + 60 * kMs);
  EXPECT_EQ(meter_.packet_bytes.load(), 2896u);
}

TEST_F(ConnMeterTest, TheEstimateGoesOnAtTheRateLeftAtMostThePaceAndHanded) {
  meter_.Record(100'000, 1.0, kStart);
  meter_.Record(200'000, 1.0, kStart + 100 * kMs);  // 1 MB/s
  // 50 ms on at 1 MB/s: 50 000 more.
  EXPECT_EQ(meter_.Estimate(0, 200'000, 1'000'000, kStart + 150 * kMs),
            250'000u);
  // At most the pace (500 KB/s), and at most what was handed.
  EXPECT_EQ(meter_.Estimate(500'000, 200'000, 1'000'000, kStart + 150 * kMs),
            225'000u);
  EXPECT_EQ(meter_.Estimate(0, 200'000, 230'000, kStart + 150 * kMs), 230'000u);
  // Less than a segment past what was counted: nothing to write.
  EXPECT_EQ(meter_.Estimate(0, 249'000, 1'000'000, kStart + 150 * kMs), 0u);
  // Nothing counted yet, or never measured: no estimate.
  EXPECT_EQ(meter_.Estimate(0, 0, 1'000'000, kStart + 150 * kMs), 0u);
  ConnMeter fresh;
  fresh.Reset();
  EXPECT_EQ(fresh.Estimate(0, 1, 1'000'000, kStart), 0u);
}

TEST_F(ConnMeterTest, AConnectionWithNothingQueuedIsUnderItsPace) {
  EXPECT_TRUE(meter_.UnderPace(0, 0, 100'000, kStart));
  EXPECT_FALSE(meter_.UnderPace(0, 5'000, 100'000, kStart + 20 * kMs));
}

TEST_F(ConnMeterTest, ASlowReaderIsJudgedOverASecondAtLeast) {
  constexpr uint64_t kPace = 100'000;
  uint64_t left = 0;
  bool under = false;
  // Half its pace, with bytes queued: slow, but only once a second of it
  // was seen.
  for (int64_t t = 0; t <= 2'000; t += 100) {
    under = meter_.UnderPace(left, 50'000, kPace, kStart + t * kMs);
    meter_.Record(left, 1.0, kStart + t * kMs);
    if (t < 1'000) {
      EXPECT_FALSE(under) << t;
    }
    left += kPace / 20;  // 50 KB/s
  }
  EXPECT_TRUE(under);
  // At its pace again: not slow after the next second.
  for (int64_t t = 2'100; t <= 4'200; t += 100) {
    under = meter_.UnderPace(left, 50'000, kPace, kStart + t * kMs);
    meter_.Record(left, 1.0, kStart + t * kMs);
    left += kPace / 10;
  }
  EXPECT_FALSE(under);
}

TEST_F(ConnMeterTest, ARestartForgetsTheVerdictButNotTheMeasurements) {
  meter_.Record(100'000, 1.0, kStart);
  meter_.slow.store(true);
  meter_.slow_since_ns.store(kStart);
  meter_.RestartUnderPace();
  // Bytes queued: not under its pace until a new span has been judged.
  EXPECT_FALSE(meter_.UnderPace(100'000, 5'000, 100'000, kStart + kMs));
  EXPECT_EQ(meter_.measured_left.load(), 100'000u);
  EXPECT_EQ(meter_.measured_ns.load(), kStart);
}

TEST(MeasureGapTest, TwoSegmentsOrThreeQuartersOfAPieceAtThePace) {
  const CpuBudget cpu;
  // Two segments at 2896 B/s: a second.
  EXPECT_EQ(MeasureGapNs(0, 2896, cpu), kNsPerSec);
  // At least a tick, at most kMaxMeasureGapNs.
  EXPECT_EQ(MeasureGapNs(0, 1'000'000'000, cpu), kBudgetTickNs);
  EXPECT_EQ(MeasureGapNs(0, 100, cpu), kMaxMeasureGapNs);
  // A 16 KiB piece at 122 880 B/s: 12 KiB of it, 100 ms.
  EXPECT_EQ(MeasureGapNs(16384, 122'880, cpu), 100 * kMs);
  // Not paced: every tick.
  EXPECT_EQ(MeasureGapNs(0, 0, cpu), kBudgetTickNs);
}

}  // namespace
}  // namespace trafficrate
