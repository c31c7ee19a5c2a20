// The parts of fleet-wide sharing (one client's rate shared across hosts
// through Redis) that need no Redis: the names a key takes in Redis, each
// host's max-min share of a key's global rate, and the local policy while
// Redis cannot be reached. Plain functions, tested in
// tests/cluster/cluster_test.cc. The cluster URL and the host's id are
// configuration (src/config/cluster_url.h); the exchange is
// cluster_exchange.h, the agent that runs it cluster_agent.h.
//
//   std::string name = ClusterKeyName("web", key_bytes, 16, secret);
//   std::vector<double> budgets = MaxMinShares(rate, hosts);

#ifndef TRAFFICRATE_SRC_CLUSTER_CLUSTER_H_
#define TRAFFICRATE_SRC_CLUSTER_CLUSTER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trafficrate {

// The Redis key of one client key: "trafficrate:ZONE:" and 16 hex digits of
// SipHash-2-4 keyed by the cluster secret, so that Redis never holds client
// addresses in clear and hosts with the same secret agree on the name.
std::string ClusterKeyName(absl::string_view zone, const void* key,
                           size_t key_len, absl::string_view secret);

// One host's figures for a key: what its connections of the key sent
// (bytes/s) and how many of them are sending. A host whose connections are
// held back by their budget (demand near it) should report a demand above
// it (it could send more), e.g. infinity.
struct HostDemand {
  double demand = 0;
  uint32_t connections = 0;
};

// Each host's budget for the key: weighted max-min. Every sending
// connection is worth one share of `rate`; a host whose connections want
// less than their shares gets its demand and the rest goes to the others
// (water-filling); what no host wants is spread by connections, so each can
// grow into it. Hosts without connections get 0. The budgets sum to `rate`
// when any host has a connection.
std::vector<double> MaxMinShares(double rate,
                                 absl::Span<const HostDemand> hosts);

// While the cluster cannot be reached: the last known share of the global
// rate, moving linearly to the full local rate over `decay_ns` since the
// last exchange (so a host cut off from the others takes no more than the
// rate alone, and gives nothing away for good).
double FallbackShare(double last_share, double rate, int64_t since_ns,
                     int64_t decay_ns);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CLUSTER_CLUSTER_H_
