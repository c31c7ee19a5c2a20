#include "src/cluster/cluster.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "src/base/siphash.h"

namespace trafficrate {
namespace {

SipKey SecretKey(absl::string_view secret) {
  // Two fixed keys spread the secret over the 128 key bits.
  constexpr SipKey kFirst{0x7472616666696372ull, 0x6174652d636c7573ull};
  constexpr SipKey kSecond{0x7465722d73656372ull, 0x65742d6b65792d32ull};
  return SipKey{SipHash24(kFirst, secret.data(), secret.size()),
                SipHash24(kSecond, secret.data(), secret.size())};
}

}  // namespace

std::string ClusterKeyName(absl::string_view zone, const void* key,
                           size_t key_len, absl::string_view secret) {
  const uint64_t hash = SipHash24(SecretKey(secret), key, key_len);
  return absl::StrFormat("trafficrate:%s:%016x", zone, hash);
}

std::vector<double> MaxMinShares(double rate,
                                 absl::Span<const HostDemand> hosts) {
  std::vector<double> shares(hosts.size(), 0.0);
  std::vector<size_t> order;
  double weight = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i].connections == 0) continue;
    order.push_back(i);
    weight += hosts[i].connections;
  }
  if (order.empty() || !(rate > 0)) return shares;
  // Lowest demand per connection first: those are the hosts that may want
  // less than their shares.
  auto per_connection = [&hosts](size_t i) {
    const double d = std::isnan(hosts[i].demand) ? 0 : hosts[i].demand;
    return std::max(0.0, d) / hosts[i].connections;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return per_connection(a) < per_connection(b);
  });
  double left = rate;
  double left_weight = weight;
  size_t first_unsatisfied = order.size();
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const double level = left / left_weight;
    if (per_connection(i) >= level) {
      first_unsatisfied = k;
      break;
    }
    shares[i] = per_connection(i) * hosts[i].connections;
    left -= shares[i];
    left_weight -= hosts[i].connections;
  }
  if (first_unsatisfied < order.size()) {
    // The rest share what is left, per connection.
    const double level = left / left_weight;
    for (size_t k = first_unsatisfied; k < order.size(); ++k) {
      shares[order[k]] = level * hosts[order[k]].connections;
    }
  } else if (left > 0) {
    // Every host wants less than its share: the spare goes to all, by
    // connections, so each can grow into it.
    for (const size_t i : order) {
      shares[i] += left * hosts[i].connections / weight;
    }
  }
  return shares;
}

double FallbackShare(double last_share, double rate, int64_t since_ns,
                     int64_t decay_ns) {
  if (!(last_share >= 0) || last_share > rate) last_share = rate;
  if (since_ns <= 0) return last_share;
  if (decay_ns <= 0 || since_ns >= decay_ns) return rate;
  const double f =
      static_cast<double>(since_ns) / static_cast<double>(decay_ns);
  return last_share + (rate - last_share) * f;
}

}  // namespace trafficrate
