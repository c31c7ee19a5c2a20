"""Issue 9, passed sockets: servers whose process that accepts a connection
is not the one that serves it. passing_server.py's acceptor accepts, passes
each socket to a worker process over a Unix socket with sendmmsg (the
workers receive with recvmmsg) and closes its copy at once; the workers
serve it with sendfile. (Node.js cluster's round-robin scheduling, which
does the same with sendmsg/recvmsg, is in test_servers.py.)

  * one client's 4 downloads share the rate, another client gets its own,
    each connection is counted once, and every byte arrives intact;
  * a socket a process connected itself (like a proxy's upstream
    connection), passed to another process that sends on it, is never
    governed.
"""

import os
import socket
import subprocess
import threading
import time

import harness
from server_base import Server

RATE = "500k"
TARGET = 512000
CLIENT_A = "127.0.0.2"  # 4 downloads
CLIENT_B = "127.0.0.3"  # 1 download
FILE_NAME = "passed.bin"
FILE_SIZE = 16 << 20  # more than 12 s at the rate
PASSING_SERVER = harness.REPO_ROOT / "tests" / "integration" / "passing_server.py"


class PassingServer(Server):
    name = "passing-server"

    def __init__(self, workdir, webroot, env, workers=2):
        super().__init__(workdir, env=env)
        self.workers = workers
        self.title = ("acceptor passing sockets to %d worker processes "
                      "(sendmmsg/recvmmsg)" % workers)
        self.argv = [harness.PYTHON, str(PASSING_SERVER), "serve",
                     "--port", str(self.port), "--root", str(webroot),
                     "--workers", str(workers), "--mmsg"]


def served_file(webroot):
    path = webroot / FILE_NAME
    if not path.exists() or path.stat().st_size != FILE_SIZE:
        path.write_bytes(os.urandom(FILE_SIZE))
    return harness.register_content("/" + FILE_NAME, path.read_bytes())


def test_sockets_passed_to_workers_are_governed_counted_once_and_intact(
        servers, lib_env, zone, workdir, webroot):
    served_file(webroot)
    server = PassingServer(workdir, webroot, lib_env(RATE))
    servers.servers.append(server)
    server.start()
    dset = harness.DownloadSet(server.port, [], duration=12.0)
    for n, source in enumerate([CLIENT_A] * 4 + [CLIENT_B]):
        dset.downloads.append(harness.Download(
            server.port, source, "/" + FILE_NAME,
            label="%s#%d" % (source, n + 1), start_at=dset.start_at,
            stop_at=dset.stop_at))
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 6.0 - time.monotonic()))
        stat_a = harness.key_stat(zone, CLIENT_A)
        stat_b = harness.key_stat(zone, CLIENT_B)
        snapshot = harness.stat_json(zone)
        time.sleep(max(0.0, started + 10.2 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 10.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    owners = {c["pid"] for c in snapshot["connections"]}
    report = "%s\n%s\nstat %s %s\nowners %s (acceptor %d)" % (
        server.title, m.report(), stat_a, stat_b, sorted(owners), server.pid)
    print("\n" + report)
    assert not dset.errors(), report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, 0.05), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, 0.05), report
    # Counted once each, and owned by the workers that send, not the
    # acceptor that closed its copies.
    assert (stat_a["connections"], stat_a["active"]) == (4, 4), report
    assert (stat_b["connections"], stat_b["active"]) == (1, 1), report
    assert server.pid not in owners and owners, report
    # Every byte received is the file's, in order.
    assert all(d.total > 0 for d in dset.downloads), report
    print(harness.check_bodies(dset.downloads))


def test_connected_socket_passed_to_another_process_is_not_governed(
        lib_env, zone, workdir):
    """The upstream side is this test (no library); the process under the
    library connects to it and passes the socket to a child that sends
    4 MiB. Governed, that would take 8 s at the rate."""
    size = 4 << 20
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    got = {"bytes": 0, "done_at": None}
    conns = []

    def read_all():
        listener.settimeout(10.0)
        conn, _ = listener.accept()
        conns.append(conn)
        conn.settimeout(10.0)
        while got["bytes"] < size:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got["bytes"] += len(chunk)
        got["done_at"] = time.monotonic()

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    err = workdir / "upstream.stderr"
    t0 = time.monotonic()
    with open(err, "wb") as errf:
        proc = subprocess.Popen(
            [harness.PYTHON, str(PASSING_SERVER), "upstream", "--connect",
             "127.0.0.1:%d" % port, "--bytes", str(size)],
            env=harness.server_environment(lib_env(RATE)),
            stdout=subprocess.PIPE, stderr=errf, start_new_session=True)
    try:
        reader.join(8.0)
        elapsed = (got["done_at"] or time.monotonic()) - t0
        snapshot = harness.stat_json(zone)  # the child still holds it open
        report = "received %d of %d B in %.2f s; zone: %d keys, %d conns\n%s" % (
            got["bytes"], size, elapsed, len(snapshot["keys"]),
            len(snapshot["connections"]), err.read_text(errors="replace"))
        print("\n" + report)
        assert got["bytes"] == size, report
        assert elapsed < 4.0, report  # at the rate: 8 s
        assert snapshot["keys"] == [] and snapshot["connections"] == [], report
    finally:
        for conn in conns:
            conn.close()
        listener.close()
        try:
            proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)
