#include "src/budget/budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/base/clock.h"

namespace trafficrate {
namespace {

constexpr double kNsPerSecF = 1e9;
constexpr double kTwoSegments = 2 * kSegmentBytes;
// A key's packet size before any was measured (its connections' unpaced
// first segments do not count): the largest the kernel builds, so that
// the controller acts gently until it knows better. Connections that start
// together owe for all their first segments at once, and a deep cut then
// would silence each of them for a whole packet gap.
constexpr double kUnknownPacketBytes = 65536;
// Smoothing of the measured rate: stat shows it and the level follows it.
constexpr double kMeasuredTauNs = 200e6;
// How fast the boost follows the gap between the rate and what the key
// sends, at the least: fast enough to give a slow reader's part to the
// others, or to absorb the unpaced starts of a stream of new connections,
// within a second; slow against the measuring's smoothing, so that it does
// not overshoot. Slower when packets are far apart (KeyPace).
constexpr double kIntegralTauNs = 500e6;
// How slowly a lasting debt (or bank) moves the boost.
constexpr double kBalanceIntegralNs = 5e9;
// The allowance for new connections' unpaced starts (outside the grace):
// at most this long of the rate, refilled at this part of the rate per
// second while no new connection joins, so that a few connections opened
// together now and then are forgiven, a stream of them never.
constexpr double kAllowanceNs = 200e6;
constexpr double kAllowanceRefill = 0.1;
// Pending unpaced starts that did not show as a debt within about this
// long were within the rate: they lapse.
constexpr double kPendingLapseNs = 500e6;
// Unbound (nothing held back) while the key sends less than this part of
// its rate; bound again once it sends more than kBindAbove of it.
constexpr double kUnbindBelow = 0.5;
constexpr double kBindAbove = 0.9;
// Ticks in a row a key must be clearly under its rate before its boost
// doubles, at the least.
constexpr uint32_t kUnderTicks = 5;
// The boost never drops below this: a connection is never set far below
// its equal share (a departure time cannot be pulled back).
constexpr double kMinBoost = 0.25;
// The balance moves the level by at most this part either way.
constexpr double kMaxBalanceEffect = 0.5;
// While every connection is held back by its pacing the level is the equal
// share at most, but the boost, the integral behind it, may go this far
// above 1: the count's lumps (packets sent in step, seconds apart) then
// move it both ways around where the key sends its rate, rather than only
// down from a ceiling at 1, which held such keys 3-10% under their rate.
constexpr double kPacedBoostCeiling = 1.25;
// The boost above which a burst well over the rate gives the equal share at
// once (BudgetTick).
constexpr double kBurstRuleBoost = 1.5;
// Up to this gap between a connection's packets the controller has its
// full authority (kMinBoost, kMaxBalanceEffect); beyond, less in
// proportion. Two seconds: a client opening more new connections than its
// rate carries has a few hundred of them at a few KB/s, one or two
// segments a second each, and their unpaced starts alone take half its
// rate, so the level must go well below the equal share; 64 KiB packets at
// a few KB/s (64 connections of a 500 KB/s client on a LAN path) are 8 s
// or more apart, where a level set too low would silence a connection for
// longer than a window can bear.
constexpr double kFullReachGapNs = 2e9;
constexpr double kMinReach = 0.25;

double Clamp(double v, double lo, double hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// How a key's connections send at its current level, which sets how fast
// the controller may act on them.
struct KeyPace {
  // The time between two packets of one connection: a new level reaches a
  // connection only after the gap of the packet it sent last.
  double gap_ns;
  // The balance's dead band: how far the count may be off the truth. It
  // moves by whole packets (connections that send in step send together),
  // and each connection's part of it was sampled a little while ago.
  double band_bytes;
  // Over how long the balance is paid back or spent.
  double horizon_ns;
  // The integral action's time constant.
  double integral_ns;
  // How far below the equal share the level may go, as a part of the
  // equal share, and how far the balance may move it: full authority
  // while packets are close together, little when a gap is long (a packet
  // sent at a low level holds its connection back for that long, whatever
  // the level is set to afterwards).
  double min_boost;
  double balance_effect;
};

KeyPace PaceOf(const BudgetState& s, const BudgetSettings& settings,
               uint32_t active, double count_lag_ns = kBudgetCountLagNs) {
  const double rate = static_cast<double>(settings.rate_bytes_per_sec);
  const double n = active > 0 ? active : 1;
  const double level = s.level_bytes_per_sec > 0
                           ? static_cast<double>(s.level_bytes_per_sec)
                           : rate / n;
  const double packet =
      s.packet_bytes > 0
          ? std::max(kTwoSegments, static_cast<double>(s.packet_bytes))
          : kUnknownPacketBytes;
  KeyPace pace;
  pace.gap_ns = PacketGapNs(packet, std::max(level, 1.0));
  // The count lags by kBudgetCountLagNs at the least.
  const double lag = std::max<double>(kBudgetCountLagNs, count_lag_ns);
  const double per_conn = std::min(packet, level * lag / kNsPerSecF);
  pace.band_bytes =
      std::max(static_cast<double>(settings.burst_bytes) / 2, per_conn * n);
  pace.horizon_ns = std::max<double>(kBudgetHorizonNs, 2 * pace.gap_ns);
  // A count that lags more (measurements spaced out) is noisier: the
  // integral follows it more slowly in proportion.
  pace.integral_ns =
      std::max(kIntegralTauNs, 2 * pace.gap_ns) * (lag / kBudgetCountLagNs);
  const double reach = Clamp(kFullReachGapNs / pace.gap_ns, kMinReach, 1);
  pace.min_boost = 1 - (1 - kMinBoost) * reach;
  pace.balance_effect = kMaxBalanceEffect * reach;
  return pace;
}

// The part by which the balance moves the level: what is banked beyond the
// band is spent, what is owed beyond it is repaid, over the horizon. Within
// the band the level does not follow every packet.
double BalanceFactor(const BudgetState& s, double rate, const KeyPace& pace) {
  double excess = static_cast<double>(s.balance_bytes);
  const double band = pace.band_bytes;
  excess = excess > band ? excess - band : (excess < -band ? excess + band : 0);
  const double horizon_bytes = rate * pace.horizon_ns / kNsPerSecF;
  return 1 + Clamp(excess / std::max(horizon_bytes, 1.0), -pace.balance_effect,
                   pace.balance_effect);
}

// Whether the connections of a key not held back, going to new_active,
// may send half its rate or more. Not known in the first ticks of its run
// (its first connection alone is not held back at a fresh start, not for
// having been seen under the rate; connections a client opens together
// join it a moment later, one by one); else if each of them sent what the
// whole key sent (joins one at a time, between two ticks, are judged by
// the same figure).
bool JoinersMayFillTheRate(const BudgetState& s, const BudgetSettings& settings,
                           uint32_t new_active) {
  if (ElapsedNs(s.last_ns, s.start_ns) < kUnderTicks * kBudgetTickNs) {
    return true;
  }
  return static_cast<double>(s.measured_bytes_per_sec) * new_active >=
         kUnbindBelow * static_cast<double>(settings.rate_bytes_per_sec);
}

// A boost with no cap but its own bounds.
constexpr double kAnyBoost = std::numeric_limits<double>::infinity();

// The level of a key: the whole rate while unbound, else the equal share
// times the boost (taken as max_boost at most: 1 while every connection is
// held back by its pacing, where a boost above it is only the integral's
// room, kPacedBoostCeiling) times the balance's correction, at most the
// rate.
uint64_t LevelFor(const BudgetState& s, uint32_t active,
                  const BudgetSettings& settings, const KeyPace& pace,
                  double max_boost = kAnyBoost) {
  const double rate = static_cast<double>(settings.rate_bytes_per_sec);
  if (s.boost == kBoostUnbound) return settings.rate_bytes_per_sec;
  const double n = active > 0 ? active : 1;
  const double boost =
      std::min(static_cast<double>(s.boost) / kBoostOne, max_boost);
  const double level = rate / n * boost * BalanceFactor(s, rate, pace);
  return static_cast<uint64_t>(Clamp(level, 1, rate));
}

uint64_t LevelFor(const BudgetState& s, uint32_t active,
                  const BudgetSettings& settings,
                  double max_boost = kAnyBoost) {
  return LevelFor(s, active, settings, PaceOf(s, settings, active), max_boost);
}

uint32_t ToBoost(double boost) {
  if (!(boost == boost)) boost = 1;  // NaN: from figures no tick wrote
  return static_cast<uint32_t>(
      Clamp(boost, kMinBoost, (kBoostUnbound - 1.0) / kBoostOne) * kBoostOne);
}

// Conversions of figures computed from zone state, which may be anything:
// saturated at the type's range, NaN as 0.
int64_t SaturatingInt64(double v) {
  if (!(v == v)) return 0;
  if (v >= 9.2e18) return INT64_MAX;
  if (v <= -9.2e18) return -INT64_MAX;
  return static_cast<int64_t>(v);
}

uint64_t SaturatingUint64(double v) {
  if (!(v > 0)) return 0;  // NaN too
  if (v >= 1.8e19) return UINT64_MAX;
  return static_cast<uint64_t>(v);
}

}  // namespace

BudgetState BudgetTick(const BudgetState& state, const BudgetInput& input,
                       const BudgetSettings& settings) {
  BudgetState next = state;
  const double rate = static_cast<double>(settings.rate_bytes_per_sec);
  const double burst = static_cast<double>(settings.burst_bytes);
  const uint32_t n = input.active > 0 ? input.active : 1;
  const uint32_t under_pace = std::min(input.under, n);
  // A tick that saw no packet (its visits held only new connections, or
  // none of the slow ones) keeps the size last seen: falling back to the
  // unknown size would take the controller's reach away in the middle of a
  // run (a stream of new connections held to the equal share, over the
  // rate). A fresh start forgets it.
  next.packet_bytes =
      input.packet_bytes != 0 ? input.packet_bytes : state.packet_bytes;
  const int64_t dt_ns = ElapsedNs(input.now_ns, state.last_ns);
  const int64_t max_gap_ns = std::max(kBudgetMaxGapNs, input.max_gap_ns);
  if (state.last_ns == 0 || dt_ns > max_gap_ns || dt_ns < 0 ||
      input.sent_bytes < state.sent_bytes) {
    // A fresh start: nothing banked, nothing owed, an equal split (a
    // single connection is not held back at all).
    next.last_ns = input.now_ns;
    next.sent_bytes = input.sent_bytes;
    next.packet_bytes = input.packet_bytes;
    next.start_ns = input.now_ns;
    next.start_allowance_bytes = 0;
    next.start_pending_bytes = input.start_pending_bytes;
    next.balance_bytes = 0;
    next.under_ticks = 0;
    next.boost = n == 1 ? kBoostUnbound : kBoostOne;
    // Until measured, several connections are taken to be sending at the
    // rate: nothing is unbound before it is seen to be under it.
    next.measured_bytes_per_sec = n == 1 ? 0 : settings.rate_bytes_per_sec;
    next.level_bytes_per_sec = LevelFor(next, n, settings);
    return next;
  }
  next.start_pending_bytes = input.start_pending_bytes;
  if (dt_ns == 0) return next;
  if (input.count_late_ns > kBudgetLateHoldNs && dt_ns < kBudgetMaxHoldNs) {
    // Part of the count is late: decided once it is in, over the whole
    // span, where the bytes it brings are no lump.
    return next;
  }
  const double dt = static_cast<double>(dt_ns);
  double bytes = static_cast<double>(input.sent_bytes - state.sent_bytes);

  // The pace depends on the level in force, the packet size and the
  // connections, none of which this tick changes before it decides.
  const KeyPace pace =
      PaceOf(next, settings, n, static_cast<double>(input.count_lag_ns));
  // The token bucket: at most `burst` banked, at most kBudgetMaxDebtNs owed.
  double balance =
      static_cast<double>(state.balance_bytes) + rate * dt / kNsPerSecF - bytes;
  // New connections' unpaced starts: forgiven as they show as a debt, all
  // of them early in the run, from the allowance later. Forgiven bytes are
  // left out of the measured rate too, so that they do not move the boost.
  double pending = static_cast<double>(input.start_pending_bytes);
  double allowance = static_cast<double>(state.start_allowance_bytes);
  if (pending < kUnpacedStartBytes / 2) {
    allowance = std::min(rate * kAllowanceNs / kNsPerSecF,
                         allowance + rate * kAllowanceRefill * dt / kNsPerSecF);
  }
  const bool grace = ElapsedNs(input.now_ns, state.start_ns) < kStartGraceNs;
  if (balance < 0 && pending > 0) {
    const double forgiven =
        std::min({pending, grace ? pending : allowance, -balance, bytes});
    balance += forgiven;
    bytes -= forgiven;
    pending -= forgiven;
    if (!grace) allowance -= forgiven;
  }
  pending *= std::exp(-dt / kPendingLapseNs);
  next.start_allowance_bytes = SaturatingUint64(allowance);
  // Never more than came in: a count too large for a double's 53 bits
  // (only a zone's garbage holds one) can round up.
  next.start_pending_bytes =
      std::min(input.start_pending_bytes, SaturatingUint64(pending));
  // While every connection is held back by its pacing the count's lumps
  // (packets sent in step, measured a little late) may go either way by
  // the band: what it shows banked within the band is kept too, or the
  // lumps would leave a debt on average while the key sends its rate.
  // Bounded the same both ways then: connections sending large packets
  // in step show seconds of nothing and then a lump of more than the band,
  // and a bank clipped shorter than the debt each lump leaves would hold
  // the key under its rate on average.
  const bool all_paced = under_pace == 0 && state.boost != kBoostUnbound;
  const double max_debt = rate * kBudgetMaxDebtNs / kNsPerSecF;
  balance =
      Clamp(balance, -max_debt,
            all_paced ? std::max(burst + pace.band_bytes, max_debt) : burst);
  next.balance_bytes = SaturatingInt64(balance);
  const double now_rate = bytes * kNsPerSecF / dt;

  const double alpha = 1 - std::exp(-dt / kMeasuredTauNs);
  const double measured =
      static_cast<double>(state.measured_bytes_per_sec) +
      (now_rate - static_cast<double>(state.measured_bytes_per_sec)) * alpha;
  next.measured_bytes_per_sec = SaturatingUint64(measured);

  if (state.boost == kBoostUnbound) {
    if (measured >= kBindAbove * rate || balance < -burst / 2) {
      // Bound from now: if every sending connection sent at the whole
      // rate, the equal share is right; if only some did, the share of
      // those that sent. The ticks refine it.
      const double sent = std::max({measured, now_rate, rate});
      next.boost =
          under_pace == 0 ? kBoostOne : ToBoost(Clamp(n * rate / sent, 1.0, n));
    }
  } else {
    // Integral action: the boost rises while the key sends less than its
    // rate (some connections use less than their share: the rest split
    // what they leave) and falls while it sends more. A debt or a bank
    // beyond the band moves the level at once (BalanceFactor) and the
    // boost only slowly, so that repaying a burst does not leave the boost
    // low once it is repaid, while a debt that keeps coming back (the
    // unpaced starts of a stream of new connections) is absorbed in the
    // end.
    // The error is not clipped: bytes leave in packets, so the smoothed
    // rate swings between little and a lump, and clipping the lumps would
    // leave the boost rising on average while the key sends exactly its
    // rate (the smoothing is linear, so its mean is the rate sent). Only a
    // tick's step is bounded.
    const double error = (rate - measured) / rate;
    const double balance_error = BalanceFactor(next, rate, pace) - 1;
    double boost = static_cast<double>(state.boost) / kBoostOne;
    double integral_ns = pace.integral_ns;
    if (all_paced) {
      // Every sending connection is held back by its pacing: the equal
      // share is the max-min level, so the level is the equal share at
      // most, under only while the key sends more than its rate even so.
      // The count moves in whole packets, often in step: the boost follows
      // that noise both ways within kPacedBoostCeiling, above the level's
      // clip at 1, so that it does not hold the level under the equal
      // share on average; and while the balance is within the band, where
      // those lumps are most of what it shows, it goes down twice as
      // slowly as it comes back up, unless the packet shaper keeps the
      // connections out of step (BudgetInput::shaped).
      boost = std::min(boost, kPacedBoostCeiling);
      if (!input.shaped && balance_error >= 0 && error <= 0) integral_ns *= 2;
    }
    boost *= std::exp(Clamp(error * dt / integral_ns, -1.0, 1.0) +
                      balance_error * dt / kBalanceIntegralNs);
    if (boost > kBurstRuleBoost && pace.gap_ns <= 5 * kBudgetTickNs &&
        now_rate > 2 * rate && measured > 1.25 * rate) {
      // A burst well over the rate from a key whose level was well above
      // the equal share: its connections went from using little to all
      // sending at once. Give way now, not over several ticks; the equal
      // share is right when all send. Not for a boost of kBurstRuleBoost
      // or less: all sending at once is then at most that much over the
      // rate, which the balance's factor repays at once, and one slow
      // reader whose window opened for 150 ms (the key at 1.3 times its
      // rate) had the boost taken back to 1 and the key held at 0.83-0.87
      // of its rate for the second after, while the boost came back.
      boost = std::max(1.0, boost * rate / now_rate);
    }
    // Clearly under the rate for a while, with allowance banked: room to
    // spare, so the boost doubles per tick, up to the whole rate (unbound).
    // A while: at least kUnderTicks, and two gaps between packets, since
    // connections sending large packets in step are silent in between.
    // Not while every connection is held back by its pacing: the equal
    // share is right then whatever the count says.
    const bool under_now =
        !all_paced && measured < kUnbindBelow * rate && balance >= burst / 2;
    next.under_ticks = under_now ? state.under_ticks + 1 : 0;
    const double under_for_ns =
        std::max<double>(kUnderTicks * kBudgetTickNs, 2 * pace.gap_ns);
    const bool under =
        next.under_ticks * static_cast<double>(dt_ns) >= under_for_ns;
    if (under) boost *= 2;
    // The max-min level is at most the rate over the connections that
    // are held back (1 when all are: the level takes the boost as 1 at
    // most then, below, and the boost keeps kPacedBoostCeiling's room).
    const double most = under_pace == 0 ? kPacedBoostCeiling
                        : under_pace < n
                            ? static_cast<double>(n) / (n - under_pace)
                            : n;
    next.boost = under && boost >= n
                     ? kBoostUnbound
                     : ToBoost(Clamp(boost, pace.min_boost, under ? n : most));
  }
  next.level_bytes_per_sec =
      LevelFor(next, n, settings, pace, all_paced ? 1.0 : kAnyBoost);
  next.last_ns = input.now_ns;
  next.sent_bytes = input.sent_bytes;
  return next;
}

BudgetState BudgetMembershipChange(const BudgetState& state,
                                   const BudgetSettings& settings,
                                   uint32_t old_active, uint32_t new_active) {
  BudgetState next = state;
  if (state.last_ns == 0 || old_active == 0) {
    // No decision yet: an equal split (nothing held back when alone).
    next.boost = new_active <= 1 ? kBoostUnbound : kBoostOne;
  } else if (state.boost == kBoostUnbound && new_active > old_active &&
             JoinersMayFillTheRate(state, settings, new_active)) {
    // Joiners of a key not held back: each would be paced at the whole
    // rate until the next tick binds it, and a client that opens its
    // connections a moment after its first sends that many times its rate
    // meanwhile (64 connections at 500k: 1.3 MB over it in 50 ms, and the
    // shaper's pieces cut at the whole rate, 13-29 KB, then left its
    // connections in lumps for seconds: 1 s windows at 0.4-1.3). Bound now,
    // at an equal split, unless the key is known to send little; the ticks
    // unbind it again if it does (kUnderTicks).
    next.boost = kBoostOne;
  } else if (state.boost != kBoostUnbound && new_active < old_active &&
             new_active > 0) {
    // A leave: the survivors keep their level, or get their equal share
    // if that is more (the max-min level is at least the equal share).
    // A join keeps the boost, so the joiner takes its share from the
    // others at once: level x old / new.
    // A boost below 1 (the key sends more than its rate even at equal
    // shares: unpaced starts of many new connections) stays as it is.
    const double boost = static_cast<double>(state.boost) / kBoostOne;
    next.boost = ToBoost(
        std::max(boost * new_active / old_active, std::min(boost, 1.0)));
  }
  // A boost above 1 whose level was the equal share (every connection held
  // back by its pacing: kPacedBoostCeiling's room) gives the equal share
  // again.
  const bool paced_room =
      next.boost != kBoostUnbound && next.boost > kBoostOne && old_active > 0 &&
      state.level_bytes_per_sec > 0 &&
      state.level_bytes_per_sec <= LevelFor(state, old_active, settings, 1.0);
  next.level_bytes_per_sec =
      LevelFor(next, new_active, settings, paced_room ? 1.0 : kAnyBoost);
  return next;
}

bool LevelWorthApplying(uint64_t applied_bytes_per_sec,
                        uint64_t level_bytes_per_sec,
                        uint64_t equal_bytes_per_sec) {
  if (applied_bytes_per_sec == 0) return true;
  if (level_bytes_per_sec == equal_bytes_per_sec) {
    return level_bytes_per_sec != applied_bytes_per_sec;
  }
  const uint64_t hi = std::max(applied_bytes_per_sec, level_bytes_per_sec);
  const uint64_t lo = std::min(applied_bytes_per_sec, level_bytes_per_sec);
  // 4%: above tick-to-tick noise. A level off by less is corrected through
  // the balance (the target moves), so it costs no accuracy over a second.
  return hi - lo > hi / 25;
}

bool PaceNearLevel(uint64_t pace_bytes_per_sec, uint64_t level_bytes_per_sec) {
  const uint64_t diff = level_bytes_per_sec > pace_bytes_per_sec
                            ? level_bytes_per_sec - pace_bytes_per_sec
                            : pace_bytes_per_sec - level_bytes_per_sec;
  return pace_bytes_per_sec != 0 && diff < pace_bytes_per_sec / 16;
}

uint64_t DefaultBurstBytes(uint64_t rate_bytes_per_sec) {
  const uint64_t burst = rate_bytes_per_sec / 20;
  return std::max<uint64_t>(burst, 16 * 1024);
}

}  // namespace trafficrate
