// Test helper for the integration suite: takes a zone's lock and holds it
// until its standard input ends, as a process that stalls inside the zone
// would (the test then stops it with SIGSTOP).
//
//   zone_lock_holder ZONE     prints "locked" once it holds the lock

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "absl/status/statusor.h"
#include "src/shm/zone.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: zone_lock_holder ZONE\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<trafficrate::Zone>> zone =
      trafficrate::Zone::Attach(argv[1]);
  if (!zone.ok()) {
    std::fprintf(stderr, "zone_lock_holder: %s\n",
                 std::string(zone.status().message()).c_str());
    return 1;
  }
  for (int attempt = 0; attempt < 50; ++attempt) {
    trafficrate::ZoneLock lock(**zone, trafficrate::kWatcherLockWaitNs);
    if (!lock.ok()) {
      (*zone)->RecheckLock();
      continue;
    }
    std::printf("locked\n");
    std::fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof(buf)) > 0) {
    }
    return 0;
  }
  std::fprintf(stderr, "zone_lock_holder: the lock stayed held\n");
  return 1;
}
