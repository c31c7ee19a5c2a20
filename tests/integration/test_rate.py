"""Issue 2: all connections of one client IP share TRAFFICRATE_RATE.

Rates are measured by the clients (body bytes received, time.monotonic()),
in a private network namespace with a 1500-byte loopback (see conftest.py).
Run with -s to see the per-connection figures; they are also in every
assertion message.
"""

import pytest

import harness

RATE = "500k"
TARGET = 512000  # B/s per client IP
CLIENT_A = "127.0.0.2"  # 4 parallel downloads
CLIENT_B = "127.0.0.3"  # 1 download
PLAN = [CLIENT_A] * 4 + [CLIENT_B]
WARMUP_S = 2.0
WINDOW_S = 8.0
TOTAL_TOLERANCE = 0.05  # a client's aggregate
CONNECTION_TOLERANCE = 0.25  # each of CLIENT_A's connections vs TARGET / 4
UNLIMITED_FACTOR = 20  # "unpaced" means at least this many times TARGET


def check_clients_share_rate(server):
    m = harness.run_downloads(server.port, PLAN, warmup=WARMUP_S, window=WINDOW_S,
                              target=TARGET)
    report = "%s\n%s" % (server.title, m.report())
    print("\n" + report)
    assert not [d for d in m.downloads if d.error], report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, TOTAL_TOLERANCE), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, TOTAL_TOLERANCE), report
    for rate in m.download_rates(CLIENT_A):
        assert harness.within(rate, TARGET / 4, CONNECTION_TOLERANCE), report


def check_unlimited(server):
    m = harness.run_downloads(server.port, [CLIENT_A], warmup=0.5, window=2.0,
                              repeat=True)
    report = "%s\n%s" % (server.title, m.report())
    print("\n" + report)
    assert not [d for d in m.downloads if d.error], report
    assert m.source_rate(CLIENT_A) > UNLIMITED_FACTOR * TARGET, report


def check_one_rate_complaint(server):
    lines = server.trafficrate_lines()
    assert len([l for l in lines if "TRAFFICRATE_RATE" in l]) == 1, server.describe()


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile-on", "sendfile-off"])
def test_nginx_connections_of_a_client_share_its_rate(servers, lib_env, sendfile):
    server = servers.nginx(env=lib_env(RATE), workers=2, sendfile=sendfile)
    check_clients_share_rate(server)


def test_threaded_python_server_connections_of_a_client_share_its_rate(servers, lib_env):
    server = servers.python(env=lib_env(RATE), mode="thread")
    check_clients_share_rate(server)


def test_rate_unset_leaves_downloads_unlimited(servers, lib_env):
    server = servers.nginx(env=lib_env(None), workers=2)
    assert server.trafficrate_lines() == [], server.describe()
    check_unlimited(server)


def test_bad_rate_is_reported_and_nginx_serves_unpaced(servers, lib_env):
    server = servers.nginx(env=lib_env("12x"), workers=2)
    check_one_rate_complaint(server)
    check_unlimited(server)


def test_strict_bad_rate_stops_nginx_at_startup(servers, lib_env):
    server = servers.nginx(env=lib_env("12x", STRICT=1), workers=2, start=False)
    server.start(wait_ready=False)
    rc = server.wait_exit(10.0)
    assert rc is not None and rc > 0, server.describe()
    check_one_rate_complaint(server)


def test_strict_bad_rate_stops_python_server_at_startup(servers, lib_env):
    server = servers.python(env=lib_env("12x", STRICT=1), start=False)
    server.start(wait_ready=False)
    rc = server.wait_exit(10.0)
    assert rc is not None and rc > 0, server.describe()
    check_one_rate_complaint(server)
