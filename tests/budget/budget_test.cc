// The budget controller, driven by simulation: connections paced the way the
// kernel paces them (a packet's gap is fixed at the rate in force when it
// leaves; the first 10 segments are not paced; packets are 64 KiB on
// low-RTT paths or sized from the pacing rate), readers that take a given
// rate, joins, leaves and short connections. No sockets, no sleeps.

#include "src/budget/budget.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "src/budget/meter.h"
#include "src/budget/shaper.h"
#include "src/budget/share.h"

namespace trafficrate {
namespace {

constexpr int64_t kStepNs = 50'000;  // 50 us
constexpr double kMss = 1448;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct SimConn {
  double demand = kInf;  // what the reader takes, bytes/s
  double remaining = kInf;
  double cap = 0;  // pacing in force
  int64_t next_departure_ns = 0;
  int64_t wstamp_ns = 0;  // the kernel's tcp_wstamp_ns
  int segs_out = 0;
  double credit = 0;  // what the reader has room for
  bool active = false;
  double sent = 0;
  uint64_t measured = 0;  // what the watcher counted of `sent`
  bool under = false;     // its last measurement's ConnMeter::UnderPace
  int64_t next_measure_ns = 0;
};

// One key: its connections, the controller ticking every kBudgetTickNs, and
// a record of the bytes sent per 10 ms, to judge 1 s windows.
class Sim {
 public:
  Sim(uint64_t rate, bool big_packets)
      : settings_{rate, DefaultBurstBytes(rate)}, big_packets_(big_packets) {}

  // A connection joins now; returns its index.
  size_t Join(double demand = kInf, double bytes = kInf) {
    SimConn c;
    c.demand = demand;
    c.remaining = bytes;
    c.active = true;
    c.next_departure_ns = now_;
    start_pending_ += kUnpacedStartBytes;  // as ConnTable::JoinLocked
    const uint32_t before = Active();
    state_ = BudgetMembershipChange(state_, settings_, before, before + 1);
    applied_ = state_.level_bytes_per_sec;
    c.cap = static_cast<double>(applied_);
    conns_.push_back(c);
    meters_.emplace_back().Reset();
    ApplyToAll();
    return conns_.size() - 1;
  }
  void Leave(size_t i) {
    if (!conns_[i].active) return;
    const uint32_t before = Active();
    conns_[i].active = false;
    Measure(conns_[i]);
    state_ = BudgetMembershipChange(state_, settings_, before, before - 1);
    applied_ = state_.level_bytes_per_sec;
    ApplyToAll();
  }
  void Run(double seconds) {
    const int64_t end = now_ + static_cast<int64_t>(seconds * 1e9);
    while (now_ < end) Step();
  }
  void Step() {
    for (SimConn& c : conns_) Send(c);
    now_ += kStepNs;
    if (now_ % (10 * 1'000'000) == 0) {
      per_10ms_.push_back(total_ - last_total_);
      last_total_ = total_;
    }
    if (now_ % kBudgetTickNs == 0) Tick();
    if (trace_ && now_ % 100'000'000 == 0) {
      std::printf(
          "t=%.1f n=%u level=%lu applied=%lu bal=%ld boost=%.2f meas=%lu "
          "r100=%.3f\n",
          (now_ - 1e9) / 1e9, Active(), state_.level_bytes_per_sec, applied_,
          state_.balance_bytes, state_.boost / 65536.0,
          state_.measured_bytes_per_sec,
          Ratio((now_ - 1.1e9) / 1e9, (now_ - 1e9) / 1e9));
    }
  }
  // Bytes per second over [t0, t1) as a ratio of the rate.
  double Ratio(double t0, double t1) const {
    double bytes = 0;
    for (size_t i = static_cast<size_t>(t0 * 100);
         i < static_cast<size_t>(t1 * 100) && i < per_10ms_.size(); ++i) {
      bytes += per_10ms_[i];
    }
    return bytes / (t1 - t0) /
           static_cast<double>(settings_.rate_bytes_per_sec);
  }
  // Min and max over the 1 s windows [t, t+1) for t = t0, t0+0.1, ... < t1.
  std::pair<double, double> WindowRange(double t0, double t1) const {
    double lo = kInf, hi = 0;
    for (double t = t0; t + 1 <= t1 + 1e-9; t += 0.1) {
      const double r = Ratio(t, t + 1);
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    return {lo, hi};
  }
  const SimConn& conn(size_t i) const { return conns_[i]; }
  const BudgetState& state() const { return state_; }
  double rate() const {
    return static_cast<double>(settings_.rate_bytes_per_sec);
  }
  uint32_t Active() const {
    uint32_t n = 0;
    for (const SimConn& c : conns_) n += c.active ? 1 : 0;
    return n;
  }
  int ticks_applied() const { return ticks_applied_; }
  // Only every k-th tick's input holds the packet size (1: all).
  void set_packet_seen_every(int k) { packet_seen_every_ = k; }
  // Every packet this size (as cwnd-bound TSO packets on a LAN path), sent
  // without the timer's jitter: connections that start together stay in
  // step, as measured with nginx at tcp_tso_rtt_log 9.
  void set_packets_in_step(double bytes) {
    fixed_packet_ = bytes;
    jitter_ns_ = 0;
  }
  uint64_t applied() const { return applied_; }
  // Through the packet shaper (BudgetInput::shaped): each connection sends
  // pieces of PieceBytes at its cap, varied by its index, and its unpaced
  // first flight is kFirstPieces pieces of kFirstPieceBytes.
  void set_shaped() { shaped_ = true; }
  // Connections [first, last] are another process's, whose watcher does
  // not run from `from` to `to` seconds (its part of the count stands
  // still, then catches up); `told`: the deciding watcher is told how late
  // it is (BudgetInput::count_late_ns).
  void set_late(size_t first, size_t last, double from, double to, bool told) {
    late_first_ = first;
    late_last_ = last;
    late_from_ns_ = 1'000'000'000 + static_cast<int64_t>(from * 1e9);
    late_to_ns_ = 1'000'000'000 + static_cast<int64_t>(to * 1e9);
    late_told_ = told;
  }

 private:
  // The watcher meters each connection with the Governor's model
  // (meter.h): a measurement about every two segments at its pace (or
  // three quarters of a shaper piece), so the key's total lags what really
  // left, and an estimate at the rate it was leaving in between.
  ConnMeter& MeterOf(const SimConn& c) {
    return meters_[static_cast<size_t>(&c - conns_.data())];
  }
  void Count(SimConn& c, uint64_t count) {
    if (count > c.measured) {
      measured_total_ += static_cast<double>(count - c.measured);
      c.measured = count;
    }
  }
  // At a measurement, whether it sends less than its pacing allows: the
  // sim has no send queue, so a connection whose server still has bytes
  // for it has some queued.
  bool Measure(SimConn& c) {
    ConnMeter& meter = MeterOf(c);
    const auto left = static_cast<uint64_t>(c.sent);
    const auto pace = static_cast<uint64_t>(c.cap);
    const bool under =
        meter.UnderPace(left, c.remaining > 0 ? 1 : 0, pace, now_);
    meter.Record(left, 1.0, now_);
    Count(c, left);
    const uint32_t piece =
        shaped_
            ? PieceBytes(pace,
                         VaryIndex(static_cast<uint32_t>(&c - conns_.data())))
            : 0;
    c.next_measure_ns = now_ + MeasureGapNs(piece, pace, cpu_);
    return under;
  }
  void Estimate(SimConn& c) {
    const uint64_t estimate =
        MeterOf(c).Estimate(static_cast<uint64_t>(c.cap), c.measured,
                            static_cast<uint64_t>(c.sent), now_);
    Count(c, estimate);
  }
  void Tick() {
    const bool late = now_ >= late_from_ns_ && now_ < late_to_ns_;
    for (SimConn& c : conns_) {
      if (!c.active) continue;
      const size_t i = static_cast<size_t>(&c - conns_.data());
      if (late && i >= late_first_ && i <= late_last_) continue;
      if (now_ >= c.next_measure_ns) {
        c.under = Measure(c);
      } else {
        Estimate(c);
      }
    }
    double packet = 0;
    uint32_t under = 0;
    for (const SimConn& c : conns_) {
      if (!c.active) continue;
      packet = std::max(packet, PacketBytes(c));
      if (c.under) ++under;
    }
    // As the watcher under load: most ticks' visits see no packet.
    if (packet_seen_every_ > 1 && ++ticks_ % packet_seen_every_ != 0)
      packet = 0;
    state_ = BudgetTick(state_,
                        {now_, static_cast<uint64_t>(measured_total_), Active(),
                         static_cast<uint32_t>(packet), under, start_pending_,
                         BudgetCountLagNs(state_.level_bytes_per_sec), shaped_,
                         0, late && late_told_ ? now_ - late_from_ns_ : 0},
                        settings_);
    start_pending_ = state_.start_pending_bytes;
    if (LevelWorthApplying(
            applied_, state_.level_bytes_per_sec,
            ShareBytesPerSec(settings_.rate_bytes_per_sec, Active()))) {
      applied_ = state_.level_bytes_per_sec;
      ++ticks_applied_;
      ApplyToAll();
    }
  }
  // A new cap holds from the next packet (the kernel raises its pacing rate
  // to a higher cap on the next ACK, which on these paths comes within the
  // gap).
  void ApplyToAll() {
    for (SimConn& c : conns_) {
      if (c.active) c.cap = static_cast<double>(applied_);
    }
  }
  double PacketBytes(const SimConn& c) const {
    if (fixed_packet_ > 0) return fixed_packet_;
    if (shaped_) {
      const uint32_t piece =
          PieceBytes(static_cast<uint64_t>(c.cap),
                     VaryIndex(static_cast<uint32_t>(&c - conns_.data())));
      if (piece != 0) return piece;
    }
    if (big_packets_) return 65536;
    // tcp_tso_autosize with tcp_tso_rtt_log=0: 1 ms of the pacing rate,
    // at least 2 segments.
    return std::max(2.0, std::floor(c.cap / 1024 / kMss)) * kMss;
  }
  void Send(SimConn& c) {
    if (c.demand != kInf) {
      c.credit = std::min(c.credit + c.demand * kStepNs / 1e9, 256.0 * 1024);
    }
    if (!c.active || c.remaining <= 0 || now_ < c.next_departure_ns) return;
    double size = std::min(PacketBytes(c), c.remaining);
    // The first flight is the initial window: 10 segments, unpaced (10
    // first pieces through the shaper).
    if (c.segs_out < 10) {
      size =
          std::min(size, shaped_ ? kFirstPieceBytes : (10 - c.segs_out) * kMss);
    }
    if (c.demand != kInf) size = std::min(size, c.credit);
    const double least = shaped_ ? kFirstPieceBytes : kMss;
    if (size < std::min(least, c.remaining)) return;
    c.remaining -= size;
    if (c.demand != kInf) c.credit -= size;
    c.sent += size;
    total_ += size;
    if (c.segs_out >= 10) {
      // As tcp_update_skb_after_send: the schedule restarts from now if the
      // timer fired late, and up to half the next gap is forgiven for it.
      // The timer and the scheduler add up to 0.2 ms of jitter, which keeps
      // connections of equal rates out of step.
      const int64_t prior = c.wstamp_ns;
      c.wstamp_ns = std::max(c.wstamp_ns, now_ - kStepNs);
      int64_t gap = static_cast<int64_t>(size * 1e9 / c.cap);
      gap -= std::min(gap / 2, c.wstamp_ns - prior);
      c.wstamp_ns += gap;
      c.next_departure_ns =
          c.wstamp_ns + static_cast<int64_t>(jitter_(random_) * jitter_ns_);
    }
    c.segs_out += shaped_ && c.segs_out < 10
                      ? 1
                      : static_cast<int>(std::ceil(size / kMss));
    if (c.remaining <= 0) Leave(static_cast<size_t>(&c - conns_.data()));
  }

  BudgetSettings settings_;
  bool big_packets_;
  bool shaped_ = false;
  BudgetState state_;
  uint64_t applied_ = 0;
  int ticks_applied_ = 0;
  int packet_seen_every_ = 1;
  double fixed_packet_ = 0;
  double jitter_ns_ = 2e5;
  int64_t ticks_ = 0;
  size_t late_first_ = 0, late_last_ = 0;
  int64_t late_from_ns_ = 0, late_to_ns_ = 0;
  bool late_told_ = false;
  bool trace_ = std::getenv("BUDGET_TRACE") != nullptr;
  std::mt19937 random_{42};
  std::uniform_real_distribution<double> jitter_{0.0, 1.0};
  int64_t now_ = 1'000'000'000;  // never 0: 0 means "never ticked"
  double total_ = 0;
  double measured_total_ = 0;
  uint64_t start_pending_ = 0;  // KeySlotShm::start_pending
  double last_total_ = 0;
  std::vector<double> per_10ms_;
  std::vector<SimConn> conns_;
  std::deque<ConnMeter> meters_;  // conns_'s, by index
  CpuBudget cpu_;                 // never stretched here
};

double ConnRate(const SimConn& c, double seconds) { return c.sent / seconds; }

TEST(BudgetTest, EqualDemandsSplitTheRateAndHoldEveryWindow) {
  for (bool big : {false, true}) {
    for (int n : {1, 4, 16}) {
      Sim sim(5 << 20, big);
      for (int i = 0; i < n; ++i) sim.Join();
      sim.Run(10);
      EXPECT_NEAR(sim.Ratio(2, 10), 1.0, 0.03) << "n=" << n << " big=" << big;
      // 64 KiB packets at 16 x 320 KiB/s: one packet more or less per
      // connection is 20% of a 1 s window when they fall in step. Known
      // limit; only the 10 s total and fairness are held there.
      if (big && n == 16) continue;
      const auto [lo, hi] = sim.WindowRange(2, 10);
      EXPECT_GE(lo, 0.95) << "n=" << n << " big=" << big;
      EXPECT_LE(hi, 1.05) << "n=" << n << " big=" << big;
      double min_rate = kInf, max_rate = 0;
      for (int i = 0; i < n; ++i) {
        min_rate = std::min(min_rate, ConnRate(sim.conn(i), 10));
        max_rate = std::max(max_rate, ConnRate(sim.conn(i), 10));
      }
      EXPECT_LE(max_rate / min_rate, 1.05) << "n=" << n << " big=" << big;
    }
  }
}

TEST(BudgetTest, SlowReaderLeavesWhatItDoesNotUseToTheOthers) {
  Sim sim(512000, /*big_packets=*/false);
  sim.Join(20 * 1024);
  for (int i = 0; i < 3; ++i) sim.Join();
  sim.Run(12);
  EXPECT_GE(sim.Ratio(2, 12), 0.97);
  EXPECT_LE(sim.Ratio(2, 12), 1.03);
  const double slow = ConnRate(sim.conn(0), 12);
  EXPECT_NEAR(slow, 20 * 1024, 1024);
  const double a = ConnRate(sim.conn(1), 12), b = ConnRate(sim.conn(2), 12),
               c = ConnRate(sim.conn(3), 12);
  EXPECT_LE(std::max({a, b, c}) / std::min({a, b, c}), 1.03);
  // The fast ones share what the slow one leaves: (rate - 20 KiB/s) / 3.
  EXPECT_NEAR(a, (512000 - 20 * 1024) / 3.0, 0.05 * a);
}

// One worker's watcher does not run for a while (its process starved of
// CPU, as under heavy load): its connections go on sending, and their bytes
// reach the count all at once when it runs. Taken as they come, the ticks
// meanwhile bank nothing of it (a connection reading slowly keeps the bank
// at `burst`) and the lump then is a debt and a burst over the rate: the
// level was cut for a second, to 0.64-0.78 of the rate in 1 s windows.
// Told how late that watcher is, the key waits for its count.
TEST(BudgetTest, AWatcherThatRunsLateIsWaitedFor) {
  for (double stall : {0.5, 1.0}) {
    for (bool told : {false, true}) {
      Sim sim(512000, /*big_packets=*/false);
      sim.set_shaped();
      sim.Join(20 * 1024);
      for (int i = 0; i < 3; ++i) sim.Join();
      // The slow reader and one of the others are the late worker's.
      sim.set_late(0, 1, 5.3, 5.3 + stall, told);
      sim.Run(12);
      const auto [lo, hi] = sim.WindowRange(2, 12);
      if (!told) {
        EXPECT_LT(lo, 0.92) << "stall " << stall;
        continue;
      }
      EXPECT_GE(sim.Ratio(2, 12), 0.985) << "stall " << stall;
      EXPECT_GE(lo, 0.92) << "stall " << stall;
      EXPECT_LE(hi, 1.05) << "stall " << stall;
    }
  }
}

// The count of connections at a few KB/s moves in steps of two segments
// each (their measuring gap): 8 connections at 4 KB/s measured 0.93-1.08
// of the rate in 1 s windows in 2-3 of 8 runs when the controller took it
// to lag 250 ms, and followed those steps.
TEST(BudgetTest, TheCountLagsByTheMeasuringGapOfTheLevel) {
  EXPECT_EQ(BudgetCountLagNs(0), kBudgetCountLagNs);
  EXPECT_EQ(BudgetCountLagNs(512000), kBudgetCountLagNs);
  EXPECT_NEAR(BudgetCountLagNs(4000), 2 * 1448 / 4000.0 * 1e9, 1e3);
  EXPECT_EQ(BudgetCountLagNs(1), kBudgetMaxMeasureGapNs);
}

TEST(BudgetTest, ALateCountHoldsTheDecisionForALimitedTime) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetInput in{1'000'000'000, 0, 4, 2896, 1};
  BudgetState state = BudgetTick(BudgetState(), in, settings);
  for (int i = 0; i < 10; ++i) {
    in.now_ns += kBudgetTickNs;
    in.sent_bytes += 512000 / 50;
    state = BudgetTick(state, in, settings);
  }
  const BudgetState before = state;
  in.count_late_ns = kBudgetLateHoldNs + 1;
  // Held: nothing moves while part of the count is missing.
  while (in.now_ns + kBudgetTickNs - before.last_ns < kBudgetMaxHoldNs) {
    in.now_ns += kBudgetTickNs;
    state = BudgetTick(state, in, settings);
    EXPECT_EQ(state.last_ns, before.last_ns);
    EXPECT_EQ(state.balance_bytes, before.balance_bytes);
    EXPECT_EQ(state.boost, before.boost);
  }
  // Not for longer: decided with what is in (the unsent span banked).
  in.now_ns += kBudgetTickNs;
  state = BudgetTick(state, in, settings);
  EXPECT_EQ(state.last_ns, in.now_ns);
  EXPECT_GT(state.balance_bytes, before.balance_bytes);
  // A lag within kBudgetCountLagNs is no reason to wait.
  in.count_late_ns = kBudgetLateHoldNs;
  in.now_ns += kBudgetTickNs;
  state = BudgetTick(state, in, settings);
  EXPECT_EQ(state.last_ns, in.now_ns);
}

TEST(BudgetTest, ConvergesToMaxMinShares) {
  Sim sim(512000, /*big_packets=*/false);
  sim.Join(20'000);
  sim.Join(60'000);
  sim.Join();
  sim.Join();
  sim.Run(12);
  // Max-min: 20k and 60k keep what they use; the others get 216k each.
  EXPECT_NEAR(ConnRate(sim.conn(0), 12), 20'000, 1'500);
  EXPECT_NEAR(ConnRate(sim.conn(1), 12), 60'000, 3'000);
  EXPECT_NEAR(ConnRate(sim.conn(2), 12), 216'000, 0.05 * 216'000);
  EXPECT_NEAR(ConnRate(sim.conn(3), 12), 216'000, 0.05 * 216'000);
  const double level = static_cast<double>(sim.state().level_bytes_per_sec);
  EXPECT_NEAR(level, 216'000, 0.08 * 216'000);
}

// Every connection held back by its pacing (under 0): the equal share is
// the max-min level, whatever the count's lumps say. Bytes that leave in
// packets sent in step (nothing for a while, then a lump) must not move
// the level above it.
TEST(BudgetTest, ConnectionsAllHeldBackByTheirPacingKeepTheEqualShare) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  const uint32_t n = 16;
  const uint64_t equal = 512000 / n;
  BudgetState state;
  uint64_t sent = 0;
  int64_t now = 1'000'000'000;
  state = BudgetTick(state, {now, sent, n, 2896, 0}, settings);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int tick = 1; tick <= 500; ++tick) {
    now += kBudgetTickNs;
    // 10 s at exactly the rate on average: a lump of 5 ticks' worth every
    // fifth tick.
    if (tick % 5 == 0) sent += 512000 / 10;
    state = BudgetTick(state, {now, sent, n, 2896, 0}, settings);
    if (tick > 50) {
      lo = std::min(lo, state.level_bytes_per_sec);
      hi = std::max(hi, state.level_bytes_per_sec);
    }
  }
  EXPECT_LE(hi, equal);
  EXPECT_GE(lo, equal * 9 / 10);
  // The integral behind the level may float above 1 (its room while the
  // level is clipped at the equal share), never far.
  EXPECT_LE(state.boost, kBoostOne * 5 / 4);
  // The same lumps with half the connections using less than their share:
  // the level may rise, but never beyond the rate over those held back.
  state = BudgetState();
  now += 2'000'000'000;
  state = BudgetTick(state, {now, sent, n, 2896, n / 2}, settings);
  hi = 0;
  for (int tick = 1; tick <= 500; ++tick) {
    now += kBudgetTickNs;
    if (tick % 5 == 0) sent += 512000 * 3 / 40;  // 3/4 of the rate
    state = BudgetTick(state, {now, sent, n, 2896, n / 2}, settings);
    hi = std::max(hi, state.level_bytes_per_sec);
  }
  EXPECT_GT(hi, equal * 3 / 2);
  // At most 2 x equal, plus what the balance adds for its bank.
  EXPECT_LE(hi, 2 * equal * 3 / 2);
  EXPECT_LE(state.boost, 2 * kBoostOne);
}

TEST(BudgetTest, NothingIsHeldBackWhileTheKeyIsClearlyUnderItsRate) {
  Sim sim(100 << 20, /*big_packets=*/false);
  for (int i = 0; i < 20; ++i) sim.Join(1 << 20);  // 20 MiB/s of 100 MiB/s
  // The watcher judges a connection held back by its reader over a second
  // at least (ConnMeter::UnderPace): the key is unbound within two.
  sim.Run(2);
  EXPECT_EQ(sim.state().level_bytes_per_sec, uint64_t{100} << 20);
  EXPECT_EQ(BudgetDebtBytes(sim.state()), 0u);
}

TEST(BudgetTest, DebtsAreRepaidWithinAboutTheHorizon) {
  Sim sim(512000, /*big_packets=*/false);
  for (int i = 0; i < 4; ++i) sim.Join();
  sim.Run(3);
  // 4 new connections each send their first 10 segments unpaced at once
  // (~57 KiB), then leave: forgiven from the allowance (refilled while no
  // new connection joined), not repaid.
  for (int i = 0; i < 4; ++i) sim.Join(kInf, 10 * kMss);
  sim.Run(0.1);
  EXPECT_LE(BudgetDebtBytes(sim.state()), DefaultBurstBytes(512000));
  EXPECT_LT(sim.state().start_allowance_bytes, 512000u / 5 - 50'000);
  sim.Run(2.9);
  EXPECT_GE(sim.Ratio(4.1, 5.1), 0.97);
  // 16 more at once (~226 KiB): beyond the allowance left, a debt.
  for (int i = 0; i < 16; ++i) sim.Join(kInf, 10 * kMss);
  sim.Run(0.1);
  EXPECT_GT(BudgetDebtBytes(sim.state()), 100'000u);
  sim.Run(kBudgetHorizonNs / 1e9);
  // Most of it is repaid within the horizon, and all of it down to about
  // the dead band of half a burst soon after.
  EXPECT_LE(BudgetDebtBytes(sim.state()), 50'000u);
  sim.Run(0.5);
  EXPECT_LE(BudgetDebtBytes(sim.state()), DefaultBurstBytes(512000));
  sim.Run(5.5);
  // Over the rate by what was forgiven (0.2 s of the rate, 2% of these
  // 11 s), no more.
  EXPECT_NEAR(sim.Ratio(2, 13), 1.02, 0.02);
  // Repaid, not forgiven: the second after the burst sends less than the
  // rate by about what was owed, and then the rate again.
  EXPECT_LE(sim.Ratio(6.1, 7.1), 0.95);
  const auto [lo, hi] = sim.WindowRange(8, 13);
  EXPECT_GE(lo, 0.95);
  EXPECT_LE(hi, 1.05);
}

// Connections that start together at a key's start each send their first
// 10 segments unpaced: 64 of them 1.8 s of the rate in a moment. That is
// forgiven (repaying it would hold the key far below its rate for the
// seconds after), and the level stays the equal share.
TEST(BudgetTest, ConnectionsStartingTogetherAreNotMadeToRepayTheirStart) {
  Sim sim(512000, /*big_packets=*/false);
  for (int i = 0; i < 64; ++i) sim.Join();
  sim.Run(1);
  // (The simulated connections send in exact step, so its 1 s windows hold
  // two or three rounds of packets, in any mode; the level is what the
  // controller answers for.)
  uint64_t lowest = UINT64_MAX;
  for (int i = 0; i < 110; ++i) {
    sim.Run(0.1);
    lowest = std::min(lowest, sim.state().level_bytes_per_sec);
  }
  EXPECT_GE(lowest, 512000 / 64 * 9 / 10);
  EXPECT_NEAR(sim.Ratio(2, 12), 1.0, 0.03);
}

// 64 connections of a 500 KB/s client through nginx at tcp_tso_rtt_log 9:
// packets of ~13 segments, 2.3 s apart at the equal share, all in step. The
// count then shows two seconds of nothing and then 1.2 MB (2.3 s of the
// rate) at once. With the boost clipped at 1 each lump drove it down and
// the silence after only brought it back to 1, and the bank was clipped
// shorter than the debt each lump left: the level held 0.93 (16) and 0.84
// (64) of the equal share on average here; measured with nginx, 0.89-0.97x
// the rate at 64 connections.
TEST(BudgetTest, PacketsInStepSecondsApartKeepTheEqualShare) {
  for (int n : {16, 64}) {
    Sim sim(512000, /*big_packets=*/false);
    sim.set_packets_in_step(13 * kMss);
    for (int i = 0; i < n; ++i) sim.Join();
    sim.Run(2);
    const double equal = 512000.0 / n;
    constexpr int kSamples = 400;  // every 0.1 s over 40 s
    double level_sum = 0;
    for (int i = 0; i < kSamples; ++i) {
      sim.Run(0.1);
      level_sum += static_cast<double>(sim.applied());
    }
    // A window holds whole lumps: over 40 s one more or less is 6%.
    EXPECT_NEAR(sim.Ratio(2, 42), 1.0, 0.06) << "n=" << n;
    EXPECT_GE(level_sum / kSamples, 0.97 * equal) << "n=" << n;
    EXPECT_LE(level_sum / kSamples, 1.03 * equal) << "n=" << n;
  }
}

TEST(BudgetTest, ShortConnectionsNextToLongOnesDoNotRaiseTheTotal) {
  for (int per_sec : {10, 20}) {
    Sim sim(512000, /*big_packets=*/false);
    for (int i = 0; i < 4; ++i) sim.Join();
    // As in the benchmark, the requests start with the downloads. The
    // first few are forgiven their unpaced start (BudgetInput): measured
    // from 2 s, as the benchmark does.
    sim.Run(0.1);
    for (int s = 0; s < 12 * per_sec; ++s) {
      sim.Join(kInf, 65536);  // a 64 KiB Range request on a new connection
      sim.Run(1.0 / per_sec);
    }
    // At 20 per second the Range requests alone want 1.25 MiB/s of a
    // 500 KiB/s budget: they pile up (200 at once after 10 s), each
    // starting with 10 unpaced segments, and the level of so many falls so
    // low that a packet holds a connection for seconds: the controller
    // then keeps near the equal share (KeyPace::min_boost). Known limit:
    // only a bound on the total is held there.
    if (per_sec > 10) {
      EXPECT_LE(sim.Ratio(2, 11), 1.40) << per_sec;
      continue;
    }
    EXPECT_LE(sim.Ratio(2, 11), 1.03) << per_sec;
    EXPECT_GE(sim.Ratio(2, 11), 0.97) << per_sec;
    // (Without the shaper, its windows reach 1.085, metered as the
    // Governor meters (meter.h): the repaid starts hold the level low,
    // where the count lags by its measuring gap and the controller follows
    // it more slowly, BudgetCountLagNs, and between measurements a short
    // connection is estimated at most at its pace, so the count of its
    // unpaced start comes at the next measurement. Through the shaper, the
    // default, 5%: the next test.)
    const auto [lo, hi] = sim.WindowRange(2, 11);
    EXPECT_LE(hi, 1.09) << per_sec;
    EXPECT_GE(lo, 0.94) << per_sec;
  }
}

// Through the packet shaper the requests' first flights are 10 pieces of
// 100 B, their packets small and out of step: at 20 new connections a
// second as well, the total holds within 3% and every window within 5%.
TEST(BudgetTest, ShapedShortConnectionsNextToLongOnesHoldTheTotal) {
  for (int per_sec : {10, 20}) {
    Sim sim(512000, /*big_packets=*/false);
    sim.set_shaped();
    for (int i = 0; i < 4; ++i) sim.Join();
    sim.Run(0.1);
    for (int s = 0; s < 12 * per_sec; ++s) {
      sim.Join(kInf, 65536);
      sim.Run(1.0 / per_sec);
    }
    EXPECT_LE(sim.Ratio(2, 11), 1.03) << per_sec;
    EXPECT_GE(sim.Ratio(2, 11), 0.97) << per_sec;
    const auto [lo, hi] = sim.WindowRange(2, 11);
    EXPECT_LE(hi, 1.05) << per_sec;
    EXPECT_GE(lo, 0.94) << per_sec;
  }
}

// CI's watcher, busy, once held a stream of new connections to 1.10x: the
// ticks' visits held no measured packet, the size fell back to unknown
// (64 KiB), and with it the controller's reach below the equal share.
TEST(BudgetTest, ATickThatSeesNoPacketKeepsTheSizeLastSeen) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {1'000'000'000, 0, 8, 3584}, settings);
  EXPECT_EQ(state.packet_bytes, 3584u);
  state = BudgetTick(state, {1'020'000'000, 10240, 8, 0}, settings);
  EXPECT_EQ(state.packet_bytes, 3584u);
  state = BudgetTick(state, {1'040'000'000, 20480, 8, 2896}, settings);
  EXPECT_EQ(state.packet_bytes, 2896u);
  // A fresh start (idle past kBudgetMaxGapNs) forgets it.
  state = BudgetTick(state, {9'000'000'000, 30000, 8, 0}, settings);
  EXPECT_EQ(state.packet_bytes, 0u);

  Sim sim(512000, /*big_packets=*/false);
  sim.set_packet_seen_every(25);  // once every 0.5 s
  for (int i = 0; i < 4; ++i) sim.Join();
  sim.Run(0.1);
  for (int s = 0; s < 120; ++s) {
    sim.Join(kInf, 65536);
    sim.Run(0.1);
  }
  EXPECT_LE(sim.Ratio(2, 11), 1.03);
  EXPECT_GE(sim.Ratio(2, 11), 0.97);
}

TEST(BudgetTest, JoinsAndLeavesHoldEveryWindowAfterTheChange) {
  for (bool big : {false, true}) {
    Sim sim(5 << 20, big);
    std::vector<size_t> extra;
    sim.Join();
    sim.Join();
    sim.Run(4);
    for (int i = 0; i < 6; ++i) extra.push_back(sim.Join());
    sim.Run(5);
    for (size_t i : extra) sim.Leave(i);
    sim.Run(5);
    // With 64 KiB packets a window holds whole packets: +-8% there.
    const double tolerance = big ? 0.08 : 0.05;
    for (double change : {4.0, 9.0}) {
      const auto [lo, hi] = sim.WindowRange(change + 1, change + 5);
      EXPECT_GE(lo, 1 - tolerance) << "big=" << big << " after " << change;
      EXPECT_LE(hi, 1 + tolerance) << "big=" << big << " after " << change;
    }
    // No dip right after the leave either. With 64 KiB packets the
    // survivors first wait out the gaps scheduled at the old level (0.1 s
    // here), which the burst allowance can only partly make up.
    EXPECT_GE(sim.Ratio(9, 10), big ? 0.92 : 0.95) << "big=" << big;
  }
}

TEST(BudgetTest, MembershipChangeTakesTheJoinersShareAtOnce) {
  const BudgetSettings settings{400'000, DefaultBurstBytes(400'000)};
  BudgetState state;
  state.last_ns = 1;
  state.boost = kBoostOne;  // 4 connections at 100k
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 5).level_bytes_per_sec,
            80'000u);
  // A leave never lowers the level, and gives at least rate / active.
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 2).level_bytes_per_sec,
            200'000u);
  state.boost = 3 * kBoostOne;  // 300k: others use little
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 3).level_bytes_per_sec,
            300'000u);
  // A key not held back stays so while it is known to send little: its
  // connections, each sending what the whole key sent, would not send half
  // its rate.
  state.boost = kBoostUnbound;
  state.start_ns = 0;
  state.last_ns = 3'000'000'000;
  state.measured_bytes_per_sec = 20'000;
  EXPECT_EQ(BudgetMembershipChange(state, settings, 4, 9).level_bytes_per_sec,
            400'000u);
  // Else joiners would each send the whole rate until the next tick: an
  // equal split at once.
  state.measured_bytes_per_sec = 30'000;
  BudgetState joined = BudgetMembershipChange(state, settings, 4, 9);
  EXPECT_EQ(joined.boost, kBoostOne);
  EXPECT_EQ(joined.level_bytes_per_sec, 400'000u / 9);
  // In the first ticks of a run nothing is known yet: a client's first
  // connection is unbound alone, and those it opens a moment later join it
  // one at a time.
  state.measured_bytes_per_sec = 0;
  state.last_ns = state.start_ns + 3 * kBudgetTickNs;
  EXPECT_EQ(BudgetMembershipChange(state, settings, 1, 2).level_bytes_per_sec,
            200'000u);
  // A leave keeps it unbound.
  EXPECT_EQ(BudgetMembershipChange(state, settings, 2, 1).boost, kBoostUnbound);
  // A fresh key: the whole rate for one, an equal split for more.
  EXPECT_EQ(
      BudgetMembershipChange(BudgetState(), settings, 0, 1).level_bytes_per_sec,
      400'000u);
  EXPECT_EQ(
      BudgetMembershipChange(BudgetState(), settings, 1, 2).level_bytes_per_sec,
      200'000u);
}

TEST(BudgetTest, AFreshOrIdleKeyStartsAfresh) {
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 2}, settings);
  EXPECT_EQ(state.level_bytes_per_sec, 256000u);
  EXPECT_EQ(state.balance_bytes, 0);
  // After a gap of more than a second the old balance means nothing.
  state.balance_bytes = -100000;
  state = BudgetTick(state, {8'000'000'000, 5000, 4}, settings);
  EXPECT_EQ(state.balance_bytes, 0);
  EXPECT_EQ(state.level_bytes_per_sec, 128000u);
}

// A key decided seconds apart by a busy watcher (BudgetInput::max_gap_ns)
// was not idle: no fresh start, and what it sent over the gap is its
// measured rate.
TEST(BudgetTest, ALongGapTheWatcherAllowsIsNoFreshStart) {
  const BudgetSettings settings{2048, DefaultBurstBytes(2048)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 1}, settings);
  state.balance_bytes = -800;
  BudgetInput input{13'000'000'000, 1000 + 8 * 2048, 1};
  input.max_gap_ns = 10'000'000'000;
  state = BudgetTick(state, input, settings);
  EXPECT_EQ(state.start_ns, 5'000'000'000);  // not started afresh
  EXPECT_EQ(state.balance_bytes, -800);      // 8 s at the rate: as it was
  EXPECT_NEAR(static_cast<double>(state.measured_bytes_per_sec), 2048, 100);
  EXPECT_EQ(state.level_bytes_per_sec, 2048u);
  // Past the gap it allows: afresh.
  input.now_ns = 24'000'000'000;
  input.sent_bytes += 100;
  state = BudgetTick(state, input, settings);
  EXPECT_EQ(state.start_ns, 24'000'000'000);
  EXPECT_EQ(state.balance_bytes, 0);
}

TEST(BudgetTest, PendingStartsNeverGrowEvenWhenTooLargeForADouble) {
  // What the zone's start_pending holds may be anything (garbage): the
  // caller subtracts what the tick forgave, so it must not come out larger.
  const BudgetSettings settings{512000, DefaultBurstBytes(512000)};
  BudgetState state =
      BudgetTick(BudgetState(), {5'000'000'000, 1000, 2}, settings);
  for (const uint64_t pending : {(uint64_t{1} << 60) + 255, UINT64_MAX - 1,
                                 uint64_t{18'100'000'000'000'000'000u}}) {
    BudgetInput input{5'001'000'000, 1000, 2};
    input.start_pending_bytes = pending;
    EXPECT_LE(BudgetTick(state, input, settings).start_pending_bytes, pending)
        << pending;
  }
}

TEST(BudgetTest, LevelWorthApplyingIgnoresSmallChanges) {
  EXPECT_TRUE(LevelWorthApplying(0, 100));
  EXPECT_FALSE(LevelWorthApplying(100'000, 103'000));
  EXPECT_TRUE(LevelWorthApplying(100'000, 105'000));
  EXPECT_TRUE(LevelWorthApplying(100'000, 95'000));
}

TEST(BudgetTest, PaceNearLevelIsWithinASixteenthOfAPaceInForce) {
  EXPECT_TRUE(PaceNearLevel(160'000, 160'000));
  EXPECT_TRUE(PaceNearLevel(160'000, 169'999));
  EXPECT_FALSE(PaceNearLevel(160'000, 170'000));
  EXPECT_TRUE(PaceNearLevel(160'000, 150'001));
  EXPECT_FALSE(PaceNearLevel(160'000, 150'000));
  // One join among 5 000 connections: not worth a setsockopt.
  EXPECT_TRUE(PaceNearLevel(10'000'000 / 5000, 10'000'000 / 5001));
  // Not paced yet: always worth one.
  EXPECT_FALSE(PaceNearLevel(0, 0));
  EXPECT_FALSE(PaceNearLevel(0, 1000));
}

TEST(BudgetTest, DefaultBurstIsFiftyMillisecondsOfTheRate) {
  EXPECT_EQ(DefaultBurstBytes(20 << 20), uint64_t{1} << 20);
  EXPECT_EQ(DefaultBurstBytes(1000), 16u * 1024);
}

}  // namespace
}  // namespace trafficrate
