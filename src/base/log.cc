#include "src/base/log.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "src/base/clock.h"

namespace trafficrate {

namespace {

constexpr char kPrefix[] = "trafficrate: ";
constexpr char kIdent[] = "trafficrate";
// Before the text: "<PRI>trafficrate[PID]: " (at most 5 + 11 + 12 + 2) or
// kPrefix.
constexpr size_t kHeaderRoom = 32;
constexpr size_t kTextMax = 500;

// Writes the decimal digits of v ending just before `end`; returns the
// first.
char* DigitsBefore(char* end, uint32_t v) {
  do {
    *--end = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  return end;
}

char* CopyBefore(char* end, const char* s, size_t n) {
  end -= n;
  std::memcpy(end, s, n);
  return end;
}

}  // namespace

void Logger::Configure(LogTarget target, int fd, const char* syslog_path) {
  target_ = target;
  fd_ = target == LogTarget::kFile ? fd : 2;
  syslog_path_ = syslog_path;
}

void Logger::Error(const char* format, ...) const {
  va_list args;
  va_start(args, format);
  Log(LogPriority::kError, format, args);
  va_end(args);
}

void Logger::Warning(const char* format, ...) const {
  va_list args;
  va_start(args, format);
  Log(LogPriority::kWarning, format, args);
  va_end(args);
}

void Logger::Notice(const char* format, ...) const {
  va_list args;
  va_start(args, format);
  Log(LogPriority::kNotice, format, args);
  va_end(args);
}

void Logger::Log(LogPriority priority, const char* format, va_list args) const {
  if (target_ == LogTarget::kOff) return;
  const int saved_errno = errno;
  // The pid of the process logging now (servers fork after our start).
  const auto pid = static_cast<int32_t>(syscall(SYS_getpid));
  uint32_t suppressed = 0;
  if (TakeLine(pid, &suppressed)) {
    char line[kHeaderRoom + kTextMax + 1];
    char* const text = line + kHeaderRoom;
    if (suppressed != 0) {
      const int n =
          snprintf(text, kTextMax,
                   "%u message(s) suppressed (at most %d lines per %d s)",
                   suppressed, kBurstLines,
                   static_cast<int>(kBurstLines * kRefillNs / 1'000'000'000));
      Emit(LogPriority::kWarning, pid, text,
           n > 0 ? static_cast<size_t>(n) : 0);
    }
    int n = vsnprintf(text, kTextMax, format, args);
    if (n < 0) n = 0;
    size_t len = static_cast<size_t>(n);
    if (len > kTextMax - 1) len = kTextMax - 1;
    // One line: a newline inside the text would split it.
    for (size_t i = 0; i < len; ++i) {
      if (text[i] == '\n') text[i] = ' ';
    }
    Emit(priority, pid, text, len);
  }
  errno = saved_errno;
}

void Logger::Emit(LogPriority priority, int32_t pid, char* text,
                  size_t len) const {
  if (target_ == LogTarget::kSyslog) {
    // RFC 3164 as glibc's syslog(3) sends it to a local socket, without the
    // timestamp (see log.h): "<PRI>trafficrate[PID]: text".
    char* start = CopyBefore(text, "]: ", 3);
    start = DigitsBefore(start, static_cast<uint32_t>(pid));
    start = CopyBefore(start, "[", 1);
    start = CopyBefore(start, kIdent, sizeof(kIdent) - 1);
    start = CopyBefore(start, ">", 1);
    start = DigitsBefore(
        start,
        static_cast<uint32_t>(kSyslogFacility | static_cast<int>(priority)));
    start = CopyBefore(start, "<", 1);
    text[len] = '\0';  // a stream socket's record separator
    if (SendSyslog(start, static_cast<size_t>(text + len - start))) return;
  }
  char* start = CopyBefore(text, kPrefix, sizeof(kPrefix) - 1);
  text[len] = '\n';
  (void)syscall(SYS_write, fd_, start,
                static_cast<size_t>(text + len + 1 - start));
}

bool Logger::SendSyslog(const char* message, size_t len) const {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t path_len = syslog_path_ == nullptr
                              ? 0
                              : strnlen(syslog_path_, sizeof(addr.sun_path));
  if (path_len == 0 || path_len >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, syslog_path_, path_len);
  const auto addr_len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_len + 1);
  // Datagrams, as journald and rsyslog offer; a stream socket (old
  // syslog-ng setups) takes the message with its NUL, as glibc sends it.
  for (const int type : {SOCK_DGRAM, SOCK_STREAM}) {
    const long fd =
        syscall(SYS_socket, AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    const size_t total = len + (type == SOCK_STREAM ? 1 : 0);
    bool sent = false;
    bool other_type = false;
    if (syscall(SYS_connect, fd, &addr, addr_len) == 0) {
      const long n = syscall(SYS_sendto, fd, message, total,
                             MSG_DONTWAIT | MSG_NOSIGNAL, nullptr, 0);
      sent = n == static_cast<long>(total);
    } else {
      other_type = errno == EPROTOTYPE;
    }
    (void)syscall(SYS_close, fd);
    if (sent) return true;
    if (!other_type) return false;
  }
  return false;
}

bool Logger::TakeLine(int32_t pid, uint32_t* suppressed) const {
  int32_t owner = owner_pid_.load(std::memory_order_relaxed);
  if (owner != pid && owner_pid_.compare_exchange_strong(
                          owner, pid, std::memory_order_relaxed)) {
    // First line of this process (a forked child starts afresh).
    full_at_ns_.store(0, std::memory_order_relaxed);
    suppressed_.store(0, std::memory_order_relaxed);
  }
  const int64_t now = now_ns_ != nullptr ? now_ns_() : MonotonicNowNs();
  int64_t full_at = full_at_ns_.load(std::memory_order_relaxed);
  // Bounded: a lost race means another line took a token just now.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int64_t next = (full_at > now ? full_at : now) + kRefillNs;
    if (next - now > kBurstLines * kRefillNs) break;
    if (full_at_ns_.compare_exchange_weak(full_at, next,
                                          std::memory_order_relaxed)) {
      *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
      return true;
    }
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool Logger::Allow(std::atomic<int64_t>& last_ns, int64_t now_ns) {
  int64_t last = last_ns.load(std::memory_order_relaxed);
  if (last != 0 && now_ns - last < kRepeatIntervalNs) return false;
  return last_ns.compare_exchange_strong(last, now_ns,
                                         std::memory_order_relaxed);
}

}  // namespace trafficrate
