#include "src/log.h"

#include <errno.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace trafficrate {

void Logger::Configure(LogTarget target, int fd) {
  target_ = target;
  fd_ = target == LogTarget::kFile ? fd : 2;
  if (target == LogTarget::kSyslog) {
    openlog("trafficrate", LOG_PID | LOG_NDELAY, LOG_DAEMON);
  }
}

void Logger::Logf(const char* format, ...) const {
  if (target_ == LogTarget::kOff) return;
  const int saved_errno = errno;
  constexpr char kPrefix[] = "trafficrate: ";
  char line[512];
  const size_t prefix = sizeof(kPrefix) - 1;
  std::memcpy(line, kPrefix, prefix);
  va_list args;
  va_start(args, format);
  int n = vsnprintf(line + prefix, sizeof(line) - prefix - 1, format, args);
  va_end(args);
  if (n < 0) n = 0;
  size_t len = prefix + static_cast<size_t>(n);
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  // One line: a newline inside the text would split it.
  for (size_t i = prefix; i < len; ++i) {
    if (line[i] == '\n') line[i] = ' ';
  }
  if (target_ == LogTarget::kSyslog) {
    line[len] = '\0';
    syslog(LOG_WARNING, "%s", line + prefix);
  } else {
    line[len++] = '\n';
    (void)syscall(SYS_write, fd_, line, len);
  }
  errno = saved_errno;
}

bool Logger::Allow(std::atomic<int64_t>& last_ns, int64_t now_ns) {
  int64_t last = last_ns.load(std::memory_order_relaxed);
  if (last != 0 && now_ns - last < kRepeatIntervalNs) return false;
  return last_ns.compare_exchange_strong(last, now_ns,
                                         std::memory_order_relaxed);
}

}  // namespace trafficrate
