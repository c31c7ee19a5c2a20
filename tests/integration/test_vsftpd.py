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


def run_downloads(server, zone):
    dset = harness.DownloadSet(server.port, [], duration=DURATION)
    for n in range(DOWNLOADS):
        dset.downloads.append(FtpDownload(
            server.port, CLIENT, "/big.bin", harness.BIG_FILE_SIZE,
            label="%s#%d" % (CLIENT, n + 1), start_at=dset.start_at,
            stop_at=dset.stop_at))
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 5.0 - time.monotonic()))
        during = harness.key_stat(zone, CLIENT)
        time.sleep(max(0.0, started + DURATION - 0.3 - time.monotonic()))
        m = dset.measure(started + 2.0, started + DURATION - 0.5, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    return dset, m, during


@pytest.mark.parametrize("isolate", [True, False],
                         ids=["debian-defaults", "isolation-off"])
def test_ftp_downloads_share_the_rate_and_leave_the_zone_empty(
        servers, lib_env, zone, workdir, webroot, isolate):
    log = workdir / "trafficrate.log"
    # The sessions' stderr is the FTP control connection: log to a file.
    server = VsftpdServer(workdir, webroot, lib_env(RATE, LOG=str(log)),
                          isolate=isolate)
    servers.servers.append(server)
    server.start()
    dset, m, during = run_downloads(server, zone)
    waited, after = wait_zone_empty(zone, 3.0)
    lines = log.read_text(errors="replace") if log.exists() else ""
    report = "%s\n%s\nduring: %s\nzone empty after %s s; processes %s, " \
        "connections %s\nlog:\n%s" % (
            server.title, m.report(), during,
            "%.2f" % waited if waited is not None else "> 3",
            after["processes"], after["connections"], lines[-3000:])
    print("\n" + report)
    assert not dset.errors(), report
    assert all(d.total > 0 for d in dset.downloads), report
    print(harness.check_bodies(dset.downloads))
    assert harness.within(m.source_rate(CLIENT), TARGET, 0.05), report
    assert during["active"] >= DOWNLOADS, report
    assert waited is not None, report
