// What a Governor is set up with (the library's configuration, config.h),
// and the one part of the zone's work it hands to another unit (the fleet
// exchange, cluster_agent.h), which it only polls.

#ifndef TRAFFICRATE_SRC_RUNTIME_GOVERNOR_OPTIONS_H_
#define TRAFFICRATE_SRC_RUNTIME_GOVERNOR_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"
#include "src/runtime/watcher_loop.h"

namespace trafficrate {

// SO_MAX_PACING_RATE of a socket the kernel does not pace.
inline constexpr uint64_t kUnpaced = ~uint64_t{0};

// Work of the zone's that one process at a time does, outside the host's
// calls (the fleet exchange, cluster_agent.h). The watcher polls it.
class ZoneAgent {
 public:
  virtual ~ZoneAgent() = default;
  // From the watcher of process slot `proc`, about every reap interval:
  // takes the work over if nobody does it.
  virtual void Poll(uint32_t proc, int64_t now_ns) = 0;
  // In the child after fork: whatever ran in the parent did not survive.
  virtual void AfterForkChild() = 0;
};

// The watcher's timing (idle_ns: TRAFFICRATE_IDLE, coalesce_ns,
// reap_interval_ns) and the clock are part of the Governor's options.
struct GovernorOptions : WatcherTiming {
  KeySpec key;
  // TRAFFICRATE_PORTS and TRAFFICRATE_EXEMPT, decided once per connection at
  // accept: a connection they leave out is never registered.
  AcceptRules rules;
  // TRAFFICRATE_AFTER: a connection joins its key (takes a share, is paced)
  // only once it has sent this many bytes.
  uint64_t after_bytes = 0;
  // TRAFFICRATE_SHAPE: BeforeSend gives the packet shaper's Shape (shaper.h)
  // of paced connections; false: always an inactive one.
  bool shape = true;
  // TRAFFICRATE_CONFIG: the rules file and its rules, matched in order once
  // per accepted connection (a getsockname and a walk of their lists;
  // nothing per send). Empty: key, rules and after_bytes above are the one
  // rule. `trafficrate reload` makes the watcher read the file again.
  std::string rules_path;
  std::vector<Rule> file_rules;
  // The fleet exchange (TRAFFICRATE_CLUSTER), or null. Not owned; outlives
  // the Governor.
  ZoneAgent* agent = nullptr;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_GOVERNOR_OPTIONS_H_
