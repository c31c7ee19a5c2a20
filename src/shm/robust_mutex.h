// Robust, process-shared mutexes that live in a mapping other processes can
// write (the zone lock, each process slot's liveness mutex): making one,
// taking one with a bound, letting one go only if glibc's links in it are
// still sane, and lock-free peeks at the word glibc and the kernel keep.
//
//   if (TimedLock(&header.lock, kHostLockWaitNs) == 0) {
//     HeldMutex held;
//     held.Hold(&header.lock, base, size);
//     ...
//     if (!held.Release()) MarkCorrupt(...);  // left locked
//   }
//
// Nothing here allocates or touches errno's meaning for the caller: the
// pthread functions return their error.

#ifndef TRAFFICRATE_SRC_SHM_ROBUST_MUTEX_H_
#define TRAFFICRATE_SRC_SHM_ROBUST_MUTEX_H_

#include <pthread.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace trafficrate {

// A robust mutex in shared memory that this thread holds. glibc links the
// robust mutexes a thread holds into a list through pointers kept in each
// mutex, and follows them when it unlocks one; anything else that maps the
// zone can overwrite them. Release unlocks only if what glibc will follow is
// still sane: the kind and owner the mutex had when it was taken, and links
// that point into the zone's mapping or at this thread's own list head. So no
// write into the zone can make glibc write outside the mapping.
struct HeldMutex {
  // After the lock was taken (and made consistent). [base, base + size) is
  // the mapping it lives in.
  void Hold(pthread_mutex_t* mutex, const void* base, size_t size);
  // Unlocks the mutex Hold saved, if any. False if it was damaged: it is then
  // left locked (the zone is unusable anyway; the caller marks it corrupt).
  bool Release();

  pthread_mutex_t* mutex = nullptr;
  int kind = 0;
  int tid = 0;
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};

// In a child made with a raw clone system call (not glibc's fork, which
// does this itself): registers the calling thread's robust mutex list with
// the kernel again (the clone cleared it), so that the zone locks this
// thread takes pass HeldMutex's check of their links (else the first
// unlock would find the zone "corrupt") and the liveness and zone locks it
// dies holding are marked owner-died. No-op where the kernel has a list.
// Not for the hot path: a few system calls, once per new process.
void ReregisterRobustList();

// Makes *mutex (zeroed memory in a shared mapping) a robust, process-shared
// mutex. Called once, by the zone's creator, before the zone is published.
absl::Status InitRobustMutex(pthread_mutex_t* mutex);

// Locks *mutex, waiting at most wait_ns, measured on CLOCK_MONOTONIC so that
// a change of the wall clock cannot lengthen the wait. Returns what the
// pthread lock returns: 0, EOWNERDEAD (taken; the caller repairs and makes
// it consistent), ETIMEDOUT, or an error of a broken mutex.
int TimedLock(pthread_mutex_t* mutex, int64_t wait_ns);

// Lock-free peeks at the mutex's word: glibc keeps the holder's thread id in
// its low bits, and the kernel sets FUTEX_OWNER_DIED when it releases the
// mutex of a holder that exited or exec'd. The thread id the word names as
// the holder (0: free); whether the holder died.
int32_t MutexHolder(const pthread_mutex_t& mutex);
bool MutexOwnerDied(const pthread_mutex_t& mutex);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ROBUST_MUTEX_H_
