// The library's side of src/runtime/bypass_watch.h: once the governor is
// installed, a Go program is told in one line that it will not be paced;
// any other process gets a ListenWatch, fed by the listen, accept and
// accept4 interposers.

#include <atomic>

#include "absl/base/attributes.h"
#include "lib/preload.h"
#include "src/runtime/bypass_watch.h"

namespace trafficrate {

ABSL_CONST_INIT std::atomic<ListenWatch*> g_listen_watch{nullptr};

namespace {

// The watch's thread is the library's: its socket, readdir and close calls
// go straight to libc.
void MarkLibraryThread() { t_in_library = true; }

}  // namespace

void StartBypassChecks(const Logger& logger) {
  if (LogIfGoProgram(logger, "/proc/self/exe")) return;
  // Never destroyed, like the Governor.
  g_listen_watch.store(
      new ListenWatch(&logger, ListenWatchTiming(), &MarkLibraryThread),
      std::memory_order_release);
}

}  // namespace trafficrate
