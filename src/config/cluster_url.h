// The fleet's settings that are configuration (TRAFFICRATE_CLUSTER and
// TRAFFICRATE_CLUSTER_HOST): the Redis URL, parsed and shown, and this host's
// id in Redis. Read by the configuration, the CLI and the cluster agent
// (src/cluster/); tested in tests/config/cluster_url_test.cc.
//
//   absl::StatusOr<ClusterUrl> url =
//   ParseClusterUrl("redis://10.0.0.5:6379/2"); std::string shown =
//   DescribeClusterUrl(*url);  // no password

#ifndef TRAFFICRATE_SRC_CONFIG_CLUSTER_URL_H_
#define TRAFFICRATE_SRC_CONFIG_CLUSTER_URL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trafficrate {

// redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]. HOST is a name, an IPv4
// address or a bracketed IPv6 one. No TLS: Debian 12's hiredis (0.14) has
// none, so rediss:// is refused with that reason.
struct ClusterUrl {
  std::string host;  // without brackets
  int port = 6379;
  int db = 0;
  std::string user;      // "" : AUTH PASSWORD (Redis < 6 form)
  std::string password;  // "" : no AUTH
};

// InvalidArgumentError naming `variable` and the accepted form.
absl::StatusOr<ClusterUrl> ParseClusterUrl(
    absl::string_view url, absl::string_view variable = "TRAFFICRATE_CLUSTER");

// The URL as shown (the password replaced by "***").
std::string DescribeClusterUrl(const ClusterUrl& url);

// This host's id in Redis, "<host>/<zone>": host is TRAFFICRATE_CLUSTER_HOST
// or, empty, the machine's hostname. Two zones on one machine are two hosts.
std::string ClusterHostId(absl::string_view host, absl::string_view zone_name);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_CONFIG_CLUSTER_URL_H_
