#include "src/base/library_thread.h"

#include <signal.h>

namespace trafficrate {

int StartLibraryThread(pthread_t* thread, void* (*main)(void*), void* arg,
                       size_t stack_bytes, bool detached) {
  // The new thread inherits this mask: all blocked.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  const int rc = pthread_create(thread, &attr, main, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

}  // namespace trafficrate
