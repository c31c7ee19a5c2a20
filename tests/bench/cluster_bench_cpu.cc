#include "tests/bench/cluster_bench_cpu.h"

#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tests/bench/cluster_bench.h"

namespace trafficrate {
namespace cluster_bench {
namespace {

std::vector<std::string> Tasks(const std::string& proc_dir) {
  std::vector<std::string> out;
  DIR* d = opendir((proc_dir + "/task").c_str());
  if (d == nullptr) return out;
  for (int i = 0; i < 100'000; ++i) {
    dirent* e = readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

}  // namespace

int64_t ThreadCpuNs(const std::string& task_dir) {
  FILE* f = std::fopen((task_dir + "/schedstat").c_str(), "r");
  if (f == nullptr) return -1;
  unsigned long long ns = 0;
  const int n = std::fscanf(f, "%llu", &ns);
  std::fclose(f);
  return n == 1 ? static_cast<int64_t>(ns) : -1;
}

int64_t ProcessCpuNs(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  int64_t sum = 0;
  for (const std::string& tid : Tasks(dir)) {
    const int64_t ns = ThreadCpuNs(dir + "/task/" + tid);
    if (ns > 0) sum += ns;
  }
  return sum;
}

std::set<std::string> AgentThreads() {
  std::set<std::string> out;
  for (const std::string& tid : Tasks("/proc/self")) {
    FILE* f = std::fopen(("/proc/self/task/" + tid + "/comm").c_str(), "r");
    if (f == nullptr) continue;
    char comm[64] = {};
    const bool got = std::fgets(comm, sizeof(comm), f) != nullptr;
    std::fclose(f);
    if (got && std::strncmp(comm, kThreadName, std::strlen(kThreadName)) == 0) {
      out.insert(tid);
    }
  }
  return out;
}

}  // namespace cluster_bench
}  // namespace trafficrate
