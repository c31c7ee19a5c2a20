// The zone's cluster agent (TRAFFICRATE_CLUSTER): shares each key's rate
// with the other hosts of a fleet through Redis.
//
// One process per zone acts: the first watcher to find the zone's cluster
// lease (ClusterShm::lease) free or expired takes it and starts a thread of
// its own, which renews the lease on every pass and ends when it loses it; a
// holder that dies (or stalls) is replaced within the lease and a reap
// interval. Every tick (100 ms) the thread
//   * collects each key with sending connections here: its Redis name
//     (ClusterKeyName: the cluster name, and the client key with its rule's
//     name hashed with the secret; rules match across hosts by name),
//     its demand and its sending connections. The demand is what the key
//     sends here times two while its budget controller has it unbound
//     (clearly under its rate: it wants no more), else unbounded;
//   * exchanges them in one pipelined round trip (ClusterExchange) for the
//     other hosts' figures;
//   * writes each key's budget on this host, its weighted max-min share of
//     the rule's rate given every host's figures (MaxMinShares), into the
//     key's slot (cluster_share; ZoneSettings::KeyRate reads it), and wakes the
//     watchers when a share moved, so that every connection is re-paced.
// Nothing of this is on the hot path: the host's calls read the shares from
// the zone, never wait for Redis.
//
// While Redis cannot be reached or answers late (a pass fails), the agent
// falls back: each key's last share moves linearly to the full local rate
// over the decay (TRAFFICRATE_CLUSTER_DECAY) counted from the last
// successful exchange, and a key with no share yet gets the full rate. It
// logs one line when it falls back and one when Redis answers again, and
// counts both in the zone (stat, Prometheus); it reconnects by itself.
//
//   ClusterAgent agent(zone, logger, options);
//   governor_options.agent = &agent;  // the watcher polls it
//
// Ownership: zone and logger outlive the agent; the library never destroys
// it (its thread may run until the process exits).

#ifndef TRAFFICRATE_SRC_CLUSTER_CLUSTER_AGENT_H_
#define TRAFFICRATE_SRC_CLUSTER_CLUSTER_AGENT_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/base/log.h"
#include "src/cluster/cluster.h"
#include "src/cluster/cluster_exchange.h"
#include "src/config/cluster_url.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"

namespace trafficrate {

struct ClusterAgentOptions {
  ClusterUrl url;
  std::string name;    // TRAFFICRATE_CLUSTER_NAME: the namespace in Redis
  std::string secret;  // TRAFFICRATE_CLUSTER_SECRET
  // This host's id in Redis: "<host>/<zone>" (ClusterHostId).
  std::string host_id;
  int64_t decay_ns = 10'000'000'000;  // TRAFFICRATE_CLUSTER_DECAY
  int64_t tick_ns = 100'000'000;
  // A pass whose Redis steps take longer fails (each step is bounded).
  int64_t timeout_ns = 200'000'000;
  // A host's figures expire this long after its last exchange.
  int64_t ttl_ms = 600;
  // The lease: renewed every pass, taken over once expired.
  int64_t lease_ms = 500;
};

class ClusterAgent : public ZoneAgent {
 public:
  ClusterAgent(Zone* zone, const Logger* logger, ClusterAgentOptions options);
  // Stops the thread, if any (tests; the library never destroys it).
  ~ClusterAgent() override;
  ClusterAgent(const ClusterAgent&) = delete;
  ClusterAgent& operator=(const ClusterAgent&) = delete;

  void Poll(uint32_t proc, int64_t now_ns) override;
  void AfterForkChild() override;

  // Tests: one pass at now_ns as the lease holder `proc` would make it,
  // without the thread. False if the lease is another process's.
  bool PassForTesting(uint32_t proc, int64_t now_ns);
  bool running() const { return running_.load(std::memory_order_acquire); }

 private:
  static void* Main(void* self);
  void Run();
  // Frees the zone's lease if its holder (not proc) is dead, so that Poll
  // takes it at once.
  void FreeLeaseOfDeadHolder(uint32_t proc);
  void Pass(int64_t now_ns);
  // Publishes this host's URL, name and id in the zone (the lease holder's).
  void PublishIdentity();
  // The key's name in Redis: its client bytes and its rule's name, hashed
  // with the secret (ClusterKeyName).
  std::string FleetKeyName(const KeySlotShm& key) const;
  // Writes share into key slot k; true if it moved enough to re-pace.
  bool StoreShare(uint32_t k, uint64_t share);
  void Fallback(int64_t now_ns, const absl::Status& why);

  Zone* const zone_;
  const Logger* const logger_;
  const ClusterAgentOptions options_;
  std::unique_ptr<ClusterExchange> exchange_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> proc_{kNoSlot};
  pthread_t thread_{};
  // Per key slot, the thread's own: the last share from an exchange (0:
  // none), for the fallback.
  std::vector<double> last_share_;
  // Per key slot, the share its connections were last re-paced for.
  std::vector<uint64_t> applied_;
  bool fell_back_ = false;
  int64_t fell_back_ns_ = 0;
  int64_t last_success_ns_ = 0;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CLUSTER_CLUSTER_AGENT_H_
