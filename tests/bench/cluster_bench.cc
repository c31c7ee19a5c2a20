// Fleet sharing benchmark (issue 13): what the cluster agent costs and how
// fast a join on one host reaches the other, against a real redis-server.
//
//   cluster_bench [--keys 10,10000] [--joins N] [--window-s S] [--quick]
//                 [--redis /usr/bin/redis-server] [--json FILE]
//
// Two hosts are two zones of this process, each with its own ClusterAgent
// (its own thread "trafficrate-cl", its own Redis connection, host ids
// bench-a and bench-b, one cluster name, secret and URL), as in
// tests/cluster/cluster_agent_test.cc; no LD_PRELOAD and no sockets:
// connections are registered and joined in the zones directly. The benchmark
// starts redis-server itself on 127.0.0.1 and a free port (--save ""
// --appendonly no) and stops it by pid at the end.
//
// For each key count K of --keys, in fresh zones and a cluster name of its
// own: the measured key with 2 sending connections on each host, and K - 1
// more keys, the same on both hosts, with 1 sending connection each (so K
// active keys per host, every one shared by both). Once both hosts show the
// measured key's half share:
//   * a quiet window of --window-s seconds: Redis commands per second per
//     host (INFO commandstats deltas, the benchmark's own INFO left out,
//     divided by the 2 hosts), bytes per second each host sends to and
//     receives from Redis (total_net_input_bytes / total_net_output_bytes,
//     the INFO requests and replies left out, divided by 2), each agent
//     thread's CPU (/proc/self/task/TID/schedstat) as % of a core and per
//     exchange, redis-server's CPU (every thread's schedstat), the exchanges
//     per second and their round trips (ClusterShm::rtt_us, sampled);
//   * --joins times (after a random pause of up to one tick, so that joins
//     land at every phase of both agents' ticks): a connection of the
//     measured key joins on host A (2 -> 3) and the clock runs until host
//     B's KeySlotShm::cluster_share for the key is its new max-min share
//     (2 of 5); then the connection leaves and the clock runs until B's share
//     is back to half. Median, p99 and max of each; a change not seen within
//     2 s counts as failed. The time is the zone's share, not yet the
//     sockets' pacing (the watcher's part is convergence_bench's). Every 5
//     joins B's agent is restarted after a random pause (and the hosts
//     converge again, unmeasured), so that the phase of B's ticks against
//     A's, which sets how long A's figures wait in Redis, is spread over a
//     tick as between the hosts of a fleet rather than fixed by when the
//     two threads happened to start.
// Prints one table (a column per key count) and, with --json, writes every
// figure and the latency samples there.

#include "tests/bench/cluster_bench.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/bench/cluster_bench_case.h"
#include "tests/bench/cluster_bench_redis.h"
#include "tests/bench/cluster_bench_report.h"

namespace trafficrate {
namespace cluster_bench {
namespace {

void OnSignal(int) { g_stop.store(true); }

int Main(int argc, char** argv) {
  Options o;
  bool quick = false;
  int joins = -1;
  double window_s = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (flag == "--quick") {
      quick = true;
      continue;
    }
    if (value == nullptr) {
      std::fprintf(stderr, "cluster_bench: %s needs a value\n", flag.c_str());
      return 2;
    }
    ++i;
    if (flag == "--keys") {
      o.keys.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        uint32_t n = 0;
        if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 1'000'000) {
          std::fprintf(stderr, "cluster_bench: bad --keys %s\n", value);
          return 2;
        }
        o.keys.push_back(n);
      }
    } else if (flag == "--joins") {
      joins = std::clamp(std::atoi(value), 0, 100'000);
    } else if (flag == "--window-s") {
      window_s = std::clamp(std::atof(value), 0.5, 600.0);
    } else if (flag == "--redis") {
      o.redis = value;
    } else if (flag == "--json") {
      o.json = value;
    } else {
      std::fprintf(stderr, "cluster_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  o.joins = joins >= 0 ? joins : quick ? 20 : 100;
  o.window_s = window_s > 0 ? window_s : quick ? 2 : 5;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  prctl(PR_SET_TIMERSLACK, 1UL);  // 200 us polls, not 250 us

  if (access(o.redis.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "cluster_bench: %s not found (apt-get install redis-server)\n",
                 o.redis.c_str());
    return 1;
  }
  const int port = FreePort();
  RedisServer server(o.redis, port);
  RedisClient redis;
  if (server.pid() <= 0 || !redis.Connect(port)) {
    std::fprintf(stderr, "cluster_bench: redis-server did not answer on %d\n",
                 port);
    return 1;
  }
  const std::string version = ReadStats(redis).version;
  uint32_t most = 0;
  for (uint32_t k : o.keys) most = std::max(most, k);
  // One zone size for every case, so that the agents' scans of the key
  // table are the same size and only the active keys differ.
  const uint64_t zone_bytes = ZoneBytesFor(most);
  std::mt19937 rng(13);
  std::vector<Result> results;
  for (uint32_t keys : o.keys) {
    if (g_stop.load()) break;
    std::fprintf(stderr, "cluster_bench: %u keys per host, %d joins...\n", keys,
                 o.joins);
    results.push_back(RunCase(o, server, redis, keys, zone_bytes, rng));
  }
  double load[1] = {0};
  getloadavg(load, 1);
  server.Stop();
  PrintTable(results, port, version, load[0]);
  bool ok = !g_stop.load();
  for (const Result& r : results) {
    ok = ok && r.ready && r.join.failed == 0 && r.leave.failed == 0 &&
         static_cast<int>(r.join.ms.size()) == o.joins;
  }
  if (!o.json.empty() &&
      !WriteJson(o.json, results, o, port, version, load[0], quick)) {
    ok = false;
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace cluster_bench
}  // namespace trafficrate

int main(int argc, char** argv) {
  return trafficrate::cluster_bench::Main(argc, argv);
}
