// The interposers of the setrlimit family (setrlimit, setrlimit64,
// prlimit, prlimit64): a process about to lower its RLIMIT_NPROC gets the
// watcher thread started first.

#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "lib/interpose.h"
#include "lib/real.h"
#include "src/runtime/governor.h"

namespace trafficrate {
namespace {

// A lower RLIMIT_NPROC may leave the process unable to start threads (it is
// checked at clone, once the process has dropped to a user that runs as
// many): privilege-separating servers (vsftpd's session processes) set it
// to 0 before they are handed their sockets. The watcher is started first.
template <typename Limit>
void BeforeSetLimit(pid_t pid, int resource, const Limit* limit) {
  if (resource != RLIMIT_NPROC || limit == nullptr ||
      limit->rlim_cur == RLIM_INFINITY) {
    return;
  }
  Governor* gov = ActiveGovernor();
  if (gov == nullptr || (pid != 0 && pid != getpid())) return;
  AsLibrary(gov, [](Governor& g) { g.BeforeThreadLimit(); });
}

}  // namespace
}  // namespace trafficrate

using trafficrate::g_real;

// The setrlimit family is called by AddressSanitizer's own start-up (for
// RLIMIT_CORE), before its shadow memory exists: in the library's ASan build
// these interposers must touch no instrumented memory until they know the
// call is one the library cares about (RLIMIT_NPROC, which no sanitizer
// sets).
#define TRAFFICRATE_NO_ASAN __attribute__((no_sanitize_address))

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int setrlimit(
    __rlimit_resource_t resource, const rlimit* limit) {
  if (resource == RLIMIT_NPROC) trafficrate::BeforeSetLimit(0, resource, limit);
  return g_real.setrlimit ? g_real.setrlimit(resource, limit)
                          : syscall(SYS_prlimit64, 0, resource, limit, nullptr);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int setrlimit64(
    __rlimit_resource_t resource, const rlimit64* limit) {
  if (resource == RLIMIT_NPROC) trafficrate::BeforeSetLimit(0, resource, limit);
  return g_real.setrlimit64
             ? g_real.setrlimit64(resource, limit)
             : syscall(SYS_prlimit64, 0, resource, limit, nullptr);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int prlimit(pid_t pid,
                                                   __rlimit_resource resource,
                                                   const rlimit* limit,
                                                   rlimit* old) {
  if (resource == RLIMIT_NPROC) {
    trafficrate::BeforeSetLimit(pid, resource, limit);
  }
  return g_real.prlimit ? g_real.prlimit(pid, resource, limit, old)
                        : syscall(SYS_prlimit64, pid, resource, limit, old);
}

TRAFFICRATE_EXPORT TRAFFICRATE_NO_ASAN int prlimit64(pid_t pid,
                                                     __rlimit_resource resource,
                                                     const rlimit64* limit,
                                                     rlimit64* old) {
  if (resource == RLIMIT_NPROC) {
    trafficrate::BeforeSetLimit(pid, resource, limit);
  }
  return g_real.prlimit64 ? g_real.prlimit64(pid, resource, limit, old)
                          : syscall(SYS_prlimit64, pid, resource, limit, old);
}
