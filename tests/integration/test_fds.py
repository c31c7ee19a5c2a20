"""Issue 3: the fd table follows a socket through dup, fcntl(F_DUPFD_CLOEXEC),
dup3, close_range, close and dup2, under LD_PRELOAD in a real server.

The threaded Python server with --fd-chain moves every accepted socket to a
new fd number through all of those calls and closes the original number
before it sends a byte; the connection must still be governed (the rate
holds) and counted once (stat), and it must leave the zone when the last fd
of it is closed.
"""

import time

import harness

RATE = "500k"
TARGET = 512000
CLIENT_A = "127.0.0.2"  # 4 downloads
CLIENT_B = "127.0.0.3"  # 1 download
PLAN = [CLIENT_A] * 4 + [CLIENT_B]


def test_socket_moved_to_another_fd_is_governed_and_counted_once(
        servers, lib_env, zone):
    server = servers.python(env=lib_env(RATE), mode="thread", fd_chain=True)
    dset = harness.DownloadSet(server.port, PLAN, duration=10.6).start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 4.0 - time.monotonic()))
        stat_a = harness.key_stat(zone, CLIENT_A)
        stat_b = harness.key_stat(zone, CLIENT_B)
        time.sleep(max(0.0, started + 10.2 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 10.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    report = "%s\n%s\nstat: %s %s" % (server.title, m.report(), stat_a, stat_b)
    print("\n" + report)
    assert not dset.errors(), report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, 0.05), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, 0.05), report
    assert (stat_a["connections"], stat_a["active"]) == (4, 4), report
    assert (stat_b["connections"], stat_b["active"]) == (1, 1), report
    gone = harness.wait_for(
        lambda: harness.key_stat(zone, CLIENT_A)["connections"] == 0, 3.0)
    assert gone, "connections still registered after the clients closed: %s" % (
        harness.stat_json(zone),)
