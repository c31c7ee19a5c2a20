"""Issue 7: the shared byte budget (TRAFFICRATE_SHARE=budget), the key's
level as stat shows it.

A cap that does not bind is lifted: while a client is far below its rate
the key's level is the whole rate, not rate/active; with four downloads it
is a quarter of the rate. `trafficrate stat` shows the key's measured rate,
level and debt, and each watcher's CPU and stretch, in every format.

Real nginx (2 workers, `listen ... reuseport`) under the library, rate 500k
(512000 B/s) per client IP unless a test says otherwise, real clients bound
to 127.0.0.2, in the private namespace of conftest.py (lo MTU 1500), with
net.ipv4.tcp_tso_rtt_log = 0 for the whole module (the small_gso_packets
fixture, see test_dynamics.py). Rates are measured by the clients; windows
are 8 s after a 2 s warm-up. Run with -s to see the figures; they are in
every assertion message too. (Shared helpers in budget_common.py.)
"""

import statistics
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import harness
from budget_clients import KeepaliveRequests
from budget_common import (CLIENT, TARGET, WARMUP_S, WINDOW_S, key_entry, nginx2,
                           ratio_text, share_env, sleep_until, stop_all, window_of)

pytestmark = pytest.mark.usefixtures("small_gso_packets")


# --------------------------------------------------- a cap that does not bind

def test_level_is_the_whole_rate_while_the_client_is_far_below_it(servers, lib_env,
                                                                  zone):
    """Rate 1000m; 4 keep-alive connections of one client, each doing
    sequential 4 KiB requests as fast as it can (~100 MB/s in all): stat
    shows the key's level equal to the whole rate, not rate/active, each
    sending connection paced at it, and the measured rate far below it."""
    rate = harness.parse_rate("1000m")
    # nginx closes a keep-alive connection after 1000 requests by default.
    server, _ = nginx2(servers, share_env(lib_env, "budget", rate="1000m"),
                       extra_http="  keepalive_requests 1000000;")
    start = time.monotonic() + 0.05
    loops = [KeepaliveRequests(server.port, CLIENT, size=4096, start_at=start,
                               stop_at=start + 5.0, max_requests=200000)
             for _ in range(4)]
    for loop in loops:
        loop.start()
    samples = []
    try:
        sleep_until(start + 1.5)
        deadline = start + 4.5
        while time.monotonic() < deadline and len(samples) < 20:
            entry, conns, _ = key_entry(zone)
            if entry is not None:
                samples.append((entry, [c for c in conns if c["active"]]))
            time.sleep(0.2)
    finally:
        stop_all(*loops)
    busy = [(e, c) for e, c in samples if e["active"] >= 2]
    lines = ["  active %d level %s measured %s debt %s share %d; sending connections' "
             "shares %s" % (e["active"], e.get("level"), e.get("measured"), e.get("debt"),
                            e["share"], sorted({x["share"] for x in c}))
             for e, c in samples]
    report = ("%s, rate %d B/s, client %s: 4 keep-alive connections of sequential "
              "4 KiB requests\nrequests %s in 5 s; errors %s\nstat samples:\n%s"
              % (server.title, rate, CLIENT, [l.requests for l in loops],
                 [l.error for l in loops if l.error], "\n".join(lines)))
    print("\n" + report)
    assert not [l for l in loops if l.error], report
    assert all(l.requests >= 100 for l in loops), report
    # rate/active would differ from the rate: more than one was sending.
    assert len(busy) >= 5, report
    for e, conns in busy:
        assert "level" in e and "measured" in e, report
        assert e["level"] == rate, report
        # This client manages ~0.1x of 1000m here (~26 MB/s a connection);
        # a quarter is what rate/active would allow each of 4.
        assert 0 < e["measured"] < rate / 4, report
        assert all(c["share"] == rate for c in conns), report


def test_level_is_a_quarter_of_the_rate_with_four_downloads(servers, lib_env, zone):
    """Rate 500k, 4 downloads of one client: sampled over 8 s after the
    warm-up, stat's level is rate/4 (+-10%, median), its measured rate within
    5% of the rate (median), its debt never negative, and the client's own
    total within 5%."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * 4,
                               duration=WARMUP_S + WINDOW_S + 1.0).start()
    samples = []
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0)
        while time.monotonic() < t1 and len(samples) < 40:
            entry, _, _ = key_entry(zone)
            if entry is not None:
                samples.append(entry)
            time.sleep(0.4)
        sleep_until(t1 + 0.05)
    finally:
        stop_all(dset)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    report = ("%s, client %s: 4 downloads\n%s\nclient total %s\nstat samples "
              "(active, level, measured, debt):\n%s"
              % (server.title, CLIENT, m.report(), ratio_text(total),
                 "\n".join("  %s %s %s %s" % (e["active"], e.get("level"),
                                             e.get("measured"), e.get("debt"))
                           for e in samples)))
    print("\n" + report)
    assert not dset.errors(), report
    assert len(samples) >= 10 and all(e["active"] == 4 for e in samples), report
    assert all("level" in e and "measured" in e and "debt" in e for e in samples), report
    level = statistics.median(e["level"] for e in samples)
    measured = statistics.median(e["measured"] for e in samples)
    assert harness.within(level, TARGET / 4, 0.10), report
    assert harness.within(measured, TARGET, 0.05), report
    assert all(e["debt"] >= 0 for e in samples), report
    assert harness.within(total, TARGET, 0.05), report


# ------------------------------------------------- stat in every format

def test_stat_shows_measured_level_and_debt_in_every_format(servers, lib_env, zone,
                                                            cli):
    """4 downloads: stat --json's key has measured, level and debt (numbers;
    level within (0, rate], debt >= 0, measured > 0); the table has MEASURED,
    LEVEL and DEBT columns; Prometheus has the key's measured, level and debt
    metrics. Each worker's watcher shows its CPU (under 1% of a core for 4
    connections) and stretch (1: nothing spaced out) in every format."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=12.0).start()
    try:
        assert dset.wait_started(10.0), dset.errors()
        counted = harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["active"] == 4, 5.0)
        time.sleep(2.0)
        entry, _, doc = key_entry(zone)
        table = harness.run_cli("stat", "--zone", zone)
        prom = harness.run_cli("stat", "--zone", zone, "--prometheus")
    finally:
        stop_all(dset)
    report = "json: %s\ntable:\n%s%s\nprometheus:\n%s%s" % (
        doc, table.stdout, table.stderr, prom.stdout, prom.stderr)
    print("\n" + report)
    assert counted and entry is not None, report
    for field in ("measured", "level", "debt"):
        assert isinstance(entry.get(field), (int, float)), (field, report)
    assert 0 < entry["level"] <= TARGET, report
    assert entry["debt"] >= 0 and entry["measured"] > 0, report
    assert table.returncode == 0, report
    header = next((l for l in table.stdout.splitlines() if l.startswith("CLIENT")), "")
    assert all(col in header.split() for col in ("MEASURED", "LEVEL", "DEBT")), report
    assert prom.returncode == 0, report
    samples = {}
    for family in text_string_to_metric_families(prom.stdout):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("key"))] = sample.value
    for name in ("trafficrate_key_measured_bytes_per_second",
                 "trafficrate_key_level_bytes_per_second", "trafficrate_key_debt_bytes"):
        assert (name, CLIENT) in samples, (name, report)
    assert samples[("trafficrate_key_debt_bytes", CLIENT)] >= 0, report
    # The watchers of the workers that serve the downloads (nginx may give
    # all 4 to one): in JSON and Prometheus, and a line in the table.
    procs = [p for p in doc["processes"] if p["connections"] > 0]
    assert procs, report
    for p in procs:
        assert p["watcher_stretch"] == 1.0, report
        assert 0 <= p["watcher_cpu_pct"] < 1.0, report
    watchers = {}
    for family in text_string_to_metric_families(prom.stdout):
        for sample in family.samples:
            if sample.name in ("trafficrate_watcher_cpu_percent",
                               "trafficrate_watcher_stretch"):
                watchers[(sample.name, int(sample.labels["pid"]))] = sample.value
    for p in procs:
        assert watchers.get(("trafficrate_watcher_stretch", p["pid"])) == 1.0, report
        assert ("trafficrate_watcher_cpu_percent", p["pid"]) in watchers, report
    assert any(l.startswith("watchers use ") and "% of a core" in l
               for l in table.stdout.splitlines()), report
