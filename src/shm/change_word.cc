#include "src/shm/change_word.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>

#include "src/base/clock.h"

namespace trafficrate {
namespace {

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val,
           const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout,
                 nullptr, 0);
}

}  // namespace

uint32_t ChangeWord::Current() const {
  return header_->change_word.load(std::memory_order_acquire);
}

void ChangeWord::WakeWatchers() {
  header_->change_word.fetch_add(1, std::memory_order_seq_cst);
  if (header_->watchers_waiting.load(std::memory_order_seq_cst) == 0) return;
  Futex(&header_->change_word, FUTEX_WAKE, INT_MAX, nullptr);
}

void ChangeWord::WaitForChange(uint32_t seen, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  header_->watchers_waiting.fetch_add(1, std::memory_order_seq_cst);
  const timespec ts{static_cast<time_t>(timeout_ns / kNsPerSec),
                    static_cast<long>(timeout_ns % kNsPerSec)};
  if (header_->change_word.load(std::memory_order_seq_cst) == seen) {
    Futex(&header_->change_word, FUTEX_WAIT, seen, &ts);
  }
  header_->watchers_waiting.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace trafficrate
