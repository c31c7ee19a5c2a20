// What cluster_bench prints: one table, a column per key count, and with
// --json every figure and the latency samples in a file.

#ifndef TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REPORT_H_
#define TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "tests/bench/cluster_bench.h"

namespace trafficrate {
namespace cluster_bench {

// The table, to stdout.
void PrintTable(const std::vector<Result>& results, int port,
                const std::string& version, double load);

// The JSON file at `path`; false (and a line on stderr) if it could not be
// written.
bool WriteJson(const std::string& path, const std::vector<Result>& results,
               const Options& o, int port, const std::string& version,
               double load, bool quick);

}  // namespace cluster_bench
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REPORT_H_
