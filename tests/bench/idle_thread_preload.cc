// The overhead scenario's floor (bench/scenarios.py, keepalive): a preload
// that only starts one thread, which sleeps for good. The library needs a
// watcher thread in every process it governs, and a second thread alone
// costs the host: the kernel takes a reference on the file for every system
// call on an fd once the fd table is shared, and glibc's cancellation points
// and malloc take their multi-threaded paths. Measured next to the library,
// it tells that part from the library's own.

#include <pthread.h>
#include <unistd.h>

namespace {

void* SleepForGood(void*) {
  for (;;) pause();
  return nullptr;
}

__attribute__((constructor)) void StartIdleThread() {
  pthread_t thread;
  if (pthread_create(&thread, nullptr, &SleepForGood, nullptr) == 0) {
    pthread_detach(thread);
  }
}

}  // namespace
