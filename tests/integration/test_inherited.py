"""Issue 9, inherited sockets: services whose client connection is accepted
by a launcher and inherited by a process started for that one connection,
as inetd, xinetd and systemd's Accept=yes run them. systemd-socket-activate
(Debian's systemd) is the launcher, run without the library as systemd
would run it; each connection's process (inetd_http.py, serving with
sendfile) gets LD_PRELOAD and the TRAFFICRATE_* variables from it (-E), as
a unit's Environment= would give them.

All four launchers run at once, in one 12 s span:

  * inetd style (the socket is fd 0 and 1) on a server port (below the
    ephemeral range): one client's 4 downloads, in 4 processes, share the
    rate and are counted once each; another client gets its own rate;
  * systemd style (the socket is fd 3, LISTEN_FDS=1) on an ephemeral port
    named by TRAFFICRATE_PORTS: governed;
  * TRAFFICRATE_INHERITED=0: left alone (unpaced);
  * an ephemeral port without TRAFFICRATE_PORTS: taken for an outgoing
    connection's, left alone (unpaced).

Every byte is checked.
"""

import os
import random
import shutil
import socket
import time

import pytest

import harness
from server_base import Server

RATE = "500k"
TARGET = 512000
CLIENT_A = "127.0.0.2"  # inetd style: 4 downloads
CLIENT_B = "127.0.0.3"  # inetd style: 1 download
CLIENT_C = "127.0.0.4"  # systemd style (fd 3): 2 downloads
CLIENT_D = "127.0.0.5"  # TRAFFICRATE_INHERITED=0
CLIENT_E = "127.0.0.6"  # ephemeral port, no TRAFFICRATE_PORTS
FILE_NAME = "inherited.bin"
FILE_SIZE = 16 << 20  # more than 12 s at the rate
DURATION = 12.0
INETD_HTTP = harness.REPO_ROOT / "tests" / "integration" / "inetd_http.py"
LAUNCHER = shutil.which("systemd-socket-activate")

pytestmark = pytest.mark.skipif(
    LAUNCHER is None, reason="systemd-socket-activate (Debian's systemd) missing")


def server_port(taken=()):
    """A free port below the kernel's ephemeral range, as a service's is,
    and not one of `taken` (chosen but not yet bound)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(200):
        port = random.randrange(low // 2, low)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind((harness.SERVER_HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below %d" % low)


class SocketActivated(Server):
    """systemd-socket-activate --accept: one inetd_http.py per connection.

    The launcher itself runs without the library (self.env is empty); the
    connection processes get child_env through -E."""

    name = "socket-activate"

    def __init__(self, workdir, webroot, child_env, inetd=True, port=None):
        super().__init__(workdir, port=port)
        self.title = "systemd-socket-activate --accept%s" % (
            " --inetd (fd 0/1)" if inetd else " (fd 3, LISTEN_FDS)")
        self.argv = [LAUNCHER, "--listen=%s:%d" % (harness.SERVER_HOST, self.port),
                     "--accept"] + (["--inetd"] if inetd else [])
        for name, value in sorted(child_env.items()):
            self.argv.append("--setenv=%s=%s" % (name, value))
        self.argv += [harness.PYTHON, str(INETD_HTTP), "--root", str(webroot)]


def served_file(webroot):
    path = webroot / FILE_NAME
    if not path.exists() or path.stat().st_size != FILE_SIZE:
        path.write_bytes(os.urandom(FILE_SIZE))
    return harness.register_content("/" + FILE_NAME, path.read_bytes())


def fetch_all(port, source, timeout=10.0):
    """Downloads the whole file; (seconds, body)."""
    t0 = time.monotonic()
    status, _, body = harness.http_get(port, "/" + FILE_NAME, source=source,
                                       timeout=timeout, max_body=FILE_SIZE)
    assert status == 200
    return time.monotonic() - t0, body


def test_inherited_client_connections_are_governed_and_outgoing_ones_not(
        servers, lib_env, zone, workdir, webroot):
    served_file(webroot)
    inetd = SocketActivated(workdir, webroot, lib_env(RATE), inetd=True,
                            port=server_port())
    ephemeral = harness.free_port()
    systemd = SocketActivated(workdir, webroot,
                              lib_env(RATE, PORTS=str(ephemeral)),
                              inetd=False, port=ephemeral)
    off = SocketActivated(workdir, webroot, lib_env(RATE, INHERITED=0),
                          port=server_port(taken=(inetd.port,)))
    outgoing = SocketActivated(workdir, webroot, lib_env(RATE))  # ephemeral
    for server in (inetd, systemd, off, outgoing):
        servers.servers.append(server)
        server.start()
        assert not server.exited(), server.describe()
    dset = harness.DownloadSet(inetd.port, [], duration=DURATION)
    for n, (port, source) in enumerate(
            [(inetd.port, CLIENT_A)] * 4 + [(inetd.port, CLIENT_B)]
            + [(systemd.port, CLIENT_C)] * 2):
        dset.downloads.append(harness.Download(
            port, source, "/" + FILE_NAME, label="%s#%d" % (source, n + 1),
            start_at=dset.start_at, stop_at=dset.stop_at))
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 6.0 - time.monotonic()))
        stats = {c: harness.key_stat(zone, c) for c in (CLIENT_A, CLIENT_B,
                                                       CLIENT_C)}
        time.sleep(max(0.0, started + 10.2 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 10.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    # The unpaced ones, after the measured span: the whole file (32 s at
    # the rate) in a few seconds, and nothing of them in the zone.
    off_s, off_body = fetch_all(off.port, CLIENT_D)
    out_s, out_body = fetch_all(outgoing.port, CLIENT_E)
    stat_d = harness.key_stat(zone, CLIENT_D)
    stat_e = harness.key_stat(zone, CLIENT_E)
    report = "%s\nstat %s\nINHERITED=0: %.2f s, ephemeral port: %.2f s for " \
        "%d B; stat %s %s" % (m.report(), stats, off_s, out_s, FILE_SIZE,
                              stat_d, stat_e)
    print("\n" + report)
    assert not dset.errors(), report
    for client in (CLIENT_A, CLIENT_B, CLIENT_C):
        assert harness.within(m.source_rate(client), TARGET, 0.05), report
    # One registration per connection, each in its own process.
    assert (stats[CLIENT_A]["connections"], stats[CLIENT_A]["active"]) == (4, 4), report
    assert (stats[CLIENT_B]["connections"], stats[CLIENT_B]["active"]) == (1, 1), report
    assert (stats[CLIENT_C]["connections"], stats[CLIENT_C]["active"]) == (2, 2), report
    # Every byte received is the file's, in order (the whole file for the
    # unpaced ones; http_get's bodies are checked after the test too).
    assert all(d.total > 0 for d in dset.downloads), report
    print(harness.check_bodies(dset.downloads))
    assert off_s < 4.0 and out_s < 4.0, report
    assert len(off_body) == FILE_SIZE and len(out_body) == FILE_SIZE, report
    assert stat_d["connections"] == 0 and stat_e["connections"] == 0, report
