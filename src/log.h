// The library's one-line messages: "trafficrate: <text>" to stderr, syslog, a
// file, or nowhere (TRAFFICRATE_LOG).
//
//   Logger logger;                       // stderr until configured
//   logger.Configure(LogTarget::kFile, fd);
//   logger.Logf("zone %s is full", name);
//   if (logger.Allow(last_full_ns_, now_ns)) logger.Logf(...);  // rate limit
//
// Formatting goes to a stack buffer and out with one write(2) system call
// (not through the interposed write), so a message never allocates, never
// interleaves with another line and leaves errno as it found it.

#ifndef TRAFFICRATE_SRC_LOG_H_
#define TRAFFICRATE_SRC_LOG_H_

#include <atomic>
#include <cstdint>

#include "src/config.h"

namespace trafficrate {

class Logger {
 public:
  // Messages of one kind are written at most this often.
  static constexpr int64_t kRepeatIntervalNs = 10'000'000'000;

  constexpr Logger() = default;

  // fd is used for kFile (owned by the caller, kept open for the process).
  void Configure(LogTarget target, int fd);

  // Thread-safe; async-signal-safe except for kSyslog.
  void Logf(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));

  // True at most once per kRepeatIntervalNs for the same `last_ns` word.
  static bool Allow(std::atomic<int64_t>& last_ns, int64_t now_ns);

 private:
  LogTarget target_ = LogTarget::kStderr;
  int fd_ = 2;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_LOG_H_
