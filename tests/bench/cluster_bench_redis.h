// The redis-server cluster_bench starts (on 127.0.0.1 and a free port, no
// persistence) and stops by pid, the benchmark's own connection to it, and
// what its INFO says (commands, bytes in and out), less what the
// benchmark's own INFO requests cost.

#ifndef TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REDIS_H_
#define TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REDIS_H_

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/base/clock.h"

namespace trafficrate {
namespace cluster_bench {

// A free TCP port on 127.0.0.1 (0 if none was found).
int FreePort();

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
uint64_t RequestBytes(const std::vector<std::string>& words);

// The bytes of a bulk-string reply of `n` bytes.
uint64_t BulkReplyBytes(size_t n);

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

// The INFO command the benchmark sends.
const std::vector<std::string>& InfoCommand();

// One INFO read through `redis`; ok false if it could not be read.
RedisStats ReadStats(RedisClient& redis);

}  // namespace cluster_bench
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_BENCH_CLUSTER_BENCH_REDIS_H_
