"""Which connections are governed, and from when: TRAFFICRATE_PORTS (only
connections accepted on these local ports), TRAFFICRATE_EXEMPT (clients never
governed) and TRAFFICRATE_AFTER (bytes a connection sends before it is paced).

Real nginx (2 workers, sendfile on) under the library at rate 500k (512000
B/s per client IP), in the private network namespace of conftest.py; each
test has its own zone. Rates are measured by the clients (harness.Download);
run with -s to see the figures, which are in every assertion message too.
"""

import time

import harness

RATE = "500k"
TARGET = 512000  # B/s per client IP
TOLERANCE = 0.05
UNLIMITED_FACTOR = 20  # "unpaced" means at least this many times TARGET
CLIENT = "127.0.0.2"
EXEMPT = "127.0.0.3"
AFTER = "2m"
AFTER_BYTES = 2 << 20


def test_ports_governs_only_connections_on_the_listed_port(servers, lib_env):
    governed, other = harness.free_port(), harness.free_port()
    while other == governed:
        other = harness.free_port()
    server = servers.nginx(env=lib_env(RATE, PORTS=governed), workers=2,
                           port=governed, extra_ports=[other])
    paced = harness.run_downloads(governed, [CLIENT], warmup=2.0, window=6.0,
                                  target=TARGET)
    free = harness.run_downloads(other, [CLIENT], warmup=0.5, window=2.0,
                                 repeat=True)
    report = "%s, PORTS=%d\nport %d (governed):\n%s\nport %d (not governed):\n%s" % (
        server.title, governed, governed, paced.report(), other, free.report())
    print("\n" + report)
    assert not [d for d in paced.downloads + free.downloads if d.error], report
    assert harness.within(paced.source_rate(CLIENT), TARGET, TOLERANCE), report
    assert free.source_rate(CLIENT) > UNLIMITED_FACTOR * TARGET, report
    assert server.trafficrate_lines() == [], server.describe()


def test_exempt_client_is_unlimited_and_never_registered(servers, lib_env, zone):
    server = servers.nginx(env=lib_env(RATE, EXEMPT=EXEMPT), workers=2)
    # repeat: the unlimited download may finish the file and start again.
    dset = harness.DownloadSet(server.port, [CLIENT, CLIENT, EXEMPT],
                               duration=9.5, repeat=True).start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 3.0 - time.monotonic()))
        keys = harness.stat_json(zone)["keys"]
        time.sleep(max(0.0, started + 9.1 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 9.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    names = sorted(k["key"] for k in keys)
    report = "%s, EXEMPT=%s\n%s\nstat keys: %s" % (
        server.title, EXEMPT, m.report(), names)
    print("\n" + report)
    assert not dset.errors(), report
    assert harness.within(m.source_rate(CLIENT), TARGET, TOLERANCE), report
    assert m.source_rate(EXEMPT) > UNLIMITED_FACTOR * TARGET, report
    assert EXEMPT not in names, report
    assert [k["connections"] for k in keys if k["key"] == CLIENT] == [2], report


def test_after_sends_the_first_bytes_unpaced_then_paces(servers, lib_env):
    server = servers.nginx(env=lib_env(RATE, AFTER=AFTER), workers=2)
    dset = harness.DownloadSet(server.port, [CLIENT], duration=9.5).start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        d = dset.downloads[0]
        harness.wait_for(lambda: d.first_byte_at is not None, 5.0)
        time.sleep(max(0.0, started + 9.1 - time.monotonic()))
    finally:
        dset.stop()
        dset.join(5.0)
    assert d.first_byte_at is not None, dset.errors()
    reached = [t for t, n in zip(d.times, d.totals) if n >= AFTER_BYTES]
    burst_s = reached[0] - d.connected_at if reached else float("inf")
    m = dset.measure(started + 3.0, started + 9.0, TARGET)
    report = "%s, AFTER=%s\nfirst %d bytes in %.3f s; %d bytes after 1 s\n%s" % (
        server.title, AFTER, AFTER_BYTES, burst_s, d.bytes_at(started + 1.0),
        m.report())
    print("\n" + report)
    assert not dset.errors(), report
    assert burst_s < 1.0, report
    assert harness.within(m.source_rate(CLIENT), TARGET, TOLERANCE), report
