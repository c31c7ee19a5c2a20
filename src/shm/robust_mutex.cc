#include "src/shm/robust_mutex.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "src/base/clock.h"

namespace trafficrate {
namespace {

// This thread's robust list head (set_robust_list), where glibc's links end.
thread_local uintptr_t t_robust_head = 0;

uintptr_t RobustHead() {
  if (t_robust_head == 0) {
    void* head = nullptr;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) == 0) {
      t_robust_head = reinterpret_cast<uintptr_t>(head);
    }
  }
  return t_robust_head;
}

// The calling thread's robust list head, found by locking a private robust
// mutex: glibc links it at the front of the thread's list, which is a ring
// through the mutexes the thread holds back to the head, and the head lies
// in the thread's descriptor (at pthread_self(), within a page). Each link
// points at the next mutex's own link (its __list.__next, where the kernel
// expects a robust_list), not at its __list. 0 if not found.
uintptr_t FindRobustHead() {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_t m;
  pthread_mutex_init(&m, &attr);
  pthread_mutexattr_destroy(&attr);
  uintptr_t head = 0;
  if (pthread_mutex_lock(&m) == 0) {
    const uintptr_t self = reinterpret_cast<uintptr_t>(pthread_self());
    void* link = m.__data.__list.__next;
    for (int i = 0; i < 64 && link != nullptr; ++i) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(link) & ~uintptr_t{1};
      if (p >= self && p < self + 4096) {
        head = p;
        break;
      }
      link = *reinterpret_cast<void* const*>(p);
    }
    pthread_mutex_unlock(&m);
  }
  pthread_mutex_destroy(&m);
  return head;
}

}  // namespace

void ReregisterRobustList() {
  void* head = nullptr;
  size_t len = 0;
  if (syscall(SYS_get_robust_list, 0, &head, &len) == 0 && head != nullptr) {
    return;
  }
  const uintptr_t found = FindRobustHead();
  // struct robust_list_head: the list, the futex offset, the pending op.
  if (found != 0 &&
      syscall(SYS_set_robust_list, found, 3 * sizeof(void*)) == 0) {
    t_robust_head = found;
  }
}

absl::Status InitRobustMutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return absl::ErrnoToStatus(rc, "pthread_mutex_init");
  return absl::OkStatus();
}

int TimedLock(pthread_mutex_t* mutex, int64_t wait_ns) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer (GCC 12) knows neither pthread_mutex_clocklock nor
  // EOWNERDEAD from pthread_mutex_timedlock; it knows both from trylock.
  const int64_t deadline = MonotonicNowNs() + wait_ns;
  for (;;) {
    const int rc = pthread_mutex_trylock(mutex);
    if (rc != EBUSY || MonotonicNowNs() >= deadline) {
      return rc == EBUSY ? ETIMEDOUT : rc;
    }
    SleepNs(20'000);
  }
#else
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const int64_t ns = deadline.tv_nsec + wait_ns;
  deadline.tv_sec += static_cast<time_t>(ns / kNsPerSec);
  deadline.tv_nsec = static_cast<long>(ns % kNsPerSec);
  return pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &deadline);
#endif
}

int32_t MutexHolder(const pthread_mutex_t& mutex) {
  return __atomic_load_n(&mutex.__data.__lock, __ATOMIC_RELAXED) &
         FUTEX_TID_MASK;
}

bool MutexOwnerDied(const pthread_mutex_t& mutex) {
  return (__atomic_load_n(&mutex.__data.__lock, __ATOMIC_ACQUIRE) &
          FUTEX_OWNER_DIED) != 0;
}

void HeldMutex::Hold(pthread_mutex_t* m, const void* base, size_t size) {
  mutex = m;
  kind = __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED);
  tid = MutexHolder(*m);
  lo = reinterpret_cast<uintptr_t>(base);
  hi = lo + size;
}

bool HeldMutex::Release() {
  if (mutex == nullptr) return true;
  pthread_mutex_t* m = mutex;
  mutex = nullptr;
  // glibc's unlink writes 16 bytes around each link: [p - 8, p + 8).
  const uintptr_t head = RobustHead();
  const auto sane = [&](const void* link) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(link) & ~uintptr_t{1};
    return (head != 0 && p == head) || (p >= lo + 8 && p + 8 <= hi);
  };
  const bool intact =
      __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) == kind &&
      MutexHolder(*m) == tid &&
      sane(__atomic_load_n(&m->__data.__list.__next, __ATOMIC_RELAXED)) &&
      sane(__atomic_load_n(&m->__data.__list.__prev, __ATOMIC_RELAXED));
  if (!intact) return false;
  pthread_mutex_unlock(m);
  return true;
}

}  // namespace trafficrate
