// The library's one-line messages: "trafficrate: <text>" to stderr or a
// file, "<PRI>trafficrate[PID]: <text>" to syslog, or nowhere
// (TRAFFICRATE_LOG).
//
//   Logger logger;                       // stderr until configured
//   logger.Configure(LogTarget::kSyslog, -1);
//   logger.Warning("zone %s is full", name);
//   if (Logger::Allow(last_full_ns_, now_ns)) logger.Warning(...);  // per kind
//
// Error: a configuration refused, or the library switching itself off (for
// the process or for good). Warning: degraded operation (some connections
// unpaced, a lock stalled, a rule that can never match). Notice: normal
// events (a reload applied, dead processes' counts released). The priority
// reaches syslog only; stderr and file lines are the same for all three.
//
// Besides the per-kind Allow, every target is limited to kBurstLines lines
// at once, refilled at one line per kRefillNs (a token bucket, per process:
// a forked child starts with a full one). When lines were dropped, the next
// line that goes out is preceded by "trafficrate: N message(s) suppressed
// ...".
//
// Syslog: per message a new AF_UNIX socket (datagram, else stream) connected
// to /dev/log, one non-blocking send, close, all by raw system calls (never
// the interposed ones), so a host that closes every fd after fork, or a
// restarted journald, cannot make us write to a stolen fd. If that fails the
// line goes to stderr. No timestamp: journald and rsyslog stamp a local
// socket's messages on receipt (a client's stamp is skipped or ignored), and
// localtime_r is not async-signal-safe.
//
// Hot path: no allocation, no lock, no wait; errno untouched. Formatting
// goes to a stack buffer (vsnprintf) and out with one system call, so a
// message never interleaves with another line; safe from a signal handler.

#ifndef TRAFFICRATE_SRC_BASE_LOG_H_
#define TRAFFICRATE_SRC_BASE_LOG_H_

#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdint>

namespace trafficrate {

// Where lines go (TRAFFICRATE_LOG).
enum class LogTarget { kStderr, kSyslog, kOff, kFile };

// Syslog severities (<syslog.h> numbers); the facility is LOG_DAEMON.
enum class LogPriority : int { kError = 3, kWarning = 4, kNotice = 5 };

class Logger {
 public:
  // Messages of one kind are written at most this often (Allow).
  static constexpr int64_t kRepeatIntervalNs = 10'000'000'000;
  // All messages: at most kBurstLines at once, then one per kRefillNs
  // (10 lines per 10 s).
  static constexpr int kBurstLines = 10;
  static constexpr int64_t kRefillNs = 1'000'000'000;
  static constexpr const char* kSyslogPath = "/dev/log";
  static constexpr int kSyslogFacility = 3 << 3;  // LOG_DAEMON

  constexpr Logger() = default;

  // fd is used for kFile (owned by the caller, kept open for the process).
  // syslog_path (kept by pointer: a literal, or alive as long as the
  // Logger) is where kSyslog sends; tests give their own socket.
  void Configure(LogTarget target, int fd,
                 const char* syslog_path = kSyslogPath);

  // Thread-safe and async-signal-safe, all targets.
  void Error(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));
  void Warning(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));
  void Notice(const char* format, ...) const
      __attribute__((format(printf, 2, 3)));

  // True at most once per kRepeatIntervalNs for the same `last_ns` word.
  static bool Allow(std::atomic<int64_t>& last_ns, int64_t now_ns);

  // Tests: the rate limit's clock (default MonotonicNowNs).
  void SetClockForTesting(int64_t (*now_ns)()) { now_ns_ = now_ns; }

 private:
  void Log(LogPriority priority, const char* format, va_list args) const;
  // Takes a line from the bucket; *suppressed: lines dropped before it.
  bool TakeLine(int32_t pid, uint32_t* suppressed) const;
  // `text` of `len` bytes with kHeaderRoom writable bytes before it and one
  // after it.
  void Emit(LogPriority priority, int32_t pid, char* text, size_t len) const;
  bool SendSyslog(const char* message, size_t len) const;

  LogTarget target_ = LogTarget::kStderr;
  int fd_ = 2;
  const char* syslog_path_ = kSyslogPath;
  int64_t (*now_ns_)() = nullptr;
  // The token bucket as one word (GCRA): the time at which it is full
  // again; a line is allowed while that stays within kBurstLines refills.
  mutable std::atomic<int64_t> full_at_ns_{0};
  mutable std::atomic<uint32_t> suppressed_{0};
  mutable std::atomic<int32_t> owner_pid_{0};  // the process they are for
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_LOG_H_
