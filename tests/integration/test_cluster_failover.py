"""Issue 13: one client's rate shared by the hosts of a fleet through Redis,
when Redis, a host or the exchange's holder fails.

Redis away (killed, or stopped for longer than the 200 ms an exchange may
take): each host falls back, its shares moving to the full local rate over
the decay (1 s), so the two hosts send twice the rate; Redis back: they
share it again. A host that dies leaves Redis 600 ms after its last
exchange and the other takes the whole rate. One process per zone holds the
exchange (a lease in the zone); when it dies another takes it over.

The fleet (two nginx hosts and Redis, shared by the module's tests) is
described in cluster_fleet.py; the fleet fixture of conftest.py makes it
whole again before each test (Redis started again if a test killed it, a
host whose nginx a test killed started afresh in its zone). Rates are
measured by the clients over 8 s windows, with the small_gso_packets
fixture (conftest.py, see test_dynamics.py): net.ipv4.tcp_tso_rtt_log = 0.
Run with -s to see the figures; they are in every assertion message too.
"""

import json
import signal
import time

import pytest

import harness
from cluster_fleet import (SETTLE_S, SETTLE_TIMEOUT_S, TARGET, TOTAL_TOLERANCE,
                           WARMUP_S, WINDOW_S, Traffic, describe, host_share,
                           key_cluster, kill_host, settle, sleep_until, state, total,
                           wait_stats)

OTHER_CLIENT = "127.0.0.3"  # requests that start another worker's watcher
FALLBACK_WITHIN_S = 3.0  # Redis killed -> both hosts "fallback"
FULL_RATE_AFTER_S = 2.0  # Redis killed -> full local rate (decay 1 s + a tick)
RECONNECT_WITHIN_S = 2.0  # Redis back -> both "connected", shared again
DEAD_HOST_WITHIN_S = 1.0  # a host killed -> the other's share >= 0.95 x rate
TAKEOVER_WITHIN_S = 3.0  # the exchange's holder killed -> another holds it
# ... and exchanges before the host's entry in Redis expires: 600 ms after
# the last exchange, up to a tick (100 ms) before the kill. The next holder
# comes at the next watcher poll (every 250 ms), plus the stat polling here.
TAKEOVER_BEFORE_EXPIRY_S = 0.5

pytestmark = pytest.mark.usefixtures("small_gso_packets")


def test_a_stalled_redis_means_fallback_and_connected_again_when_it_answers(fleet):
    """Redis stopped (SIGSTOP: connections open, no replies, so exchanges
    time out after 200 ms): both hosts fall back within 3 s, counting
    failures; resumed (SIGCONT): both connected again within 2 s."""
    a, b = hosts = fleet.hosts
    with Traffic([a, b], WARMUP_S + SETTLE_TIMEOUT_S + 8) as traffic:
        settle(traffic, hosts, 2, 2)
        before = {host: host.stat()["cluster"] for host in hosts}
        try:
            assert fleet.redis.signal(signal.SIGSTOP), fleet.redis.describe()
            stalled = time.monotonic()
            fell, stats = wait_stats(
                hosts, lambda st: all(state(st[h]) == "fallback" for h in hosts),
                FALLBACK_WITHIN_S)
        finally:
            fleet.redis.signal(signal.SIGCONT)
        resumed = time.monotonic()
        back, stats_back = wait_stats(
            hosts, lambda st: all(state(st[h]) == "connected" for h in hosts),
            RECONNECT_WITHIN_S)
    report = "Redis stopped, then resumed\nbefore: %s\nafter %s s stopped:\n%s\n" \
        "after %s s resumed:\n%s\n%s" % (
            json.dumps([before[h] for h in hosts], sort_keys=True),
            None if fell is None else "%.2f" % (fell - stalled), describe(stats),
            None if back is None else "%.2f" % (back - resumed),
            describe(stats_back), "\n".join(traffic.errors()))
    print("\n" + report)
    assert fell is not None, report
    for host in hosts:
        cluster = stats[host]["cluster"]
        assert cluster["failures"] > before[host]["failures"], report
        assert cluster["fallbacks"] > before[host]["fallbacks"], report
    assert back is not None, report
    assert not traffic.errors(), report


def test_another_process_takes_over_the_exchange_when_its_holder_dies(fleet):
    """SIGKILL the process that holds host a's exchange, once another worker
    of host a has served a request (a process takes part in its zone, and may
    take the exchange over, from its first connection on): that worker holds
    the exchange within 0.5 s, connected, exchanging again: before host a's
    figures in Redis expire (a dead holder's lease is free at the next
    watcher poll, not when it runs out), so host b counts host a as a peer
    all along, until 1 s after."""
    a, b = hosts = fleet.hosts
    with Traffic([a, b], WARMUP_S + SETTLE_TIMEOUT_S + TAKEOVER_WITHIN_S + 8) \
            as traffic:
        _, stats = settle(traffic, hosts, 2, 2)
        holder = stats[a]["cluster"]["pid"]
        family = a.processes()
        assert holder in family, describe(stats)

        def others(st):
            return [p["pid"] for p in st[a]["processes"]
                    if p["alive"] and p["pid"] != holder]
        for _ in range(40):  # requests spread over the workers (reuseport)
            if others({a: a.stat()}):
                break
            harness.http_get(a.server.port, source=OTHER_CLIENT, host=a.addr)
        stats = {a: a.stat()}
        assert others(stats), "no other process of host a registered:\n%s" % (
            describe(stats))
        assert harness.kill_pid(holder, signal.SIGKILL)
        killed = time.monotonic()
        seen_by_b = []  # (s after the kill, host b's peers)

        def watch_b(st):
            seen_by_b.append((round(time.monotonic() - killed, 2),
                              (st[b].get("cluster") or {}).get("peers")))
            return False

        def taken_over(st):
            watch_b(st)
            cluster = st[a].get("cluster")
            return (cluster is not None and cluster["pid"] != holder
                    and harness.pid_alive(cluster["pid"])
                    and cluster["state"] == "connected"
                    and cluster["last_exchange_ms_ago"] < 500)
        seen, after = wait_stats(hosts, taken_over, TAKEOVER_WITHIN_S)
        if seen is not None:
            wait_stats(hosts, watch_b, 1.0)
    gone = [v for v in seen_by_b if v[1] != 1]
    report = ("host a's exchange holder pid %d (of %s) killed; after %s s:\n%s\n"
              "host b's peers not 1 at (s after the kill, peers): %s of %d" % (
                  holder, sorted(family),
                  None if seen is None else "%.2f" % (seen - killed),
                  describe(after), gone, len(seen_by_b)))
    print("\n" + report)
    assert seen is not None, report
    new = after[a]["cluster"]["pid"]
    assert new in a.processes() | family, report
    assert seen - killed < TAKEOVER_BEFORE_EXPIRY_S, report
    assert not gone, report


def test_hosts_fall_back_to_the_full_rate_without_redis_and_share_again(fleet):
    """2 + 2 downloads, Redis killed: both hosts in fallback within 3 s, and
    once the decay (1 s) has run each host sends the full rate (the fleet
    twice the rate); Redis started again on its port: both connected within
    2 s with at most 0.6 x rate each, and the total is the rate again."""
    a, b = hosts = fleet.hosts
    duration = (WARMUP_S + SETTLE_TIMEOUT_S + FULL_RATE_AFTER_S + WINDOW_S
                + RECONNECT_WITHIN_S + SETTLE_S + WINDOW_S + 10)
    with Traffic([a, a, b, b], duration) as traffic:
        settle(traffic, hosts, 4, 2)
        assert fleet.redis.kill(), fleet.redis.describe()
        killed = time.monotonic()
        fell, stats_fell = wait_stats(
            hosts, lambda st: all(state(st[h]) == "fallback" and
                                  st[h]["cluster"]["fallbacks"] >= 1
                                  for h in hosts), FALLBACK_WITHIN_S)
        report = "2 + 2 downloads, Redis killed; after %s s:\n%s" % (
            None if fell is None else "%.2f" % (fell - killed),
            describe(stats_fell))
        assert fell is not None, report
        t0 = max(time.monotonic(), killed + FULL_RATE_AFTER_S)
        t1 = t0 + WINDOW_S
        sleep_until(t0)
        stats_full = {host: host.stat() for host in hosts}
        sleep_until(t1 + 0.05)
        fallback = traffic.measure(t0, t1, 2 * TARGET)
        report += "\nin fallback, from %.2f s after the kill:\n%s\n%s" % (
            t0 - killed, describe(stats_full), fallback.report())

        fleet.redis.start()
        restarted = time.monotonic()
        back, stats_back = wait_stats(
            hosts, lambda st: all(state(st[h]) == "connected" and
                                  host_share(st[h]) is not None and
                                  host_share(st[h]) <= 0.6 * TARGET
                                  for h in hosts), RECONNECT_WITHIN_S)
        report += "\nRedis started again (pid %d, port %d); after %s s:\n%s" % (
            fleet.redis.pid, fleet.redis.port,
            None if back is None else "%.2f" % (back - restarted),
            describe(stats_back))
        assert back is not None, report
        t2 = back + SETTLE_S
        t3 = t2 + WINDOW_S
        sleep_until(t3 + 0.05)
    shared = traffic.measure(t2, t3, TARGET)
    report += "\nshared again:\n%s\n%s" % (shared.report(),
                                           "\n".join(traffic.errors()))
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(fallback), 2 * TARGET, TOTAL_TOLERANCE), report
    for host in hosts:
        assert harness.within(total(traffic.measure(t0, t1, downloads=traffic.on(host))),
                              TARGET, TOTAL_TOLERANCE), report
        assert host_share(stats_full[host]) >= 0.95 * TARGET, report
    assert harness.within(total(shared), TARGET, TOTAL_TOLERANCE), report


def test_a_dead_hosts_share_goes_to_the_other_host_within_a_second(fleet):
    """2 + 2 downloads, host b's nginx SIGKILLed (master and workers): within
    1 s host a's share of the key is the whole rate (b's entry in Redis
    expired), and a's 2 downloads get the rate; a then sees no peer."""
    a, b = hosts = fleet.hosts
    duration = (WARMUP_S + SETTLE_TIMEOUT_S + DEAD_HOST_WITHIN_S + SETTLE_S
                + WINDOW_S + 5)
    with Traffic([a, a, b, b], duration) as traffic:
        settle(traffic, hosts, 4, 2)
        killed = kill_host(b)
        seen, stats = wait_stats(
            [a], lambda st: (host_share(st[a]) or 0) >= 0.95 * TARGET,
            DEAD_HOST_WITHIN_S)
        report = "2 + 2 downloads, host b killed; host a after %s s:\n%s" % (
            None if seen is None else "%.2f" % (seen - killed), describe(stats))
        assert seen is not None and seen - killed <= DEAD_HOST_WITHIN_S, report
        t0 = seen + SETTLE_S
        t1 = t0 + WINDOW_S
        sleep_until(t1 + 0.05)
        after = {a: a.stat()}
    m = traffic.measure(t0, t1, TARGET, downloads=traffic.on(a))
    report += "\nhost a's downloads:\n%s\nhost a after the window:\n%s" % (
        m.report(), describe(after))
    print("\n" + report)
    assert not traffic.errors(traffic.on(a)), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    cluster, kc = after[a]["cluster"], key_cluster(after[a])
    assert cluster["state"] == "connected" and cluster["peers"] == 0, report
    assert kc["active"] == 2 and kc["hosts"] == 1, report
