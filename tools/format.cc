#include "tools/format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/base/clock.h"
#include "src/config/config.h"
#include "src/shm/zone.h"

namespace trafficrate {
namespace {

// "1.2", "12.3", "123": one decimal below 100, none above; never "1.0".
std::string Scaled(double value) {
  std::string text = value < 100 ? absl::StrFormat("%.1f", value)
                                 : absl::StrFormat("%.0f", value);
  if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) {
    text.resize(text.size() - 2);
  }
  return text;
}

}  // namespace

std::string PrometheusValue(double value) {
  if (std::isfinite(value) && value == std::floor(value) &&
      std::fabs(value) < 9e15) {
    return absl::StrFormat("%.0f", value);
  }
  return absl::StrFormat("%.3f", value);
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  // 1023.96 KiB would print as "1024 KiB": move up before rounding does.
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrCat(Scaled(value), " ", kUnits[unit]);
}

std::string HumanRate(uint64_t bytes_per_sec) {
  return absl::StrCat(HumanBytes(bytes_per_sec), "/s");
}

std::string HumanAgo(int64_t ns) {
  if (ns < kNsPerSec) return "now";
  const int64_t s = ns / kNsPerSec;
  if (s < 60) return absl::StrCat(s, "s ago");
  if (s < 3600) return absl::StrCat(s / 60, "m ago");
  if (s < 86400) return absl::StrCat(s / 3600, "h ago");
  return absl::StrCat(s / 86400, "d ago");
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string PrometheusLabel(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<KeySnapshot> SelectKeys(const ZoneSnapshot& snap,
                                    const StatOptions& options) {
  std::vector<KeySnapshot> keys = snap.keys;
  std::stable_sort(
      keys.begin(), keys.end(),
      [&](const KeySnapshot& a, const KeySnapshot& b) {
        if (options.sort == SortBy::kBytes && a.bytes_sent != b.bytes_sent) {
          return a.bytes_sent > b.bytes_sent;
        }
        if (a.active != b.active) return a.active > b.active;
        if (a.bytes_sent != b.bytes_sent) {
          return a.bytes_sent > b.bytes_sent;
        }
        return a.key < b.key;
      });
  if (options.top > 0 && keys.size() > options.top) keys.resize(options.top);
  return keys;
}

namespace {

// Whether the zone's rules came from a rules file: more than one, or rule 0
// named.
bool HasRules(const ZoneSnapshot& s) {
  return s.rules.size() > 1 ||
         (s.rules.size() == 1 && s.rules[0].name != "default");
}

// "1 peer", "2 peers".
std::string Peers(uint32_t n) {
  return absl::StrFormat("%u peer%s", n, n == 1 ? "" : "s");
}

}  // namespace

std::string ClusterLine(const ClusterSnapshot& c) {
  return absl::StrFormat(
      "cluster %s (name %s, host %s): %s, pid %d, %s, last exchange %s "
      "(round trip %.1f ms); %u exchanges, %u failed, %u fallbacks\n",
      c.url, c.name, c.host, c.state, c.pid, Peers(c.peers),
      c.last_exchange_age_ns < 0 ? std::string("never")
                                 : HumanAgo(c.last_exchange_age_ns),
      c.rtt_us / 1000.0, c.exchanges, c.failures, c.fallbacks);
}

double IdleSeconds(const KeySnapshot& key, int64_t now_ns) {
  if (key.active > 0 || key.last_active_ns <= 0) return 0;
  const int64_t ns = now_ns - key.last_active_ns;
  return ns > 0 ? static_cast<double>(ns) / kNsPerSec : 0;
}

std::string FormatStatTable(const ZoneSnapshot& s, const StatOptions& options) {
  std::string out = absl::StrFormat(
      "zone %s: %s per client (TRAFFICRATE_KEY=%s), %zu of %u keys, %zu of "
      "%u connections (%zu sending), %zu processes\n",
      s.name, HumanRate(s.rate_bytes_per_sec), DescribeKeySpec(s.key_spec),
      s.keys.size(), s.key_capacity, s.connections.size(), s.conn_capacity,
      ActiveConnections(s), LiveProcesses(s));
  absl::StrAppendFormat(
      &out, "%s\n",
      s.share_mode == ShareMode::kBudget
          ? absl::StrCat("shared budget (TRAFFICRATE_SHARE=budget), burst ",
                         HumanBytes(s.burst_bytes))
          : std::string(
                "equal shares, rate / active (TRAFFICRATE_SHARE=equal)"));
  absl::StrAppendFormat(&out,
                        "dead processes reaped %u (%u connections), table "
                        "full %u times, lock repairs %u, lock timeouts %u\n",
                        s.procs_reaped, s.conns_reaped, s.table_full,
                        s.lock_repairs, s.lock_timeouts);
  if (s.has_cluster) out += ClusterLine(s.cluster);
  uint64_t shaped_calls = 0, shaper_syscalls = 0, shaped_pieces = 0;
  for (const ProcSnapshot& p : s.processes) {
    shaped_calls += p.shaped_calls;
    shaper_syscalls += p.shaper_syscalls;
    shaped_pieces += p.shaped_pieces;
  }
  absl::StrAppendFormat(
      &out,
      "packet shaper: %u calls cut into %u pieces, with %u system calls\n",
      shaped_calls, shaped_pieces, shaper_syscalls);
  if (s.share_mode == ShareMode::kBudget) {
    double cpu = 0, stretch = 0;
    for (const ProcSnapshot& p : s.processes) {
      cpu += p.watcher_cpu_pct;
      stretch = std::max(stretch, p.watcher_stretch);
    }
    absl::StrAppendFormat(
        &out, "watchers use %.2f%% of a core%s\n", cpu,
        stretch > 1.005
            ? absl::StrFormat("; their per-connection work is spaced "
                              "out up to %.2fx to stay within it",
                              stretch)
            : std::string());
  }
  // A rules file: its rules, and a column naming each key's.
  const bool rules = HasRules(s);
  for (const RuleSnapshot& r : rules ? s.rules : std::vector<RuleSnapshot>()) {
    absl::StrAppendFormat(&out, "rule %s: %s per client (key %s)\n", r.name,
                          HumanRate(r.rate_bytes_per_sec),
                          DescribeKeySpec(r.key_spec));
  }
  const std::vector<KeySnapshot> keys = SelectKeys(s, options);
  if (keys.empty()) return out + "\nno clients\n";
  const int rule_width = rules ? 16 : 0;
  // With a cluster: the key on every host, and this host's budget for it.
  const bool fleet = s.has_cluster;
  absl::StrAppendFormat(
      &out, "\n%-*s%-39s %6s %6s%s %12s %12s %12s %10s %10s %7s  %s\n",
      rule_width, rules ? "RULE" : "", "CLIENT", "ACTIVE", "CONNS",
      fleet ? absl::StrFormat(" %12s %5s %12s", "FLEET ACTIVE", "HOSTS",
                              "HOST SHARE")
            : "",
      "SHARE/CONN", "MEASURED", "LEVEL", "DEBT", "SENT", "SERVED",
      "LAST ACTIVE");
  const bool budget = s.share_mode == ShareMode::kBudget;
  for (const KeySnapshot& k : keys) {
    const double idle = IdleSeconds(k, s.taken_ns);
    absl::StrAppendFormat(
        &out, "%-*s%-39s %6u %6u%s %12s %12s %12s %10s %10s %7u  %s\n",
        rule_width, rules ? absl::StrCat(k.rule, " ") : "", k.key, k.active,
        k.connections,
        fleet ? absl::StrFormat(" %12u %5u %12s", k.cluster_active,
                                k.cluster_hosts,
                                k.host_share_bytes_per_sec > 0
                                    ? HumanRate(k.host_share_bytes_per_sec)
                                    : "-")
              : "",
        HumanRate(k.share_bytes_per_sec),
        budget ? HumanRate(k.measured_bytes_per_sec) : "-",
        budget && k.level_bytes_per_sec > 0 ? HumanRate(k.level_bytes_per_sec)
                                            : "-",
        budget ? HumanBytes(k.debt_bytes) : "-", HumanBytes(k.bytes_sent),
        k.connections_served,
        k.active > 0 ? "now"
                     : HumanAgo(static_cast<int64_t>(idle * kNsPerSec)));
  }
  if (keys.size() < s.keys.size()) {
    absl::StrAppendFormat(&out, "(%zu more)\n", s.keys.size() - keys.size());
  }
  return out;
}

namespace {

std::string ClusterJson(const ZoneSnapshot& s) {
  if (!s.has_cluster) return "null";
  const ClusterSnapshot& c = s.cluster;
  return absl::StrFormat(
      "{\"state\": %s, \"url\": %s, \"name\": %s, \"host\": %s, "
      "\"pid\": %d, \"peers\": %u, \"exchanges\": %u, \"failures\": %u, "
      "\"fallbacks\": %u, \"last_exchange_ms_ago\": %s, "
      "\"last_rtt_ms\": %.3f}",
      JsonString(c.state), JsonString(c.url), JsonString(c.name),
      JsonString(c.host), c.pid, c.peers, c.exchanges, c.failures, c.fallbacks,
      c.last_exchange_age_ns < 0
          ? std::string("null")
          : absl::StrFormat("%.1f", c.last_exchange_age_ns / 1e6),
      c.rtt_us / 1000.0);
}

}  // namespace

std::string FormatStatJson(const ZoneSnapshot& s, const StatOptions& options) {
  std::string out = absl::StrFormat(
      "{\"zone\": %s, \"path\": %s, \"size\": %u, \"rate\": %u, "
      "\"key\": %s,\n"
      " \"share_mode\": %s, \"burst\": %u,\n"
      " \"capacity\": {\"keys\": %u, \"connections\": %u, \"processes\": "
      "%u},\n"
      " \"used\": {\"keys\": %u, \"connections\": %u, \"active\": %u, "
      "\"processes\": %u},\n"
      " \"counters\": {\"table_full\": %u, \"lock_repairs\": %u, "
      "\"lock_timeouts\": %u, \"processes_reaped\": %u, "
      "\"connections_reaped\": %u},\n"
      " \"keys\": [",
      JsonString(s.name), JsonString(s.path), s.size_bytes,
      s.rate_bytes_per_sec, JsonString(DescribeKeySpec(s.key_spec)),
      JsonString(std::string(ShareModeName(s.share_mode))), s.burst_bytes,
      s.key_capacity, s.conn_capacity, s.proc_capacity, s.keys.size(),
      s.connections.size(), ActiveConnections(s), LiveProcesses(s),
      s.table_full, s.lock_repairs, s.lock_timeouts, s.procs_reaped,
      s.conns_reaped);
  const char* sep = "";
  for (const KeySnapshot& k : SelectKeys(s, options)) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"key\": %s, \"rule\": %s, \"active\": %u, "
        "\"connections\": %u, "
        "\"share\": %u, \"measured\": %u, \"level\": %u, \"debt\": %u, "
        "\"boost\": %s, \"packet_bytes\": %u, \"under_pace\": %u, "
        "\"bytes\": %u, \"served\": %u, \"idle_seconds\": %.3f, "
        "\"cluster\": %s}",
        sep, JsonString(k.key), JsonString(k.rule), k.active, k.connections,
        k.share_bytes_per_sec, k.measured_bytes_per_sec, k.level_bytes_per_sec,
        k.debt_bytes,
        k.boost < 0 ? std::string("null") : absl::StrFormat("%.4f", k.boost),
        k.packet_bytes, k.under_pace, k.bytes_sent, k.connections_served,
        IdleSeconds(k, s.taken_ns),
        s.has_cluster
            ? absl::StrFormat(
                  "{\"active\": %u, \"hosts\": %u, \"host_share\": %u}",
                  k.cluster_active, k.cluster_hosts, k.host_share_bytes_per_sec)
            : std::string("null"));
    sep = ",";
  }
  absl::StrAppend(&out, "],\n \"cluster\": ", ClusterJson(s),
                  ",\n \"rules\": [");
  sep = "";
  for (const RuleSnapshot& r : s.rules) {
    absl::StrAppendFormat(&out,
                          "%s\n  {\"name\": %s, \"rate\": %u, \"burst\": %u, "
                          "\"key\": %s}",
                          sep, JsonString(r.name), r.rate_bytes_per_sec,
                          r.burst_bytes,
                          JsonString(DescribeKeySpec(r.key_spec)));
    sep = ",";
  }
  absl::StrAppend(&out, "],\n \"processes\": [");
  sep = "";
  for (const ProcSnapshot& p : s.processes) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"pid\": %d, \"connections\": %u, \"alive\": %s, "
        "\"watcher_cpu_pct\": %.2f, \"watcher_stretch\": %.2f, "
        "\"shaped_calls\": %u, \"shaper_syscalls\": %u, "
        "\"shaped_pieces\": %u}",
        sep, p.pid, p.connections, p.alive ? "true" : "false",
        p.watcher_cpu_pct, p.watcher_stretch, p.shaped_calls, p.shaper_syscalls,
        p.shaped_pieces);
    sep = ",";
  }
  absl::StrAppend(&out, "],\n \"connections\": [");
  sep = "";
  for (const ConnSnapshot& c : s.connections) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"key\": %s, \"peer\": %s, \"pid\": %d, \"fd\": %d, "
        "\"active\": %s, \"draining\": %s, \"share\": %u, \"bytes\": %u}",
        sep, JsonString(c.key), JsonString(c.peer), c.pid, c.fd,
        c.active ? "true" : "false", c.draining ? "true" : "false",
        c.share_bytes_per_sec, c.bytes_sent);
    sep = ",";
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

namespace {

struct Metric {
  const char* name;
  const char* type;
  const char* help;
};

void AppendHeader(std::string* out, const Metric& m) {
  absl::StrAppendFormat(out, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help,
                        m.name, m.type);
}

}  // namespace

namespace {

// The zone's fleet exchange (TRAFFICRATE_CLUSTER), through zone_metric.
template <typename ZoneMetric>
void AppendClusterMetrics(const ClusterSnapshot& c, ZoneMetric zone_metric) {
  zone_metric({"trafficrate_cluster_connected", "gauge",
               "1 while the zone's last exchange through Redis succeeded, 0 "
               "while it falls back or no process exchanges (stale)."},
              c.state == "connected" ? 1 : 0);
  zone_metric({"trafficrate_cluster_peers", "gauge",
               "Other hosts of the fleet seen at the last exchange."},
              c.peers);
  zone_metric({"trafficrate_cluster_exchanges_total", "counter",
               "Successful exchanges with Redis."},
              static_cast<double>(c.exchanges));
  zone_metric({"trafficrate_cluster_failures_total", "counter",
               "Exchanges with Redis that failed or timed out."},
              static_cast<double>(c.failures));
  zone_metric({"trafficrate_cluster_fallbacks_total", "counter",
               "Times the zone fell back to its local policy because Redis "
               "could not be reached."},
              static_cast<double>(c.fallbacks));
  zone_metric({"trafficrate_cluster_round_trip_seconds", "gauge",
               "Round trip of the last successful exchange."},
              c.rtt_us / 1e6);
  zone_metric({"trafficrate_cluster_last_exchange_age_seconds", "gauge",
               "Seconds since the last successful exchange (-1: none yet)."},
              c.last_exchange_age_ns < 0 ? -1.0 : c.last_exchange_age_ns / 1e9);
}

}  // namespace

std::string FormatStatPrometheus(const ZoneSnapshot& s,
                                 const StatOptions& options) {
  const std::string zone = PrometheusLabel(s.name);
  std::string out;
  const auto zone_metric = [&](const Metric& m, double value) {
    AppendHeader(&out, m);
    absl::StrAppendFormat(&out, "%s{zone=\"%s\"} %s\n", m.name, zone,
                          PrometheusValue(value));
  };
  zone_metric({"trafficrate_rate_bytes_per_second", "gauge",
               "Rate each client key shares among its connections."},
              static_cast<double>(s.rate_bytes_per_sec));
  zone_metric({"trafficrate_keys", "gauge", "Client keys in the zone."},
              static_cast<double>(s.keys.size()));
  zone_metric(
      {"trafficrate_keys_capacity", "gauge", "Client keys the zone can hold."},
      s.key_capacity);
  zone_metric({"trafficrate_connections", "gauge",
               "Governed connections registered in the zone."},
              static_cast<double>(s.connections.size()));
  zone_metric({"trafficrate_active_connections", "gauge",
               "Governed connections currently sending."},
              static_cast<double>(ActiveConnections(s)));
  zone_metric({"trafficrate_connections_capacity", "gauge",
               "Connections the zone can hold."},
              s.conn_capacity);
  zone_metric({"trafficrate_processes", "gauge",
               "Live server processes registered in the zone."},
              static_cast<double>(LiveProcesses(s)));
  zone_metric({"trafficrate_processes_reaped_total", "counter",
               "Dead processes whose registrations were released."},
              static_cast<double>(s.procs_reaped));
  zone_metric({"trafficrate_connections_reaped_total", "counter",
               "Connections released because their process died."},
              static_cast<double>(s.conns_reaped));
  zone_metric({"trafficrate_table_full_total", "counter",
               "Connections left unpaced because the zone was full."},
              static_cast<double>(s.table_full));
  zone_metric({"trafficrate_lock_repairs_total", "counter",
               "Times the zone was repaired after a process died holding "
               "its lock."},
              static_cast<double>(s.lock_repairs));
  zone_metric({"trafficrate_lock_timeouts_total", "counter",
               "Times a call gave up waiting for the zone lock (held too "
               "long by another process) and passed through."},
              static_cast<double>(s.lock_timeouts));
  if (s.has_cluster) AppendClusterMetrics(s.cluster, zone_metric);
  const auto proc_metric = [&](const Metric& m, auto value_of) {
    AppendHeader(&out, m);
    for (const ProcSnapshot& p : s.processes) {
      absl::StrAppendFormat(&out, "%s{zone=\"%s\",pid=\"%d\"} %s\n", m.name,
                            zone, p.pid, PrometheusValue(value_of(p)));
    }
  };
  proc_metric({"trafficrate_shaped_calls_total", "counter",
               "The server's send calls the packet shaper cut into pieces."},
              [](const ProcSnapshot& p) {
                return static_cast<double>(p.shaped_calls);
              });
  proc_metric({"trafficrate_shaper_syscalls_total", "counter",
               "System calls the packet shaper made for them."},
              [](const ProcSnapshot& p) {
                return static_cast<double>(p.shaper_syscalls);
              });
  proc_metric({"trafficrate_shaped_pieces_total", "counter",
               "MSG_EOR pieces (each at most one packet) they sent."},
              [](const ProcSnapshot& p) {
                return static_cast<double>(p.shaped_pieces);
              });
  if (s.share_mode == ShareMode::kBudget) {
    proc_metric({"trafficrate_watcher_cpu_percent", "gauge",
                 "CPU the process's watcher thread used in the last second, "
                 "in % of a core (budget mode)."},
                [](const ProcSnapshot& p) { return p.watcher_cpu_pct; });
    proc_metric({"trafficrate_watcher_stretch", "gauge",
                 "Factor by which the watcher spaces its per-connection work "
                 "out to stay within its CPU allowance (1: not at all)."},
                [](const ProcSnapshot& p) { return p.watcher_stretch; });
  }
  AppendHeader(&out, {"trafficrate_rule_rate_bytes_per_second", "gauge",
                      "Rate each client key of the rule shares among its "
                      "connections."});
  for (const RuleSnapshot& r : s.rules) {
    absl::StrAppendFormat(
        &out, "%s{zone=\"%s\",rule=\"%s\"} %s\n",
        "trafficrate_rule_rate_bytes_per_second", zone, PrometheusLabel(r.name),
        PrometheusValue(static_cast<double>(r.rate_bytes_per_sec)));
  }
  const std::vector<KeySnapshot> keys = SelectKeys(s, options);
  const auto key_metric = [&](const Metric& m, auto value_of) {
    AppendHeader(&out, m);
    for (const KeySnapshot& k : keys) {
      absl::StrAppendFormat(&out, "%s{zone=\"%s\",key=\"%s\",rule=\"%s\"} %s\n",
                            m.name, zone, PrometheusLabel(k.key),
                            PrometheusLabel(k.rule),
                            PrometheusValue(value_of(k)));
    }
  };
  key_metric(
      {"trafficrate_key_active_connections", "gauge",
       "Sending connections of the client key."},
      [](const KeySnapshot& k) { return static_cast<double>(k.active); });
  key_metric(
      {"trafficrate_key_connections", "gauge",
       "Registered connections of the client key."},
      [](const KeySnapshot& k) { return static_cast<double>(k.connections); });
  key_metric({"trafficrate_key_share_bytes_per_second", "gauge",
              "Current share of each sending connection of the key."},
             [](const KeySnapshot& k) {
               return static_cast<double>(k.share_bytes_per_sec);
             });
  key_metric({"trafficrate_key_measured_bytes_per_second", "gauge",
              "Rate of the key's bytes that left its sockets, over ~1 s "
              "(budget mode; 0 in equal mode)."},
             [](const KeySnapshot& k) {
               return static_cast<double>(k.measured_bytes_per_sec);
             });
  key_metric({"trafficrate_key_level_bytes_per_second", "gauge",
              "Pacing cap in force for each sending connection of the key "
              "(budget mode; 0 in equal mode)."},
             [](const KeySnapshot& k) {
               return static_cast<double>(k.level_bytes_per_sec);
             });
  key_metric(
      {"trafficrate_key_debt_bytes", "gauge",
       "Bytes the key sent over its budget, still to be repaid "
       "(budget mode)."},
      [](const KeySnapshot& k) { return static_cast<double>(k.debt_bytes); });
  key_metric(
      {"trafficrate_key_sent_bytes_total", "counter",
       "Bytes the server handed to the kernel for the key."},
      [](const KeySnapshot& k) { return static_cast<double>(k.bytes_sent); });
  key_metric({"trafficrate_key_connections_served_total", "counter",
              "Connections of the key registered since it appeared."},
             [](const KeySnapshot& k) {
               return static_cast<double>(k.connections_served);
             });
  if (s.has_cluster) {
    key_metric({"trafficrate_key_cluster_active_connections", "gauge",
                "Sending connections of the key on every host of the fleet, "
                "at the last exchange."},
               [](const KeySnapshot& k) {
                 return static_cast<double>(k.cluster_active);
               });
    key_metric({"trafficrate_key_cluster_hosts", "gauge",
                "Hosts of the fleet where the key has sending connections."},
               [](const KeySnapshot& k) {
                 return static_cast<double>(k.cluster_hosts);
               });
    key_metric({"trafficrate_key_host_share_bytes_per_second", "gauge",
                "This host's budget for the key: its share of the rule's "
                "rate across the fleet."},
               [](const KeySnapshot& k) {
                 return static_cast<double>(k.host_share_bytes_per_sec);
               });
  }
  key_metric({"trafficrate_key_idle_seconds", "gauge",
              "Seconds since the key last had a sending connection."},
             [&](const KeySnapshot& k) { return IdleSeconds(k, s.taken_ns); });
  return out;
}

}  // namespace trafficrate
