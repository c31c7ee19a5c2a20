// State shared by the interposers and the library's constructor.

#ifndef TRAFFICRATE_LIB_PRELOAD_H_
#define TRAFFICRATE_LIB_PRELOAD_H_

#include <atomic>

namespace trafficrate {

class Governor;
class ListenWatch;
class Logger;

// Null unless the library is configured and its zone is open. Set once by
// the constructor; never destroyed.
extern std::atomic<Governor*> g_governor;

// Null unless the governor is installed and the program is not a Go one:
// watches the ports the process listens on for connections no accept()
// returned (src/runtime/bypass_watch.h). Set once after the governor; never
// destroyed.
extern std::atomic<ListenWatch*> g_listen_watch;

// After the governor is installed: one line if the program is a Go one,
// else g_listen_watch.
void StartBypassChecks(const Logger& logger);

// "Inside trafficrate" on this thread: a nested entry (our own code, or a
// signal handler that interrupted us) goes straight to the real function.
extern thread_local bool t_in_library
    __attribute__((tls_model("initial-exec")));

// Runs the library's initialization once (also from the constructor).
void EnsureInitialized();

}  // namespace trafficrate

#endif  // TRAFFICRATE_LIB_PRELOAD_H_
