// One case of cluster_bench: two hosts (two zones of this process, a
// ClusterAgent each) holding `keys` active keys each, run against the
// redis-server: the set-up, the quiet window, the joins and leaves.

#ifndef TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CASE_H_
#define TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CASE_H_

#include <cstdint>
#include <random>

#include "tests/bench/cluster_bench.h"
#include "tests/bench/cluster_bench_redis.h"

namespace trafficrate {
namespace cluster_bench {

// The smallest zone (1 MiB, doubling) with room for `keys` keys and their
// connections, and some to spare.
uint64_t ZoneBytesFor(uint32_t keys);

// Runs one case in fresh zones of zone_bytes (their names and a cluster
// name of its own from `keys`), and removes them after it.
Result RunCase(const Options& o, RedisServer& server, RedisClient& redis,
               uint32_t keys, uint64_t zone_bytes, std::mt19937& rng);

}  // namespace cluster_bench
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CASE_H_
