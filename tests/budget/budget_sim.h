// The simulation the budget controller's tests drive (budget_test.cc and
// its siblings): connections paced the way the kernel paces them (a
// packet's gap is fixed at the rate in force when it leaves; the first 10
// segments are not paced; packets are 64 KiB on low-RTT paths or sized from
// the pacing rate), readers that take a given rate, joins, leaves and short
// connections, metered as the Governor meters them (meter.h). No sockets,
// no sleeps.
//
//   Sim sim(512000, /*big_packets=*/false);
//   for (int i = 0; i < 4; ++i) sim.Join();
//   sim.Run(10);                          // simulated seconds
//   EXPECT_NEAR(sim.Ratio(2, 10), 1.0, 0.03);

#ifndef TRAFFICRATE_TESTS_BUDGET_BUDGET_SIM_H_
#define TRAFFICRATE_TESTS_BUDGET_BUDGET_SIM_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "src/budget/budget.h"
#include "src/budget/cpu_budget.h"
#include "src/budget/meter.h"
#include "src/budget/shaper.h"
#include "src/budget/share.h"

namespace trafficrate {
namespace testing_util {

inline constexpr int64_t kStepNs = 50'000;  // 50 us
inline constexpr double kMss = 1448;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

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

inline double ConnRate(const SimConn& c, double seconds) {
  return c.sent / seconds;
}

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BUDGET_BUDGET_SIM_H_
