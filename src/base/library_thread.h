// The library's own threads (the watcher, the listen watch): started with
// every signal blocked, so that they never run one of the host's signal
// handlers, and with a small stack of their own.
//
//   pthread_t thread;
//   int rc = StartLibraryThread(&thread, &Main, this, 256 * 1024, false);

#ifndef TRAFFICRATE_SRC_BASE_LIBRARY_THREAD_H_
#define TRAFFICRATE_SRC_BASE_LIBRARY_THREAD_H_

#include <pthread.h>

#include <cstddef>

namespace trafficrate {

// pthread_create's result (0, or an error number). The calling thread's
// signal mask is left as it was.
int StartLibraryThread(pthread_t* thread, void* (*main)(void*), void* arg,
                       size_t stack_bytes, bool detached);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_LIBRARY_THREAD_H_
