// The parts of cluster_bench (cluster_bench.cc says what it measures):
// its constants, the stop flag its signal handler sets, and the figures of
// one case. Parts: cluster_bench_redis (the redis-server it starts and its
// INFO), cluster_bench_cpu (CPU time from /proc), cluster_bench_case (the
// two hosts, one case run), cluster_bench_report (the table and the JSON).

#ifndef TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_H_
#define TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/base/clock.h"

namespace trafficrate {
namespace cluster_bench {

inline constexpr uint64_t kRate = 100'000'000;  // bytes/s, the rule's rate
inline constexpr uint32_t kMeasuredConns = 2;   // of the measured key, per host
inline constexpr int kHosts = 2;
inline constexpr char kSecret[] = "bench-secret-0123456789";
inline constexpr char kThreadName[] = "trafficrate-cl";
inline constexpr int64_t kChangeTimeoutNs = 2 * kNsPerSec;
inline constexpr int64_t kPollNs = 200'000;  // the clock's resolution
inline constexpr int64_t kTickNs = 100 * kNsPerMs;
inline constexpr int kJoinsPerPhase = 5;

// Set by SIGINT and SIGTERM: every loop ends early.
inline std::atomic<bool> g_stop{false};

inline double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// Polls until `done` or timeout_ns; returns when it became true, or -1.
template <typename Predicate>
int64_t WaitFor(Predicate done, int64_t timeout_ns, int64_t poll_ns) {
  const int64_t deadline = MonotonicNowNs() + timeout_ns;
  const int64_t limit = timeout_ns / std::max<int64_t>(poll_ns / 4, 1) + 10;
  for (int64_t i = 0; i < limit && !g_stop.load(); ++i) {
    if (done()) return MonotonicNowNs();
    if (MonotonicNowNs() > deadline) break;
    SleepNs(poll_ns);
  }
  return done() ? MonotonicNowNs() : -1;
}

struct Latency {
  std::vector<double> ms;
  int failed = 0;
  double At(double q) const {
    if (ms.empty()) return NAN;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s[static_cast<size_t>(q * static_cast<double>(s.size() - 1) + 0.5)];
  }
  double Max() const {
    return ms.empty() ? NAN : *std::max_element(ms.begin(), ms.end());
  }
};

struct Result {
  uint32_t keys = 0;
  uint64_t zone_bytes = 0;
  uint32_t key_capacity = 0;
  bool ready = false;
  double setup_s = 0;
  double window_s = 0;
  double exchanges_per_s[kHosts] = {};
  double commands_per_s_per_host = 0;
  std::map<std::string, double> command_per_s_per_host;
  double sent_Bps_per_host = 0;      // host -> Redis
  double received_Bps_per_host = 0;  // Redis -> host
  double agent_cpu_pct[kHosts] = {};
  double agent_cpu_ms_per_exchange[kHosts] = {};
  double redis_cpu_pct = 0;
  double rtt_ms_median = NAN;
  double rtt_ms_max = NAN;
  uint64_t failures = 0;  // failed exchanges over the whole case
  int phases = 1;         // phases of b's ticks against a's
  Latency join;
  Latency leave;
};

struct Options {
  std::vector<uint32_t> keys = {10, 10'000};
  int joins = 100;
  double window_s = 5;
  std::string redis = "/usr/bin/redis-server";
  std::string json;
};

}  // namespace cluster_bench
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_H_
