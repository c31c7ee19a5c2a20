"""Issue 9, proxies: nginx `proxy_pass` under the library, in front of a
second nginx without it. The downstream client connections are governed
(each client gets the rate, bytes intact); the proxy's own upstream
connections, which it connects itself, are not: the zone never holds a key
for them, and the backend serves them at full speed.
"""

import time

import harness

RATE = "500k"
TARGET = 512000
CLIENT_A = "127.0.0.2"  # 3 downloads through the proxy
CLIENT_B = "127.0.0.3"  # 1 download through the proxy
# The proxy connects to the backend from this address (proxy_bind), so that
# a key for it would show. proxy_max_temp_file_size 0: with nginx's default
# (buffering the response in a temp file on disk), this machine's disk made
# the proxy itself stall a client for a few hundred ms now and then (0.86x
# over 8 s once), with or without the library.
UPSTREAM_SOURCE = "127.0.0.9"


def test_proxy_governs_clients_not_its_upstream(servers, lib_env, zone):
    backend = servers.nginx(env={}, workers=1)
    proxy = servers.nginx(
        env=lib_env(RATE), workers=2,
        extra_server=("    location /via/ {\n"
                      "      proxy_pass http://%s:%d/;\n"
                      "      proxy_bind %s;\n"
                      "      proxy_buffering on;\n"
                      "      proxy_max_temp_file_size 0;\n"
                      "    }" % (harness.SERVER_HOST, backend.port,
                                 UPSTREAM_SOURCE)))
    proxy.title += ", proxy_pass to %s" % backend.title
    # What the proxy's URLs serve: the backend's files (every byte checked).
    for name in (harness.SMALL_FILE, harness.BIG_FILE):
        harness.register_content("/via" + name, harness.content_for(name))
    path = "/via" + harness.SMALL_FILE
    status, _, body = harness.http_get(proxy.port, path=path)
    direct = harness.http_get(backend.port)[2]
    assert status == 200 and body == direct, (status, body[:80])
    dset = harness.DownloadSet(proxy.port, [], duration=12.0)
    for n, source in enumerate([CLIENT_A] * 3 + [CLIENT_B]):
        dset.downloads.append(harness.Download(
            proxy.port, source, "/via" + harness.BIG_FILE,
            label="%s#%d" % (source, n + 1), start_at=dset.start_at,
            stop_at=dset.stop_at))
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 6.0 - time.monotonic()))
        stat = harness.stat_json(zone)
        time.sleep(max(0.0, started + 10.2 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 10.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    keys = {k["key"]: k for k in stat["keys"]}
    seconds = harness.bucket_rates(
        [d for d in dset.downloads if d.source == CLIENT_B], started + 2.0,
        started + 10.0)
    report = "%s\n%s\nkeys: %s\n%s per second: %s" % (
        proxy.title, m.report(), keys, CLIENT_B,
        ["%.0f" % total for _, _, total, _ in seconds])
    print("\n" + report)
    assert not dset.errors(), report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, 0.05), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, 0.05), report
    # Only the clients' connections are registered; the proxy's upstream
    # connections are not.
    assert set(keys) == {CLIENT_A, CLIENT_B}, report
    assert keys[CLIENT_A]["connections"] == 3, report
    assert stat["used"]["connections"] == 4, report
