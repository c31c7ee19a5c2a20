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

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/cluster/cluster.h"
#include "src/cluster/cluster_agent.h"
#include "src/config/cluster_url.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {
namespace {

constexpr uint64_t kRate = 100'000'000;  // bytes/s, the rule's rate
constexpr uint32_t kMeasuredConns = 2;   // of the measured key, per host
constexpr int kHosts = 2;
constexpr char kSecret[] = "bench-secret-0123456789";
constexpr char kThreadName[] = "trafficrate-cl";
constexpr int64_t kChangeTimeoutNs = 2 * kNsPerSec;
constexpr int64_t kPollNs = 200'000;  // the clock's resolution
constexpr int64_t kTickNs = 100 * kNsPerMs;
constexpr int kJoinsPerPhase = 5;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// --- redis-server, started and stopped by pid.

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 &&
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

class RedisServer {
 public:
  RedisServer(const std::string& path, int port) : port_(port) {
    const std::string port_text = std::to_string(port);
    pid_ = fork();
    if (pid_ == 0) {
      // Dies with the benchmark, however it ends.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = open("/dev/null", O_RDWR);
      if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
      }
      execl(path.c_str(), path.c_str(), "--port", port_text.c_str(), "--bind",
            "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize",
            "no", "--logfile", "/dev/null", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~RedisServer() { Stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }

  // SIGTERM, at most 5 s to exit, then SIGKILL.
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const int64_t deadline = MonotonicNowNs() + 5 * kNsPerSec;
    for (int i = 0; i < 5000; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      if (MonotonicNowNs() > deadline) break;
      SleepNs(kNsPerMs);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

// The benchmark's own connection, for INFO.
class RedisClient {
 public:
  ~RedisClient() {
    if (c_ != nullptr) redisFree(c_);
  }
  // Connects and PINGs, retrying for at most 5 s.
  bool Connect(int port) {
    const int64_t deadline = MonotonicNowNs() + 5 * kNsPerSec;
    timeval tv{1, 0};
    for (int i = 0; i < 500 && MonotonicNowNs() < deadline; ++i) {
      redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
      if (c != nullptr && c->err == 0 && redisSetTimeout(c, tv) == REDIS_OK) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
        if (r != nullptr) freeReplyObject(r);
        if (ok) {
          c_ = c;
          return true;
        }
      }
      if (c != nullptr) redisFree(c);
      SleepNs(10 * kNsPerMs);
    }
    return false;
  }

  // A command's bulk-string reply ("" on error).
  std::string Bulk(const std::vector<std::string>& words) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& w : words) {
      argv.push_back(w.data());
      lens.push_back(w.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(
        c_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      out.assign(r->str, r->len);
    }
    if (r != nullptr) freeReplyObject(r);
    return out;
  }

 private:
  redisContext* c_ = nullptr;
};

// The bytes of a command as sent (RESP array of bulk strings).
uint64_t RequestBytes(const std::vector<std::string>& words) {
  auto header = [](char kind, size_t n) {
    return 1 + std::to_string(n).size() + 2 + (kind == '$' ? n + 2 : 0);
  };
  uint64_t bytes = header('*', words.size());
  for (const std::string& w : words) bytes += header('$', w.size());
  return bytes;
}

// The bytes of a bulk-string reply of `n` bytes.
uint64_t BulkReplyBytes(size_t n) {
  return 1 + std::to_string(n).size() + 2 + n + 2;
}

// One INFO stats + commandstats.
struct RedisStats {
  uint64_t commands = 0;                  // total_commands_processed
  uint64_t net_in = 0;                    // total_net_input_bytes
  uint64_t net_out = 0;                   // total_net_output_bytes
  uint64_t reply_bytes = 0;               // what this INFO's reply itself took
  std::map<std::string, uint64_t> calls;  // per command (lower case)
  std::string version;
  bool ok = false;
};

const std::vector<std::string>& InfoCommand() {
  static const auto* words =
      new std::vector<std::string>{"INFO", "server", "stats", "commandstats"};
  return *words;
}

RedisStats ReadStats(RedisClient& redis) {
  RedisStats s;
  const std::string text = redis.Bulk(InfoCommand());
  s.reply_bytes = BulkReplyBytes(text.size());
  int found = 0;
  for (absl::string_view line : absl::StrSplit(text, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = line.substr(colon + 1);
    if (name == "total_commands_processed") {
      found += absl::SimpleAtoi(value, &s.commands);
    } else if (name == "total_net_input_bytes") {
      found += absl::SimpleAtoi(value, &s.net_in);
    } else if (name == "total_net_output_bytes") {
      found += absl::SimpleAtoi(value, &s.net_out);
    } else if (name == "redis_version") {
      s.version = std::string(value);
    } else {
      // cmdstat_NAME:calls=N,usec=...
      absl::string_view command = name;
      if (!absl::ConsumePrefix(&command, "cmdstat_")) continue;
      absl::string_view calls = value;
      if (!absl::ConsumePrefix(&calls, "calls=")) continue;
      calls = calls.substr(0, calls.find(','));
      uint64_t n = 0;
      if (absl::SimpleAtoi(calls, &n)) s.calls[std::string(command)] = n;
    }
  }
  s.ok = found == 3;
  return s;
}

// --- CPU from /proc.

// Time on a CPU, ns, of one thread (/proc/PID/task/TID/schedstat); -1 if gone.
int64_t ThreadCpuNs(const std::string& task_dir) {
  FILE* f = std::fopen((task_dir + "/schedstat").c_str(), "r");
  if (f == nullptr) return -1;
  unsigned long long ns = 0;
  const int n = std::fscanf(f, "%llu", &ns);
  std::fclose(f);
  return n == 1 ? static_cast<int64_t>(ns) : -1;
}

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

// Every thread of a process.
int64_t ProcessCpuNs(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  int64_t sum = 0;
  for (const std::string& tid : Tasks(dir)) {
    const int64_t ns = ThreadCpuNs(dir + "/task/" + tid);
    if (ns > 0) sum += ns;
  }
  return sum;
}

// This process's threads named kThreadName.
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

// --- Hosts.

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

// The smallest zone (1 MiB, doubling) with room for `keys` keys and their
// connections, and some to spare.
uint64_t ZoneBytesFor(uint32_t keys) {
  uint64_t size = uint64_t{1} << 20;
  while (size < kMaxZoneSize) {
    const ZoneGeometry g = ComputeZoneGeometry(size);
    if (g.key_capacity >= keys + 64 && g.conn_capacity >= keys + 64) break;
    size *= 2;
  }
  return size;
}

std::string Fixed(double v, int decimals) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

void PrintTable(const std::vector<Result>& results, int port,
                const std::string& version, double load) {
  std::printf(
      "cluster: 2 hosts = 2 zones in one process, a ClusterAgent (thread %s, "
      "tick %lld ms) each; redis-server %s on 127.0.0.1:%d; every key on "
      "both hosts; load average %.2f\n",
      kThreadName, static_cast<long long>(kTickNs / kNsPerMs), version.c_str(),
      port, load);
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](const std::string& label, auto cell) {
    std::vector<std::string> cells;
    for (const Result& r : results) cells.push_back(r.ready ? cell(r) : "-");
    rows.emplace_back(label, cells);
  };
  auto pair = [](const double* v, int d) {
    return Fixed(v[0], d) + " / " + Fixed(v[1], d);
  };
  row("zone size MiB (key capacity)", [](const Result& r) {
    return Fixed(static_cast<double>(r.zone_bytes) / (1 << 20), 0) + " (" +
           std::to_string(r.key_capacity) + ")";
  });
  row("set-up until every key shared, s",
      [](const Result& r) { return Fixed(r.setup_s, 1); });
  row("exchanges/s, host a / b",
      [&](const Result& r) { return pair(r.exchanges_per_s, 1); });
  row("Redis commands/s per host",
      [](const Result& r) { return Fixed(r.commands_per_s_per_host, 1); });
  row("host -> Redis KB/s per host",
      [](const Result& r) { return Fixed(r.sent_Bps_per_host / 1e3, 1); });
  row("Redis -> host KB/s per host",
      [](const Result& r) { return Fixed(r.received_Bps_per_host / 1e3, 1); });
  row("agent thread CPU % of a core, a / b",
      [&](const Result& r) { return pair(r.agent_cpu_pct, 2); });
  row("agent CPU ms per exchange, a / b",
      [&](const Result& r) { return pair(r.agent_cpu_ms_per_exchange, 2); });
  row("redis-server CPU % of a core (2 hosts)",
      [](const Result& r) { return Fixed(r.redis_cpu_pct, 2); });
  row("exchange round trip ms, median / max", [](const Result& r) {
    return Fixed(r.rtt_ms_median, 2) + " / " + Fixed(r.rtt_ms_max, 2);
  });
  row("join on a -> b's share, median ms",
      [](const Result& r) { return Fixed(r.join.At(0.5), 1); });
  row("join on a -> b's share, p99 / max ms", [](const Result& r) {
    return Fixed(r.join.At(0.99), 1) + " / " + Fixed(r.join.Max(), 1);
  });
  row("leave on a -> b's share, median / p99 ms", [](const Result& r) {
    return Fixed(r.leave.At(0.5), 1) + " / " + Fixed(r.leave.At(0.99), 1);
  });
  row("joins measured (failed), b's phases", [](const Result& r) {
    return std::to_string(r.join.ms.size()) + " (" +
           std::to_string(r.join.failed + r.leave.failed) + "), " +
           std::to_string(r.phases);
  });
  row("failed exchanges (both hosts)",
      [](const Result& r) { return std::to_string(r.failures); });
  size_t label_w = 6;
  for (const auto& [label, cells] : rows)
    label_w = std::max(label_w, label.size());
  std::vector<size_t> w;
  for (const Result& r : results) {
    w.push_back(std::to_string(r.keys).size() + 10);
  }
  for (const auto& [label, cells] : rows) {
    for (size_t i = 0; i < cells.size(); ++i)
      w[i] = std::max(w[i], cells[i].size());
  }
  std::printf("%-*s", static_cast<int>(label_w), "active keys per host");
  for (size_t i = 0; i < results.size(); ++i) {
    std::printf("  %*u keys", static_cast<int>(w[i]) - 5, results[i].keys);
  }
  std::printf("\n");
  for (const auto& [label, cells] : rows) {
    std::printf("%-*s", static_cast<int>(label_w), label.c_str());
    for (size_t i = 0; i < cells.size(); ++i) {
      std::printf("  %*s", static_cast<int>(w[i]), cells[i].c_str());
    }
    std::printf("\n");
  }
}

std::string JsonNumber(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string JsonLatency(const Latency& l) {
  std::string s = "{\"n\": " + std::to_string(l.ms.size()) +
                  ", \"failed\": " + std::to_string(l.failed) +
                  ", \"median_ms\": " + JsonNumber(l.At(0.5)) +
                  ", \"p99_ms\": " + JsonNumber(l.At(0.99)) +
                  ", \"max_ms\": " + JsonNumber(l.Max()) +
                  ", \"samples_ms\": [";
  for (size_t i = 0; i < l.ms.size(); ++i) {
    s += (i ? ", " : "") + JsonNumber(l.ms[i]);
  }
  return s + "]}";
}

bool WriteJson(const std::string& path, const std::vector<Result>& results,
               const Options& o, int port, const std::string& version,
               double load, bool quick) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    return false;
  }
  std::fprintf(f,
               "{\"bench\": \"cluster\", \"quick\": %s, \"hosts\": %d,\n"
               " \"layout\": \"two zones in one process, a ClusterAgent each "
               "(thread %s); every key on both hosts\",\n"
               " \"redis_version\": \"%s\", \"redis_port\": %d, "
               "\"tick_ms\": %lld, \"rate_Bps\": %" PRIu64
               ", \"measured_conns_per_host\": %u, \"joins\": %d, "
               "\"loadavg\": %.2f,\n \"cases\": [\n",
               quick ? "true" : "false", kHosts, kThreadName, version.c_str(),
               port, static_cast<long long>(kTickNs / kNsPerMs), kRate,
               kMeasuredConns, o.joins, load);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::string commands = "{";
    bool first = true;
    for (const auto& [command, per_s] : r.command_per_s_per_host) {
      commands +=
          (first ? "\"" : ", \"") + command + "\": " + JsonNumber(per_s);
      first = false;
    }
    commands += "}";
    std::fprintf(
        f,
        "  {\"keys\": %u, \"ready\": %s, \"zone_bytes\": %" PRIu64
        ", \"key_capacity\": %u, \"setup_s\": %s, \"window_s\": %s,\n"
        "   \"exchanges_per_s\": [%s, %s], \"redis_commands_per_s_per_host\": "
        "%s,\n   \"redis_commands_per_s_per_host_by_command\": %s,\n"
        "   \"sent_to_redis_Bps_per_host\": %s, "
        "\"received_from_redis_Bps_per_host\": %s,\n"
        "   \"agent_cpu_pct\": [%s, %s], \"agent_cpu_ms_per_exchange\": [%s, "
        "%s], \"redis_cpu_pct\": %s,\n"
        "   \"rtt_ms_median\": %s, \"rtt_ms_max\": %s, "
        "\"failed_exchanges\": %" PRIu64
        ", \"phases\": %d,\n   \"join\": %s,\n"
        "   \"leave\": %s}%s\n",
        r.keys, r.ready ? "true" : "false", r.zone_bytes, r.key_capacity,
        JsonNumber(r.setup_s).c_str(), JsonNumber(r.window_s).c_str(),
        JsonNumber(r.exchanges_per_s[0]).c_str(),
        JsonNumber(r.exchanges_per_s[1]).c_str(),
        JsonNumber(r.commands_per_s_per_host).c_str(), commands.c_str(),
        JsonNumber(r.sent_Bps_per_host).c_str(),
        JsonNumber(r.received_Bps_per_host).c_str(),
        JsonNumber(r.agent_cpu_pct[0]).c_str(),
        JsonNumber(r.agent_cpu_pct[1]).c_str(),
        JsonNumber(r.agent_cpu_ms_per_exchange[0]).c_str(),
        JsonNumber(r.agent_cpu_ms_per_exchange[1]).c_str(),
        JsonNumber(r.redis_cpu_pct).c_str(),
        JsonNumber(r.rtt_ms_median).c_str(), JsonNumber(r.rtt_ms_max).c_str(),
        r.failures, r.phases, JsonLatency(r.join).c_str(),
        JsonLatency(r.leave).c_str(), i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, " ]}\n");
  return std::fclose(f) == 0;
}

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
}  // namespace trafficrate

int main(int argc, char** argv) { return trafficrate::Main(argc, argv); }
