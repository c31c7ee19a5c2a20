"""Issue 32, every new process recognised: vsftpd (Debian's package) under
the library, one client's 4 FTP downloads at once.

  * Debian's default configuration (isolate, isolate_network): each session
    is made with a raw clone system call (new PID and network namespaces),
    so pthread_atfork never runs in it; its privileged process accepts the
    passive data connections and passes them to the session's transfer
    process (another raw clone) over a Unix socket;
  * isolate=NO, isolate_network=NO: sessions are made with fork, and the
    data connections are passed the same way.

In both, the client's total must be the rate (±5%), every byte the file's,
and once the clients are gone the zone must hold no connection (within a
couple of seconds).
"""

import os
import shutil
import time

import pytest

import harness
from ftp import VSFTPD, FtpDownload, VsftpdServer

RATE = "500k"
TARGET = 512000
CLIENT = "127.0.0.2"
DOWNLOADS = 4
DURATION = 10.0

pytestmark = pytest.mark.skipif(
    not os.path.exists(VSFTPD), reason="vsftpd (Debian's package) missing")


def zone_connections(zone):
    snap = harness.stat_json(zone)
    return snap["used"]["connections"], snap


def wait_zone_empty(zone, timeout):
    """Seconds until the zone holds no connection, or None; last snapshot."""
    t0 = time.monotonic()
    while True:
        n, snap = zone_connections(zone)
        if n == 0:
            return time.monotonic() - t0, snap
        if time.monotonic() - t0 >= timeout:
            return None, snap
        time.sleep(0.05)


# (case, vsftpd's isolate and isolate_network, client address): both run at
# once, each its own server, zone and client, measured in one window.
CASES = [("debian-defaults", True, "127.0.0.2"),
         ("isolation-off", False, "127.0.0.3")]


def ftp_downloads(server, client):
    dset = harness.DownloadSet(server.port, [], duration=DURATION)
    for n in range(DOWNLOADS):
        dset.downloads.append(FtpDownload(
            server.port, client, "/big.bin", harness.BIG_FILE_SIZE,
            label="%s#%d" % (client, n + 1), start_at=dset.start_at,
            stop_at=dset.stop_at))
    return dset


@pytest.fixture(scope="module")
def ftp_runs(webroot):
    """Both configurations at once; {case: result dict} for the tests."""
    workdir = harness.make_workdir()
    factory = harness.ServerFactory(workdir, webroot)
    runs = {}
    try:
        for case, isolate, client in CASES:
            zone = harness.unique_zone("vsftpd-" + case)
            harness.remove_zone(zone)
            log = workdir / ("trafficrate-%s.log" % case)
            # The sessions' stderr is the FTP control connection: log to a
            # file.
            env = harness.preload_env(zone, RATE, LOG=str(log))
            server = VsftpdServer(workdir, webroot, env, isolate=isolate)
            factory.servers.append(server)
            server.start()
            runs[case] = dict(server=server, zone=zone, log=log, client=client,
                              dset=ftp_downloads(server, client))
        for run in runs.values():
            run["dset"].start()
        try:
            started = [run["dset"].wait_started(10.0) for run in runs.values()]
            assert all(started), [r["dset"].errors() for r in runs.values()]
            t0 = max(started)
            time.sleep(max(0.0, t0 + 5.0 - time.monotonic()))
            for run in runs.values():
                run["during"] = harness.key_stat(run["zone"], run["client"])
            time.sleep(max(0.0, t0 + DURATION - 0.3 - time.monotonic()))
            for run in runs.values():
                run["m"] = run["dset"].measure(t0 + 2.0, t0 + DURATION - 0.5,
                                               TARGET)
        finally:
            for run in runs.values():
                run["dset"].stop()
            for run in runs.values():
                run["dset"].join(5.0)
        for run in runs.values():
            run["waited"], run["after"] = wait_zone_empty(run["zone"], 3.0)
            run["lines"] = run["log"].read_text(errors="replace") \
                if run["log"].exists() else ""
        yield runs
    finally:
        factory.stop_all()
        for run in runs.values():
            harness.remove_zone(run["zone"])
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("case", [c for c, _, _ in CASES])
def test_ftp_downloads_share_the_rate_and_leave_the_zone_empty(ftp_runs, case):
    run = ftp_runs[case]
    dset, m, during, waited, after = (run[k] for k in (
        "dset", "m", "during", "waited", "after"))
    report = "%s\n%s\nduring: %s\nzone empty after %s s; processes %s, " \
        "connections %s\nlog:\n%s" % (
            run["server"].title, m.report(), during,
            "%.2f" % waited if waited is not None else "> 3",
            after["processes"], after["connections"], run["lines"][-3000:])
    print("\n" + report)
    assert not dset.errors(), report
    assert all(d.total > 0 for d in dset.downloads), report
    print(harness.check_bodies(dset.downloads))
    assert harness.within(m.source_rate(run["client"]), TARGET, 0.05), report
    assert during["active"] >= DOWNLOADS, report
    assert waited is not None, report
