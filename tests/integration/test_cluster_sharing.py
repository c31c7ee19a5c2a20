"""Issue 13: one client's rate shared by the hosts of a fleet through Redis,
the split.

Each host's budget for the key is its weighted max-min share of the rate,
weighted by sending connections: 2 + 2 downloads get half the rate on each
host, 3 + 1 get 3/4 and 1/4 (rate/4 for every connection).

The fleet (two nginx hosts and Redis, shared by the module's tests) is
described in cluster_fleet.py; the fleet fixture of conftest.py makes it
whole before each test. Rates are measured by the clients over 8 s windows;
per-connection figures at rate/4 need the small_gso_packets fixture
(conftest.py, see test_dynamics.py): net.ipv4.tcp_tso_rtt_log = 0. Run with
-s to see the figures; they are in every assertion message too.
"""

import pytest

import harness
from cluster_fleet import (CLIENT, SETTLE_TIMEOUT_S, TARGET, TOTAL_TOLERANCE,
                           WARMUP_S, WINDOW_S, Traffic, describe, key_cluster,
                           settle, sleep_until, total)

CONNECTION_TOLERANCE = 0.05
SHARE_TOLERANCE = 0.10  # a host_share in stat vs its planned fraction

pytestmark = pytest.mark.usefixtures("small_gso_packets")


def test_two_downloads_on_each_host_share_the_clients_rate(fleet):
    """2 + 2 downloads: the client's total is the rate; each host shows the
    cluster connected with one peer, the key's 4 connections on 2 hosts and
    half the rate as its share; Redis holds no client address in clear."""
    a, b = hosts = fleet.hosts
    with Traffic([a, a, b, b], WARMUP_S + SETTLE_TIMEOUT_S + WINDOW_S + 5) as traffic:
        t0, _ = settle(traffic, hosts, 4, 2)
        t1 = t0 + WINDOW_S
        sleep_until(t0 + WINDOW_S / 2)
        stats = {host: host.stat() for host in hosts}
        names = fleet.redis.command("KEYS", "*")
        sleep_until(t1 + 0.05)
    m = traffic.measure(t0, t1, TARGET)
    report = "2 + 2 downloads, rate %d B/s for the fleet\n%s\nhost stats " \
        "mid-window:\n%s\nRedis keys: %s" % (TARGET, m.report(), describe(stats),
                                             names)
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    for host in hosts:
        stat = stats[host]
        cluster = stat["cluster"]
        assert cluster is not None, report
        assert cluster["state"] == "connected", report
        assert cluster["url"] == "redis://127.0.0.1:%d/0" % fleet.redis.port, report
        assert cluster["name"] == fleet.name, report
        assert cluster["host"] == host.host_id, report
        assert cluster["pid"] in host.processes(), report
        assert cluster["peers"] == 1, report
        assert cluster["exchanges"] > 0, report
        assert cluster["last_exchange_ms_ago"] < 1000, report
        assert isinstance(cluster["last_rtt_ms"], (int, float)), report
        kc = key_cluster(stat)
        assert kc["active"] == 4 and kc["hosts"] == 2, report
        assert harness.within(kc["host_share"], TARGET / 2, SHARE_TOLERANCE), report
    assert names, report
    assert not [n for n in names if CLIENT.encode() in n], report
    assert [n for n in names if fleet.name.encode() in n], report


def test_three_and_one_downloads_get_a_quarter_of_the_rate_each(fleet):
    """3 downloads on one host, 1 on the other: every connection gets rate/4
    (the hosts' shares 3/4 and 1/4 of the rate)."""
    a, b = hosts = fleet.hosts
    with Traffic([a, a, a, b], WARMUP_S + SETTLE_TIMEOUT_S + WINDOW_S + 5) as traffic:
        t0, _ = settle(traffic, hosts, 4, 2)
        t1 = t0 + WINDOW_S
        sleep_until(t0 + WINDOW_S / 2)
        stats = {host: host.stat() for host in hosts}
        sleep_until(t1 + 0.05)
    m = traffic.measure(t0, t1, TARGET)
    report = "3 + 1 downloads, rate %d B/s for the fleet, %d B/s each\n%s\n" \
        "host stats mid-window:\n%s" % (TARGET, TARGET / 4, m.report(),
                                        describe(stats))
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    for _, rate in m.per_download:
        assert harness.within(rate, TARGET / 4, CONNECTION_TOLERANCE), report
    for host, fraction in ((a, 0.75), (b, 0.25)):
        kc = key_cluster(stats[host])
        assert kc is not None and kc["active"] == 4 and kc["hosts"] == 2, report
        assert harness.within(kc["host_share"], TARGET * fraction,
                              SHARE_TOLERANCE), report

