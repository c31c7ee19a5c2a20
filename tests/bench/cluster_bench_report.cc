#include "tests/bench/cluster_bench_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "src/base/clock.h"
#include "tests/bench/cluster_bench.h"

namespace trafficrate {
namespace cluster_bench {
namespace {

std::string Fixed(double v, int decimals) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string JsonNumber(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string JsonLatency(const Latency& l) {
  std::string s = "{\"n\": " + std::to_string(l.ms.size()) +
                  ", \"failed\": " + std::to_string(l.failed) +
                  ", \"median_ms\": " + JsonNumber(l.At(0.5)) +
                  ", \"p99_ms\": " + JsonNumber(l.At(0.99)) +
                  ", \"max_ms\": " + JsonNumber(l.Max()) +
                  ", \"samples_ms\": [";
  for (size_t i = 0; i < l.ms.size(); ++i) {
    s += (i ? ", " : "") + JsonNumber(l.ms[i]);
  }
  return s + "]}";
}

}  // namespace

void PrintTable(const std::vector<Result>& results, int port,
                const std::string& version, double load) {
  std::printf(
      "cluster: 2 hosts = 2 zones in one process, a ClusterAgent (thread %s, "
      "tick %lld ms) each; redis-server %s on 127.0.0.1:%d; every key on "
      "both hosts; load average %.2f\n",
      kThreadName, static_cast<long long>(kTickNs / kNsPerMs), version.c_str(),
      port, load);
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](const std::string& label, auto cell) {
    std::vector<std::string> cells;
    for (const Result& r : results) cells.push_back(r.ready ? cell(r) : "-");
    rows.emplace_back(label, cells);
  };
  auto pair = [](const double* v, int d) {
    return Fixed(v[0], d) + " / " + Fixed(v[1], d);
  };
  row("zone size MiB (key capacity)", [](const Result& r) {
    return Fixed(static_cast<double>(r.zone_bytes) / (1 << 20), 0) + " (" +
           std::to_string(r.key_capacity) + ")";
  });
  row("set-up until every key shared, s",
      [](const Result& r) { return Fixed(r.setup_s, 1); });
  row("exchanges/s, host a / b",
      [&](const Result& r) { return pair(r.exchanges_per_s, 1); });
  row("Redis commands/s per host",
      [](const Result& r) { return Fixed(r.commands_per_s_per_host, 1); });
  row("host -> Redis KB/s per host",
      [](const Result& r) { return Fixed(r.sent_Bps_per_host / 1e3, 1); });
  row("Redis -> host KB/s per host",
      [](const Result& r) { return Fixed(r.received_Bps_per_host / 1e3, 1); });
  row("agent thread CPU % of a core, a / b",
      [&](const Result& r) { return pair(r.agent_cpu_pct, 2); });
  row("agent CPU ms per exchange, a / b",
      [&](const Result& r) { return pair(r.agent_cpu_ms_per_exchange, 2); });
  row("redis-server CPU % of a core (2 hosts)",
      [](const Result& r) { return Fixed(r.redis_cpu_pct, 2); });
  row("exchange round trip ms, median / max", [](const Result& r) {
    return Fixed(r.rtt_ms_median, 2) + " / " + Fixed(r.rtt_ms_max, 2);
  });
  row("join on a -> b's share, median ms",
      [](const Result& r) { return Fixed(r.join.At(0.5), 1); });
  row("join on a -> b's share, p99 / max ms", [](const Result& r) {
    return Fixed(r.join.At(0.99), 1) + " / " + Fixed(r.join.Max(), 1);
  });
  row("leave on a -> b's share, median / p99 ms", [](const Result& r) {
    return Fixed(r.leave.At(0.5), 1) + " / " + Fixed(r.leave.At(0.99), 1);
  });
  row("joins measured (failed), b's phases", [](const Result& r) {
    return std::to_string(r.join.ms.size()) + " (" +
           std::to_string(r.join.failed + r.leave.failed) + "), " +
           std::to_string(r.phases);
  });
  row("failed exchanges (both hosts)",
      [](const Result& r) { return std::to_string(r.failures); });
  size_t label_w = 6;
  for (const auto& [label, cells] : rows)
    label_w = std::max(label_w, label.size());
  std::vector<size_t> w;
  for (const Result& r : results) {
    w.push_back(std::to_string(r.keys).size() + 10);
  }
  for (const auto& [label, cells] : rows) {
    for (size_t i = 0; i < cells.size(); ++i)
      w[i] = std::max(w[i], cells[i].size());
  }
  std::printf("%-*s", static_cast<int>(label_w), "active keys per host");
  for (size_t i = 0; i < results.size(); ++i) {
    std::printf("  %*u keys", static_cast<int>(w[i]) - 5, results[i].keys);
  }
  std::printf("\n");
  for (const auto& [label, cells] : rows) {
    std::printf("%-*s", static_cast<int>(label_w), label.c_str());
    for (size_t i = 0; i < cells.size(); ++i) {
      std::printf("  %*s", static_cast<int>(w[i]), cells[i].c_str());
    }
    std::printf("\n");
  }
}

bool WriteJson(const std::string& path, const std::vector<Result>& results,
               const Options& o, int port, const std::string& version,
               double load, bool quick) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    return false;
  }
  std::fprintf(f,
               "{\"bench\": \"cluster\", \"quick\": %s, \"hosts\": %d,\n"
               " \"layout\": \"two zones in one process, a ClusterAgent each "
               "(thread %s); every key on both hosts\",\n"
               " \"redis_version\": \"%s\", \"redis_port\": %d, "
               "\"tick_ms\": %lld, \"rate_Bps\": %" PRIu64
               ", \"measured_conns_per_host\": %u, \"joins\": %d, "
               "\"loadavg\": %.2f,\n \"cases\": [\n",
               quick ? "true" : "false", kHosts, kThreadName, version.c_str(),
               port, static_cast<long long>(kTickNs / kNsPerMs), kRate,
               kMeasuredConns, o.joins, load);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::string commands = "{";
    bool first = true;
    for (const auto& [command, per_s] : r.command_per_s_per_host) {
      commands +=
          (first ? "\"" : ", \"") + command + "\": " + JsonNumber(per_s);
      first = false;
    }
    commands += "}";
    std::fprintf(
        f,
        "  {\"keys\": %u, \"ready\": %s, \"zone_bytes\": %" PRIu64
        ", \"key_capacity\": %u, \"setup_s\": %s, \"window_s\": %s,\n"
        "   \"exchanges_per_s\": [%s, %s], \"redis_commands_per_s_per_host\": "
        "%s,\n   \"redis_commands_per_s_per_host_by_command\": %s,\n"
        "   \"sent_to_redis_Bps_per_host\": %s, "
        "\"received_from_redis_Bps_per_host\": %s,\n"
        "   \"agent_cpu_pct\": [%s, %s], \"agent_cpu_ms_per_exchange\": [%s, "
        "%s], \"redis_cpu_pct\": %s,\n"
        "   \"rtt_ms_median\": %s, \"rtt_ms_max\": %s, "
        "\"failed_exchanges\": %" PRIu64
        ", \"phases\": %d,\n   \"join\": %s,\n"
        "   \"leave\": %s}%s\n",
        r.keys, r.ready ? "true" : "false", r.zone_bytes, r.key_capacity,
        JsonNumber(r.setup_s).c_str(), JsonNumber(r.window_s).c_str(),
        JsonNumber(r.exchanges_per_s[0]).c_str(),
        JsonNumber(r.exchanges_per_s[1]).c_str(),
        JsonNumber(r.commands_per_s_per_host).c_str(), commands.c_str(),
        JsonNumber(r.sent_Bps_per_host).c_str(),
        JsonNumber(r.received_Bps_per_host).c_str(),
        JsonNumber(r.agent_cpu_pct[0]).c_str(),
        JsonNumber(r.agent_cpu_pct[1]).c_str(),
        JsonNumber(r.agent_cpu_ms_per_exchange[0]).c_str(),
        JsonNumber(r.agent_cpu_ms_per_exchange[1]).c_str(),
        JsonNumber(r.redis_cpu_pct).c_str(),
        JsonNumber(r.rtt_ms_median).c_str(), JsonNumber(r.rtt_ms_max).c_str(),
        r.failures, r.phases, JsonLatency(r.join).c_str(),
        JsonLatency(r.leave).c_str(), i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, " ]}\n");
  return std::fclose(f) == 0;
}

}  // namespace cluster_bench
}  // namespace trafficrate
