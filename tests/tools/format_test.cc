// Output formatting of the trafficrate CLI (tools/format.h, tools/top.h).

#include "tools/format.h"

#include <string>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "tools/top.h"

namespace trafficrate {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(HumanBytesTest, BinaryUnitsWithOneDecimalBelowAHundred) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(512000), "500 KiB");
  EXPECT_EQ(HumanBytes(1048576), "1 MiB");
  EXPECT_EQ(HumanBytes(1288490189), "1.2 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{5} << 40), "5 TiB");
}

TEST(HumanBytesTest, NeverShows1024OfAUnit) {
  EXPECT_EQ(HumanBytes(1048575), "1 MiB");
  EXPECT_EQ(HumanBytes(1024 * 1023), "1023 KiB");
}

TEST(HumanRateTest, AppendsPerSecond) {
  EXPECT_EQ(HumanRate(512000), "500 KiB/s");
  EXPECT_EQ(HumanRate(100), "100 B/s");
}

TEST(HumanAgoTest, Steps) {
  EXPECT_EQ(HumanAgo(0), "now");
  EXPECT_EQ(HumanAgo(kNsPerSec - 1), "now");
  EXPECT_EQ(HumanAgo(12 * kNsPerSec), "12s ago");
  EXPECT_EQ(HumanAgo(5 * 60 * kNsPerSec), "5m ago");
  EXPECT_EQ(HumanAgo(3 * 3600 * kNsPerSec), "3h ago");
  EXPECT_EQ(HumanAgo(int64_t{2} * 86400 * kNsPerSec), "2d ago");
}

TEST(JsonStringTest, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(JsonString("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\u000a\\u0001\"");
}

TEST(PrometheusTest, LabelEscapesAndValues) {
  EXPECT_EQ(PrometheusLabel("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(PrometheusValue(512000), "512000");
  EXPECT_EQ(PrometheusValue(1.5), "1.500");
  EXPECT_EQ(PrometheusValue(123456789012.0), "123456789012");
}

ZoneSnapshot SampleSnapshot() {
  ZoneSnapshot s;
  s.name = "web";
  s.size_bytes = 1 << 20;
  s.rate_bytes_per_sec = 512000;
  s.key_capacity = 6896;
  s.conn_capacity = 6896;
  s.proc_capacity = 1724;
  s.procs_reaped = 1;
  s.conns_reaped = 3;
  s.taken_ns = 100 * kNsPerSec;
  s.rules = {{0, "default", 512000, 25600, KeySpec()}};
  KeySnapshot a;
  a.key = "127.0.0.2";
  a.rule = "default";
  a.active = 4;
  a.connections = 4;
  a.share_bytes_per_sec = 128000;
  a.bytes_sent = 5000000;
  a.connections_served = 9;
  a.last_active_ns = 99 * kNsPerSec;
  KeySnapshot b;
  b.key = "127.0.0.3";
  b.rule = "default";
  b.active = 0;
  b.connections = 1;
  b.share_bytes_per_sec = 512000;
  b.bytes_sent = 9000000;
  b.connections_served = 1;
  b.last_active_ns = 88 * kNsPerSec;
  s.keys = {b, a};
  s.processes = {{0, 101, 3, true}, {1, 102, 2, false}};
  ConnSnapshot c;
  c.key = "127.0.0.2";
  c.peer = "127.0.0.2:4000";
  c.pid = 101;
  c.fd = 7;
  c.active = true;
  c.share_bytes_per_sec = 128000;
  c.bytes_sent = 1000;
  s.connections = {c};
  return s;
}

TEST(SelectKeysTest, SortsByActiveOrBytesAndCuts) {
  const ZoneSnapshot s = SampleSnapshot();
  std::vector<KeySnapshot> keys = SelectKeys(s, {});
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].key, "127.0.0.2") << "most active first";
  keys = SelectKeys(s, {0, SortBy::kBytes});
  EXPECT_EQ(keys[0].key, "127.0.0.3") << "most bytes first";
  keys = SelectKeys(s, {1, SortBy::kActive});
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].key, "127.0.0.2");
}

TEST(IdleSecondsTest, ZeroWhileSendingElseSinceLastActivity) {
  const ZoneSnapshot s = SampleSnapshot();
  EXPECT_EQ(IdleSeconds(s.keys[1], s.taken_ns), 0) << "active key";
  EXPECT_DOUBLE_EQ(IdleSeconds(s.keys[0], s.taken_ns), 12.0);
}

TEST(FormatStatTableTest, HumanFiguresAndTotals) {
  const std::string out = FormatStatTable(SampleSnapshot(), {});
  EXPECT_THAT(out, HasSubstr("zone web: 500 KiB/s per client"));
  EXPECT_THAT(out, HasSubstr("2 of 6896 keys"));
  EXPECT_THAT(out, HasSubstr("(1 sending), 1 processes"));
  EXPECT_THAT(out, HasSubstr("dead processes reaped 1 (3 connections)"));
  EXPECT_THAT(out, HasSubstr("125 KiB/s"));
  EXPECT_THAT(out, HasSubstr("4.8 MiB"));
  EXPECT_THAT(out, HasSubstr("12s ago"));
  EXPECT_LT(out.find("127.0.0.2"), out.find("127.0.0.3"));
}

TEST(FormatStatTableTest, OneRuleWithoutAFileShowsNoRuleColumn) {
  const std::string out = FormatStatTable(SampleSnapshot(), {});
  EXPECT_THAT(out, Not(HasSubstr("RULE")));
  EXPECT_THAT(out, Not(HasSubstr("rule default")));
}

TEST(FormatStatTableTest, RulesFromAFileGetTheirLinesAndAColumn) {
  ZoneSnapshot s = SampleSnapshot();
  KeySpec per24;
  per24.v4_prefix = 24;
  s.rules = {{0, "downloads", 512000, 25600, KeySpec()},
             {1, "api", 1 << 20, 0, per24}};
  s.keys[0].rule = "api";
  s.keys[1].rule = "downloads";
  const std::string out = FormatStatTable(s, {});
  EXPECT_THAT(out, HasSubstr("rule downloads: 500 KiB/s per client (key "
                             "peer)\n"));
  EXPECT_THAT(out, HasSubstr("rule api: 1 MiB/s per client (key peer/24"));
  EXPECT_THAT(out, HasSubstr("RULE            CLIENT"));
  EXPECT_THAT(out, HasSubstr("\ndownloads       127.0.0.2"));
  EXPECT_THAT(out, HasSubstr("\napi             127.0.0.3"));
  const std::string json = FormatStatJson(s, {});
  EXPECT_THAT(json, HasSubstr("\"rules\": [\n  {\"name\": \"downloads\", "
                              "\"rate\": 512000, \"burst\": 25600, "
                              "\"key\": \"peer\"},\n  {\"name\": \"api\""));
}

TEST(FormatStatTableTest, TopSaysHowManyMore) {
  const std::string out =
      FormatStatTable(SampleSnapshot(), {1, SortBy::kActive});
  EXPECT_THAT(out, HasSubstr("(1 more)"));
  EXPECT_THAT(out, Not(HasSubstr("127.0.0.3")));
}

TEST(FormatStatJsonTest, ExactFigures) {
  const std::string out = FormatStatJson(SampleSnapshot(), {});
  EXPECT_THAT(out, HasSubstr("\"zone\": \"web\""));
  EXPECT_THAT(out, HasSubstr("\"rate\": 512000"));
  EXPECT_THAT(out, HasSubstr("\"share_mode\": \"equal\""));
  EXPECT_THAT(out, HasSubstr("\"used\": {\"keys\": 2, \"connections\": 1, "
                             "\"active\": 1, \"processes\": 1}"));
  EXPECT_THAT(
      out, HasSubstr("{\"key\": \"127.0.0.2\", \"rule\": \"default\", "
                     "\"active\": 4, "
                     "\"connections\": 4, \"share\": 128000, "
                     "\"measured\": 0, \"level\": 0, \"debt\": 0, "
                     "\"boost\": null, \"packet_bytes\": 0, \"under_pace\": 0, "
                     "\"bytes\": 5000000, \"served\": 9, "
                     "\"idle_seconds\": 0.000, \"cluster\": null}"));
  EXPECT_THAT(out, HasSubstr("\"idle_seconds\": 12.000"));
  EXPECT_THAT(out, HasSubstr("],\n \"cluster\": null,\n \"rules\": ["));
  EXPECT_THAT(out, HasSubstr("{\"pid\": 102, \"connections\": 2, "
                             "\"alive\": false, \"watcher_cpu_pct\": 0.00, "
                             "\"watcher_stretch\": 0.00, \"shaped_calls\": 0, "
                             "\"shaper_syscalls\": 0, \"shaped_pieces\": 0}"));
  EXPECT_THAT(out, HasSubstr("\"peer\": \"127.0.0.2:4000\""));
}

TEST(FormatStatTest, ShaperCountsInEveryFormat) {
  ZoneSnapshot s = SampleSnapshot();
  s.processes[0].shaped_calls = 10;
  s.processes[0].shaper_syscalls = 12;
  s.processes[0].shaped_pieces = 300;
  s.processes[1].shaped_calls = 5;
  s.processes[1].shaper_syscalls = 5;
  s.processes[1].shaped_pieces = 20;
  EXPECT_THAT(FormatStatTable(s, {}),
              HasSubstr("packet shaper: 15 calls cut into 320 pieces, with 17 "
                        "system calls\n"));
  EXPECT_THAT(FormatStatJson(s, {}),
              HasSubstr("\"shaped_calls\": 10, \"shaper_syscalls\": 12, "
                        "\"shaped_pieces\": 300}"));
  const std::string prom = FormatStatPrometheus(s, {});
  EXPECT_THAT(prom,
              HasSubstr("# TYPE trafficrate_shaped_pieces_total counter\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_shaper_syscalls_total{zone=\"web\","
                              "pid=\"102\"} 5\n"));
}

// Budget mode: each process's watcher CPU and the stretch of its work.
ZoneSnapshot BudgetSnapshot() {
  ZoneSnapshot s = SampleSnapshot();
  s.share_mode = ShareMode::kBudget;
  s.processes[0].watcher_cpu_pct = 0.35;
  s.processes[0].watcher_stretch = 4.5;
  s.processes[1].watcher_cpu_pct = 0.1;
  s.processes[1].watcher_stretch = 1;
  return s;
}

TEST(FormatStatTest, WatcherCpuAndStretchInEveryFormat) {
  const ZoneSnapshot s = BudgetSnapshot();
  EXPECT_THAT(FormatStatTable(s, {}),
              HasSubstr("watchers use 0.45% of a core; their per-connection "
                        "work is spaced out up to 4.50x to stay within it\n"));
  EXPECT_THAT(FormatStatJson(s, {}),
              HasSubstr("{\"pid\": 101, \"connections\": 3, \"alive\": "
                        "true, \"watcher_cpu_pct\": 0.35, "
                        "\"watcher_stretch\": 4.50, "));
  const std::string prom = FormatStatPrometheus(s, {});
  EXPECT_THAT(prom, HasSubstr("trafficrate_watcher_cpu_percent{zone=\"web\","
                              "pid=\"101\"} 0.350\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_watcher_stretch{zone=\"web\","
                              "pid=\"102\"} 1\n"));
  // Not spaced out: the table says only what the watchers use.
  ZoneSnapshot calm = s;
  calm.processes[0].watcher_stretch = 1;
  const std::string table = FormatStatTable(calm, {});
  EXPECT_THAT(table, HasSubstr("watchers use 0.45% of a core\n"));
  // Equal mode has no watcher figures.
  EXPECT_THAT(FormatStatTable(SampleSnapshot(), {}),
              Not(HasSubstr("watchers use")));
  EXPECT_THAT(FormatStatPrometheus(SampleSnapshot(), {}),
              Not(HasSubstr("trafficrate_watcher_")));
}

TEST(FormatStatTest, LockTimeoutsInEveryFormat) {
  ZoneSnapshot s = SampleSnapshot();
  s.lock_timeouts = 7;
  s.lock_repairs = 2;
  EXPECT_THAT(FormatStatTable(s, {}),
              HasSubstr("lock repairs 2, lock timeouts 7\n"));
  EXPECT_THAT(FormatStatJson(s, {}),
              HasSubstr("\"lock_repairs\": 2, \"lock_timeouts\": 7, "));
  EXPECT_THAT(FormatStatPrometheus(s, {}),
              HasSubstr("trafficrate_lock_timeouts_total{zone=\"web\"} 7\n"));
}

// A zone whose cluster agent exchanges with one other host.
ZoneSnapshot ClusterSnapshotSample() {
  ZoneSnapshot s = SampleSnapshot();
  s.has_cluster = true;
  s.cluster.state = "connected";
  s.cluster.url = "redis://:***@10.0.0.5:6379/2";
  s.cluster.name = "fleet";
  s.cluster.host = "web1/web";
  s.cluster.pid = 101;
  s.cluster.peers = 1;
  s.cluster.rtt_us = 350;
  s.cluster.last_exchange_age_ns = 40'000'000;
  s.cluster.exchanges = 1200;
  s.cluster.failures = 3;
  s.cluster.fallbacks = 1;
  for (KeySnapshot& k : s.keys) {
    if (k.key != "127.0.0.2") continue;
    k.cluster_active = 6;
    k.cluster_hosts = 2;
    k.host_share_bytes_per_sec = 341333;
  }
  return s;
}

TEST(FormatStatTest, ClusterStateAndFleetFiguresInEveryFormat) {
  const ZoneSnapshot s = ClusterSnapshotSample();
  const std::string table = FormatStatTable(s, {});
  EXPECT_THAT(table,
              HasSubstr("cluster redis://:***@10.0.0.5:6379/2 (name fleet, "
                        "host web1/web): connected, pid 101, 1 peer, last "
                        "exchange now (round trip 0.3 ms); 1200 exchanges, 3 "
                        "failed, 1 fallbacks\n"));
  EXPECT_THAT(table, HasSubstr("FLEET ACTIVE HOSTS   HOST SHARE"));
  EXPECT_THAT(table, HasSubstr("      6     2    333 KiB/s"));
  const std::string json = FormatStatJson(s, {});
  EXPECT_THAT(json,
              HasSubstr("\"cluster\": {\"state\": \"connected\", \"url\": "
                        "\"redis://:***@10.0.0.5:6379/2\", \"name\": "
                        "\"fleet\", \"host\": \"web1/web\", \"pid\": 101, "
                        "\"peers\": 1, \"exchanges\": 1200, \"failures\": 3, "
                        "\"fallbacks\": 1, \"last_exchange_ms_ago\": 40.0, "
                        "\"last_rtt_ms\": 0.350}"));
  EXPECT_THAT(json, HasSubstr("\"cluster\": {\"active\": 6, \"hosts\": 2, "
                              "\"host_share\": 341333}}"));
  const std::string prom = FormatStatPrometheus(s, {});
  EXPECT_THAT(prom,
              HasSubstr("trafficrate_cluster_connected{zone=\"web\"} 1\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_cluster_peers{zone=\"web\"} 1\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_cluster_fallbacks_total{zone="
                              "\"web\"} 1\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_cluster_round_trip_seconds{zone="
                              "\"web\"} 0.000\n"));
  EXPECT_THAT(prom,
              HasSubstr("trafficrate_key_host_share_bytes_per_second{"
                        "zone=\"web\",key=\"127.0.0.2\",rule=\"default\"} "
                        "341333\n"));
  EXPECT_THAT(prom, HasSubstr("trafficrate_key_cluster_hosts{zone=\"web\","
                              "key=\"127.0.0.2\",rule=\"default\"} 2\n"));
  // Falling back: not connected; never exchanged: no age.
  ZoneSnapshot away = s;
  away.cluster.state = "fallback";
  away.cluster.last_exchange_age_ns = -1;
  EXPECT_THAT(FormatStatPrometheus(away, {}),
              HasSubstr("trafficrate_cluster_connected{zone=\"web\"} 0\n"));
  EXPECT_THAT(FormatStatJson(away, {}),
              HasSubstr("\"last_exchange_ms_ago\": null"));
  EXPECT_THAT(FormatStatTable(away, {}),
              HasSubstr(": fallback, pid 101, 1 peer, last exchange never"));
  // No cluster: none of it.
  EXPECT_THAT(FormatStatTable(SampleSnapshot(), {}),
              Not(HasSubstr("FLEET ACTIVE")));
  EXPECT_THAT(FormatStatPrometheus(SampleSnapshot(), {}),
              Not(HasSubstr("cluster")));
}

TEST(FormatStatPrometheusTest, EveryLineIsACommentOrASample) {
  const std::string out = FormatStatPrometheus(SampleSnapshot(), {});
  EXPECT_THAT(out, HasSubstr("trafficrate_rate_bytes_per_second{zone=\"web\"} "
                             "512000\n"));
  EXPECT_THAT(out, HasSubstr("# TYPE trafficrate_key_sent_bytes_total "
                             "counter\n"));
  EXPECT_THAT(out, HasSubstr("trafficrate_key_active_connections{zone=\"web\","
                             "key=\"127.0.0.2\",rule=\"default\"} 4\n"));
  EXPECT_THAT(out, HasSubstr("trafficrate_rule_rate_bytes_per_second{zone="
                             "\"web\",rule=\"default\"} 512000\n"));
  EXPECT_THAT(out, HasSubstr("trafficrate_processes{zone=\"web\"} 1\n"));
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    const bool comment = absl::StartsWith(line, "# HELP trafficrate_") ||
                         absl::StartsWith(line, "# TYPE trafficrate_");
    const bool sample = absl::StartsWith(line, "trafficrate_") &&
                        line.find("{zone=\"web\"") != absl::string_view::npos;
    EXPECT_TRUE(comment || sample) << line;
  }
}

TEST(TopTest, BarFillsAgainstTheLimit) {
  EXPECT_EQ(TopBar(0, 100, 10), "[..........]");
  EXPECT_EQ(TopBar(50, 100, 10), "[#####.....]");
  EXPECT_EQ(TopBar(100, 100, 10), "[##########]");
  EXPECT_EQ(TopBar(300, 100, 10), "[##########]") << "capped";
}

TEST(TopTest, RowsRateFromTheBytesSinceTheLastSnapshot) {
  ZoneSnapshot before = SampleSnapshot();
  ZoneSnapshot now = SampleSnapshot();
  now.taken_ns = before.taken_ns + 2 * kNsPerSec;
  now.keys[1].bytes_sent += 1024000;  // 127.0.0.2: 512000 B/s
  const std::vector<TopRow> rows = TopRows(now, &before, 10);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].key.key, "127.0.0.2");
  EXPECT_EQ(rows[0].bytes_per_sec, 512000u);
  EXPECT_EQ(rows[1].bytes_per_sec, 0u);
  EXPECT_EQ(TopRows(now, nullptr, 10)[0].bytes_per_sec, 0u);
  EXPECT_EQ(TopRows(now, &before, 1).size(), 1u);
}

TEST(TopTest, FrameShowsTheKeyAndItsBar) {
  ZoneSnapshot before = SampleSnapshot();
  ZoneSnapshot now = SampleSnapshot();
  now.taken_ns = before.taken_ns + kNsPerSec;
  now.keys[1].bytes_sent += 512000;
  const std::string frame = FormatTopFrame(now, &before, 110, 30);
  EXPECT_THAT(frame, HasSubstr("zone web - 500 KiB/s per client"));
  EXPECT_THAT(frame, HasSubstr("127.0.0.2"));
  // 110 columns leave a 16-character bar, full at the limit.
  EXPECT_THAT(frame, HasSubstr("500 KiB/s [" + std::string(16, '#') + "]"));
  EXPECT_THAT(frame, HasSubstr("MEASURED"));
  EXPECT_THAT(frame, HasSubstr("q: quit"));
}

TEST(TopTest, FrameShowsTheMeasuredRateInBudgetMode) {
  ZoneSnapshot before = SampleSnapshot();
  ZoneSnapshot now = SampleSnapshot();
  now.share_mode = ShareMode::kBudget;
  now.taken_ns = before.taken_ns + kNsPerSec;
  now.keys[1].bytes_sent += 512000;
  now.keys[1].measured_bytes_per_sec = 256000;
  const std::string frame = FormatTopFrame(now, &before, 110, 30);
  EXPECT_THAT(frame, HasSubstr("]   250 KiB/s"));
  // In equal mode there is no measurement: a dash.
  now.share_mode = ShareMode::kEqual;
  EXPECT_THAT(FormatTopFrame(now, &before, 110, 30),
              Not(HasSubstr("250 KiB/s")));
}

TEST(TopTest, FrameShowsTheClusterAndTheKeysOnEveryHost) {
  ZoneSnapshot before = ClusterSnapshotSample();
  ZoneSnapshot now = ClusterSnapshotSample();
  now.taken_ns = before.taken_ns + kNsPerSec;
  const std::string frame = FormatTopFrame(now, &before, 123, 30);
  EXPECT_THAT(frame, HasSubstr("\ncluster redis://:***@10.0.0.5:6379/2 (name "
                               "fleet, host web1/web): connected, pid 101"));
  EXPECT_THAT(frame, HasSubstr(" CONNS  FLEET HOSTS  SHARE/CONN\n"));
  // 127.0.0.2: 6 sending connections on 2 hosts; the bar keeps its 16
  // characters at 123 columns.
  EXPECT_THAT(frame, HasSubstr("]           -      4      4      6     2"));
  EXPECT_THAT(frame, HasSubstr("[" + std::string(16, '.') + "]"));
  // Without a cluster: neither.
  EXPECT_THAT(FormatTopFrame(SampleSnapshot(), nullptr, 110, 30),
              Not(AnyOf(HasSubstr("cluster"), HasSubstr("FLEET"))));
}

}  // namespace
}  // namespace trafficrate
