// CPU time from /proc, for cluster_bench: of one thread, of every thread
// of a process (redis-server's), and which of this process's threads are
// cluster agents (named kThreadName).

#ifndef TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CPU_H_
#define TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CPU_H_

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>

namespace trafficrate {
namespace cluster_bench {

// Time on a CPU, ns, of one thread (/proc/PID/task/TID/schedstat); -1 if gone.
int64_t ThreadCpuNs(const std::string& task_dir);

// Every thread of a process.
int64_t ProcessCpuNs(pid_t pid);

// This process's threads named kThreadName.
std::set<std::string> AgentThreads();

}  // namespace cluster_bench
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_CPU_H_
