// One host's exchange of per-key figures with the other hosts of a fleet
// through Redis (TRAFFICRATE_CLUSTER; cluster_agent.h runs it). Blocking, with
// a timeout: it runs in a thread of its own, never inside an interposed
// call.
//
//   ClusterExchange ex(url, "web", "host-a", /*ttl_ms=*/300);
//   absl::StatusOr<std::vector<PeerFigures>> peers =
//       ex.Exchange({{"trafficrate:web:1f2e...", 51200.0, 2}},
//                   absl::Milliseconds(50));
//
// In Redis, per zone: the hash trafficrate:ZONE:host:ID of each host (field:
// the key's ClusterKeyName, value: "DEMAND CONNECTIONS", and a heartbeat
// field "." holding the writer's random instance id), replaced whole every
// exchange (written under a temporary name with its expiry, then RENAMEd over
// the old one, so a reader never sees it half-written) and expiring ttl_ms
// after its host's last exchange; and the set trafficrate:ZONE:hosts of host
// ids. One exchange is one pipelined round trip of 8 commands plus one per
// other host (9 when a host left): read who wrote this host's hash last, write
// it, add it to the set, read the set, and from the hash of every host that the
// previous exchange listed the heartbeat and this host's keys (HMGET: a host
// whose hash has expired has no heartbeat and is taken out of the set in the
// next exchange). So a new host's figures are read from the second exchange
// after it joined, and what is read is bounded by this host's own keys.

#ifndef TRAFFICRATE_SRC_CLUSTER_CLUSTER_EXCHANGE_H_
#define TRAFFICRATE_SRC_CLUSTER_CLUSTER_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "src/config/cluster_url.h"

struct redisContext;

namespace trafficrate {

// A key's figures on one host.
struct KeyFigures {
  std::string name;  // ClusterKeyName
  double demand = 0;
  uint32_t connections = 0;
};

struct PeerFigures {
  std::string host;  // its id
  std::vector<KeyFigures> keys;
};

class ClusterExchange {
 public:
  ClusterExchange(ClusterUrl url, std::string zone, std::string host_id,
                  int64_t ttl_ms);
  ~ClusterExchange();
  ClusterExchange(const ClusterExchange&) = delete;
  ClusterExchange& operator=(const ClusterExchange&) = delete;

  // Publishes `mine` and returns the other live hosts' figures for the keys
  // of `mine` (as of the previous exchange's host list). Connects (and AUTHs,
  // SELECTs) first if not connected; any error drops the connection, so the
  // next call starts afresh. UnavailableError when Redis cannot be reached or
  // answers late (each step bounded by `timeout`), FailedPreconditionError when
  // it refuses (AUTH, a wrong type under our names).
  absl::StatusOr<std::vector<PeerFigures>> Exchange(
      absl::Span<const KeyFigures> mine, absl::Duration timeout);

  bool connected() const { return context_ != nullptr; }
  // Exchanges in a row that found this host's hash last written by another
  // instance (each writes a random id of its own as the heartbeat): from
  // two on, another host is using the same host id, and the two overwrite
  // each other's figures.
  int foreign_writes() const { return foreign_writes_; }
  // Successful exchanges so far. The first one reads no other host's
  // figures (it learns which hosts there are).
  uint64_t successes() const { return successes_; }
  // In a child after fork: closes the child's copy of the socket and
  // forgets the connection, freeing nothing (the child must not allocate
  // there). The object itself is then leaked by its owner.
  void ForgetAfterFork();

 private:
  absl::Status Connect(absl::Duration timeout);
  void Drop();

  ClusterUrl url_;
  std::string zone_;
  std::string host_id_;
  int64_t ttl_ms_;
  redisContext* context_ = nullptr;
  std::vector<std::string> known_hosts_;  // from the last exchange
  std::vector<std::string> gone_;  // read empty then: SREM them next time
  std::string instance_;           // random, the heartbeat field's value
  int foreign_writes_ = 0;
  uint64_t successes_ = 0;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CLUSTER_CLUSTER_EXCHANGE_H_
