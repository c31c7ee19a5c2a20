#include "tests/bench/cluster_bench_case.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/cluster/cluster.h"
#include "src/cluster/cluster_agent.h"
#include "src/config/cluster_url.h"
#include "src/shm/robust_mutex.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"
#include "tests/bench/cluster_bench.h"
#include "tests/bench/cluster_bench_cpu.h"
#include "tests/bench/cluster_bench_redis.h"

namespace trafficrate {
namespace cluster_bench {
namespace {

struct Host {
  std::string zone_name;
  std::unique_ptr<Zone> zone;
  uint32_t proc = kNoSlot;
  ClusterAgentOptions options;
  std::unique_ptr<ClusterAgent> agent;
  uint32_t measured = kNoSlot;  // the measured key's slot
  std::string thread_dir;       // /proc/self/task/TID of its agent
};

std::vector<uint8_t> KeyBytes(uint32_t n) {
  std::vector<uint8_t> k(kKeyBytes, 0);
  std::memcpy(k.data(), &n, sizeof(n));
  k[19] = 0x5a;
  return k;
}

constexpr uint8_t kPeer[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                               0, 0, 0xff, 0xff, 127, 0, 0, 1};

// A process slot; its liveness mutex let go at once (tests/cluster_agent_
// test.cc: one thread must not hold robust mutexes in two zones).
uint32_t ClaimProc(Zone& zone) {
  HeldMutex liveness;
  uint32_t proc = kNoSlot;
  {
    ZoneLock lock(zone, kWatcherLockWaitNs);
    if (!lock.ok()) return kNoSlot;
    proc = zone.procs().ClaimLocked(getpid(), MonotonicNowNs(), &liveness);
  }
  liveness.Release();
  return proc;
}

// Starts (or restarts) h's agent delay_ns from now and finds its thread;
// false if it did not start within 2 s. A running agent's thread ends when
// it wakes for its next tick: the delay counts from then, so that it sets
// the new thread's phase.
bool StartAgent(Host& h, int64_t delay_ns) {
  static Logger logger;  // to stderr
  h.agent.reset();       // joins its thread
  h.thread_dir.clear();
  SleepNs(delay_ns);
  const std::set<std::string> before = AgentThreads();
  h.agent = std::make_unique<ClusterAgent>(h.zone.get(), &logger, h.options);
  h.agent->Poll(h.proc, MonotonicNowNs());
  WaitFor(
      [&] {
        for (const std::string& tid : AgentThreads()) {
          if (before.count(tid) == 0) {
            h.thread_dir = "/proc/self/task/" + tid;
            return true;
          }
        }
        return false;
      },
      2 * kNsPerSec, kNsPerMs);
  if (!h.agent->running() || h.thread_dir.empty()) {
    std::fprintf(stderr, "cluster_bench: agent %s not running\n",
                 h.options.host_id.c_str());
    return false;
  }
  return true;
}

// Registers and joins a connection of key slot k; its slot or kNoSlot.
uint32_t JoinLocked(Host& h, uint32_t k, int fd) {
  const uint32_t c = h.zone->conns().RegisterLocked(k, h.proc, fd, kPeer, 4242);
  if (c == kNoSlot) return kNoSlot;
  h.zone->conns().JoinLocked(c);
  return c;
}

// Keys 0 .. keys - 1 (0 is the measured one, kMeasuredConns connections;
// the others 1 each).
bool Populate(Host& h, uint32_t keys) {
  ZoneLock lock(*h.zone, kWatcherLockWaitNs);
  if (!lock.ok()) return false;
  int fd = 100;
  const int64_t now = MonotonicNowNs();
  for (uint32_t n = 0; n < keys; ++n) {
    const std::vector<uint8_t> bytes = KeyBytes(n);
    const uint32_t k = h.zone->keys().FindOrInsertLocked(bytes.data(), now);
    if (k == kNoSlot) return false;
    if (n == 0) h.measured = k;
    const uint32_t conns = n == 0 ? kMeasuredConns : 1;
    for (uint32_t i = 0; i < conns; ++i) {
      if (JoinLocked(h, k, fd++) == kNoSlot) return false;
    }
  }
  return true;
}

uint64_t ExpectedShare(uint32_t mine, uint32_t other) {
  const std::vector<double> shares =
      MaxMinShares(static_cast<double>(kRate),
                   {{std::numeric_limits<double>::infinity(), mine},
                    {std::numeric_limits<double>::infinity(), other}});
  return std::clamp<uint64_t>(std::llround(shares[0]), 1, kRate);
}

}  // namespace

Result RunCase(const Options& o, RedisServer& server, RedisClient& redis,
               uint32_t keys, uint64_t zone_bytes, std::mt19937& rng) {
  Result r;
  r.keys = keys;
  r.zone_bytes = zone_bytes;
  const int64_t setup_start = MonotonicNowNs();
  Host hosts[kHosts];
  std::uniform_int_distribution<int64_t> pause(0, kTickNs);
  const std::string name = "bench" + std::to_string(keys);
  const char* ids[kHosts] = {"bench-a", "bench-b"};
  bool ok = true;
  for (int i = 0; i < kHosts && ok; ++i) {
    Host& h = hosts[i];
    h.zone_name = "clbench" + std::to_string(getpid()) + "_" + ids[i] + "_" +
                  std::to_string(keys);
    (void)ZoneSegment::Unlink(h.zone_name);
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(h.zone_name, zone_bytes, kRate);
    if (!zone.ok()) {
      std::fprintf(stderr, "cluster_bench: %s\n",
                   zone.status().ToString().c_str());
      ok = false;
      break;
    }
    h.zone = std::move(*zone);
    r.key_capacity = h.zone->keys().capacity();
    h.proc = ClaimProc(*h.zone);
    ok = h.proc != kNoSlot && Populate(h, keys);
    if (!ok) {
      std::fprintf(stderr, "cluster_bench: cannot hold %u keys in %s\n", keys,
                   h.zone_name.c_str());
    }
  }
  // The agents, each on its own thread (found by name as it appears).
  for (int i = 0; i < kHosts && ok; ++i) {
    Host& h = hosts[i];
    h.options.url.host = "127.0.0.1";
    h.options.url.port = server.port();
    h.options.name = name;
    h.options.secret = kSecret;
    h.options.host_id = ids[i];
    h.options.tick_ns = kTickNs;
    // b's ticks at a random phase against a's.
    ok = StartAgent(h, i == 0 ? 0 : pause(rng));
  }
  Host& a = hosts[0];
  Host& b = hosts[1];
  auto share = [](const Host& h) {
    return h.zone->keys()
        .slot(h.measured)
        .cluster_share.load(std::memory_order_relaxed);
  };
  const uint64_t half = ExpectedShare(kMeasuredConns, kMeasuredConns);
  const uint64_t after_join = ExpectedShare(kMeasuredConns, kMeasuredConns + 1);
  // Both hosts share the measured key, and every key is shared.
  auto converged = [&] {
    return WaitFor(
               [&] {
                 if (share(a) != half || share(b) != half) return false;
                 for (const Host& h : hosts) {
                   for (uint32_t k = 0; k < h.zone->keys().capacity(); ++k) {
                     const KeySlotShm& key = h.zone->keys().slot(k);
                     if (key.in_use.load() == 1 && key.active.load() > 0 &&
                         key.cluster_hosts.load() != kHosts) {
                       return false;
                     }
                   }
                 }
                 return true;
               },
               30 * kNsPerSec, 10 * kNsPerMs) >= 0;
  };
  if (ok) {
    ok = converged();
    if (!ok) {
      std::fprintf(stderr,
                   "cluster_bench: %u keys: the hosts did not converge "
                   "(shares %" PRIu64 " and %" PRIu64 ", want %" PRIu64 ")\n",
                   keys, share(a), share(b), half);
    }
  }
  r.ready = ok;
  r.setup_s = Seconds(MonotonicNowNs() - setup_start);
  uint64_t failures_before = 0;
  for (const Host& h : hosts) {
    if (h.zone != nullptr)
      failures_before += h.zone->settings().cluster().failures.load();
  }

  // The quiet window.
  if (ok) {
    SleepNs(3 * kTickNs);  // past the last share moves of the set-up
    int64_t cpu0[kHosts], cpu1[kHosts];
    uint64_t ex0[kHosts], ex1[kHosts];
    for (int i = 0; i < kHosts; ++i) {
      cpu0[i] = ThreadCpuNs(hosts[i].thread_dir);
      ex0[i] = hosts[i].zone->settings().cluster().exchanges.load();
    }
    const int64_t redis_cpu0 = ProcessCpuNs(server.pid());
    const RedisStats s0 = ReadStats(redis);
    const int64_t t0 = MonotonicNowNs();
    std::vector<double> rtt;
    const int64_t window_ns = static_cast<int64_t>(o.window_s * 1e9);
    for (int i = 0; i < 100'000 && !g_stop.load(); ++i) {
      if (MonotonicNowNs() - t0 >= window_ns) break;
      SleepNs(kTickNs / 2);
      for (const Host& h : hosts) {
        rtt.push_back(h.zone->settings().cluster().rtt_us.load() / 1000.0);
      }
    }
    const RedisStats s1 = ReadStats(redis);
    const int64_t t1 = MonotonicNowNs();
    const int64_t redis_cpu1 = ProcessCpuNs(server.pid());
    for (int i = 0; i < kHosts; ++i) {
      cpu1[i] = ThreadCpuNs(hosts[i].thread_dir);
      ex1[i] = hosts[i].zone->settings().cluster().exchanges.load();
    }
    const double secs = Seconds(t1 - t0);
    r.window_s = secs;
    for (int i = 0; i < kHosts; ++i) {
      const double cpu_ns = static_cast<double>(cpu1[i] - cpu0[i]);
      const double ex = static_cast<double>(ex1[i] - ex0[i]);
      r.exchanges_per_s[i] = ex / secs;
      r.agent_cpu_pct[i] = cpu_ns / (secs * 1e9) * 100;
      r.agent_cpu_ms_per_exchange[i] = ex > 0 ? cpu_ns / ex / 1e6 : NAN;
    }
    r.redis_cpu_pct =
        static_cast<double>(redis_cpu1 - redis_cpu0) / (secs * 1e9) * 100;
    if (s0.ok && s1.ok) {
      uint64_t total = 0;
      for (const auto& [command, n1] : s1.calls) {
        if (command == "info") continue;  // the benchmark's own
        const auto it = s0.calls.find(command);
        const uint64_t n = n1 - (it == s0.calls.end() ? 0 : it->second);
        if (n == 0) continue;
        total += n;
        r.command_per_s_per_host[command] =
            static_cast<double>(n) / secs / kHosts;
      }
      r.commands_per_s_per_host = static_cast<double>(total) / secs / kHosts;
      // Less the first INFO's reply and the second INFO's request.
      const double in = static_cast<double>(s1.net_in - s0.net_in) -
                        static_cast<double>(RequestBytes(InfoCommand()));
      const double out = static_cast<double>(s1.net_out - s0.net_out) -
                         static_cast<double>(s0.reply_bytes);
      r.sent_Bps_per_host = in / secs / kHosts;
      r.received_Bps_per_host = out / secs / kHosts;
    } else {
      std::fprintf(stderr, "cluster_bench: cannot read INFO from Redis\n");
    }
    if (!rtt.empty()) {
      std::sort(rtt.begin(), rtt.end());
      r.rtt_ms_median = rtt[rtt.size() / 2];
      r.rtt_ms_max = rtt.back();
    }
  }

  // Joins and leaves on A, seen on B. Every kJoinsPerPhase joins, B's
  // agent restarts after a random pause: the phase of B's ticks against A's
  // is then uniform over the run, as between the hosts of a fleet.
  for (int i = 0; i < o.joins && ok && !g_stop.load(); ++i) {
    if (i > 0 && i % kJoinsPerPhase == 0) {
      ok = StartAgent(b, pause(rng)) && converged();
      if (!ok) {
        std::fprintf(stderr,
                     "cluster_bench: %u keys: no convergence after host b's "
                     "agent restarted\n",
                     keys);
        break;
      }
      ++r.phases;
    }
    SleepNs(pause(rng));
    uint32_t c = kNoSlot;
    int64_t start = 0;
    {
      ZoneLock lock(*a.zone, kWatcherLockWaitNs);
      if (!lock.ok()) break;
      start = MonotonicNowNs();
      c = JoinLocked(a, a.measured, 10'000'000 + i);
    }
    if (c == kNoSlot) break;
    int64_t done = WaitFor([&] { return share(b) == after_join; },
                           kChangeTimeoutNs, kPollNs);
    if (done < 0) {
      ++r.join.failed;
    } else {
      r.join.ms.push_back(static_cast<double>(done - start) / 1e6);
    }
    SleepNs(pause(rng));
    {
      ZoneLock lock(*a.zone, kWatcherLockWaitNs);
      if (!lock.ok()) break;
      start = MonotonicNowNs();
      a.zone->conns().DeregisterLocked(c);
    }
    done = WaitFor([&] { return share(b) == half; }, kChangeTimeoutNs, kPollNs);
    if (done < 0) {
      ++r.leave.failed;
      // Back to the start before the next join (bounded).
      WaitFor([&] { return share(b) == half; }, kChangeTimeoutNs, kPollNs);
    } else {
      r.leave.ms.push_back(static_cast<double>(done - start) / 1e6);
    }
  }
  uint64_t failures_after = 0;
  for (const Host& h : hosts) {
    if (h.zone != nullptr)
      failures_after += h.zone->settings().cluster().failures.load();
  }
  r.failures = failures_after - failures_before;
  for (Host& h : hosts) {
    h.agent.reset();  // joins its thread
    h.zone.reset();
    (void)ZoneSegment::Unlink(h.zone_name);
  }
  return r;
}

uint64_t ZoneBytesFor(uint32_t keys) {
  uint64_t size = uint64_t{1} << 20;
  while (size < kMaxZoneSize) {
    const ZoneGeometry g = ComputeZoneGeometry(size);
    if (g.key_capacity >= keys + 64 && g.conn_capacity >= keys + 64) break;
    size *= 2;
  }
  return size;
}

}  // namespace cluster_bench
}  // namespace trafficrate
