"""Issue 9, IPv6 end to end: nginx listening on [::1] and on a dual-stack
[::] socket, clients from IPv6 addresses added to the namespace's loopback
and IPv4 clients arriving v4-mapped; TRAFFICRATE_KEY=peer/N,M and
TRAFFICRATE_EXEMPT with IPv6 networks; the CLI's table, JSON and Prometheus
output with IPv6 keys.
"""

import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import harness

RATE = "500k"
TARGET = 512000
V6_HOST = "::1"
V6_A = "fd00::2"         # 4 downloads
V6_B = "fd00::3"         # 1 download; the same /64 as V6_A
V6_OTHER = "fd00:0:0:1::2"  # another /64
V4_CLIENT = "127.0.0.2"  # through the dual-stack listener, v4-mapped


@pytest.fixture(scope="module", autouse=True)
def ipv6_addresses(test_namespace):
    """The client addresses, on the namespace's loopback (nodad: usable at
    once)."""
    for address in (V6_A, V6_B, V6_OTHER):
        subprocess.run(["ip", "-6", "addr", "add", address + "/128", "dev", "lo",
                        "nodad"], check=True, capture_output=True)
    yield
    for address in (V6_A, V6_B, V6_OTHER):
        subprocess.run(["ip", "-6", "addr", "del", address + "/128", "dev", "lo"],
                       capture_output=True)


def v6_nginx(servers, env):
    """nginx (2 workers) on 127.0.0.1:port (for the harness's readiness
    check), on [::1]:v6_port and on a dual-stack [::]:dual_port."""
    v6_port, dual_port = harness.free_port(), harness.free_port()
    server = servers.nginx(
        env=env, workers=2, start=False,
        extra_server="    listen [::1]:%d;\n    listen [::]:%d ipv6only=off;" % (
            v6_port, dual_port))
    server.v6_port, server.dual_port = v6_port, dual_port
    server.title += ", also [::1]:%d and [::]:%d dual-stack" % (v6_port, dual_port)
    return server.start()


def run_sets(zone, sets, window=8.0, warmup=2.0):
    """Starts the download sets together; returns their measurements over
    one common window, and what `trafficrate stat` showed in the middle of
    it: (measurements, JSON, table, Prometheus text)."""
    for dset in sets:
        dset.start()
    try:
        started = max(dset.wait_started(10.0) or 1e18 for dset in sets)
        assert started < 1e17, [dset.errors() for dset in sets]
        time.sleep(max(0.0, started + warmup + window / 2 - time.monotonic()))
        stat = harness.stat_json(zone)
        table = harness.run_cli("stat", "--zone", zone)
        prom = harness.run_cli("stat", "--zone", zone, "--prometheus")
        time.sleep(max(0.0, started + warmup + window + 0.2 - time.monotonic()))
        measures = [dset.measure(started + warmup, started + warmup + window,
                                 TARGET) for dset in sets]
    finally:
        for dset in sets:
            dset.stop()
        for dset in sets:
            dset.join(5.0)
    return measures, stat, table, prom


def test_ipv6_and_v4_mapped_clients_each_get_the_rate(servers, lib_env, zone):
    server = v6_nginx(servers, lib_env(RATE))
    v6 = harness.DownloadSet(server.v6_port, [V6_A] * 4 + [V6_B], host=V6_HOST,
                             duration=12.0)
    dual = harness.DownloadSet(server.dual_port, [V4_CLIENT] * 2, duration=12.0)
    (m6, m4), stat, table, prom = run_sets(zone, [v6, dual])
    report = "%s\n%s\n%s\nstat: %s\ntable:\n%s" % (
        server.title, m6.report(), m4.report(), stat, table.stdout)
    print("\n" + report)
    assert not v6.errors() and not dual.errors(), report
    assert harness.within(m6.source_rate(V6_A), TARGET, 0.05), report
    assert harness.within(m6.source_rate(V6_B), TARGET, 0.05), report
    assert harness.within(m4.source_rate(V4_CLIENT), TARGET, 0.05), report
    keys = {k["key"]: k for k in stat["keys"]}
    assert (keys[V6_A]["connections"], keys[V6_A]["active"]) == (4, 4), report
    assert keys[V6_B]["connections"] == 1, report
    # The IPv4 client through the dual-stack socket: its key is the IPv4
    # address, not the v4-mapped IPv6 one.
    assert keys[V4_CLIENT]["connections"] == 2, report
    assert not any(k.startswith("::ffff:") for k in keys), report
    assert table.returncode == 0 and V6_A in table.stdout, report
    samples = {s.labels.get("key"): s.value
               for family in text_string_to_metric_families(prom.stdout)
               for s in family.samples
               if s.name == "trafficrate_key_active_connections"}
    assert samples.get(V6_A) == 4 and samples.get(V4_CLIENT) == 2, (
        prom.stdout[:2000])


def test_ipv6_prefix_key_and_exempt_network(servers, lib_env, zone):
    server = v6_nginx(servers, lib_env(RATE, KEY="peer/24,64",
                                       EXEMPT="fd00:0:0:1::/64"))
    shared = harness.DownloadSet(server.v6_port, [V6_A] * 2 + [V6_B] * 2,
                                 host=V6_HOST, duration=12.0)
    exempt = harness.DownloadSet(server.v6_port, [V6_OTHER], host=V6_HOST,
                                 duration=12.0)
    (ms, me), stat, _, _ = run_sets(zone, [shared, exempt])
    report = "%s\n%s\n%s\nstat: %s" % (server.title, ms.report(), me.report(),
                                      stat)
    print("\n" + report)
    assert not shared.errors() and not exempt.errors(), report
    # Both addresses are in fd00::/64: one key, one rate between them.
    total = ms.source_rate(V6_A) + ms.source_rate(V6_B)
    assert harness.within(total, TARGET, 0.05), report
    keys = {k["key"]: k for k in stat["keys"]}
    assert set(keys) == {"fd00::/64"}, report
    assert keys["fd00::/64"]["connections"] == 4, report
    # The exempt network is never registered and runs unpaced: over its
    # whole download, which may well end (the 256 MiB file) before the window.
    d = exempt.downloads[0]
    end = d.finished_at if d.eof else d.times[-1]
    unpaced = d.total / max(end - d.first_byte_at, 1e-3)
    assert unpaced > 4 * TARGET, "%.0f B/s\n%s" % (unpaced, report)
