"""Checks of the harness itself, without the library.

Two known pacers stand in for trafficrate: nginx's own limit_rate, and the
kernel pacing (SO_MAX_PACING_RATE, what the library sets) applied statically
by pyserver.py --pace. If the client-side measurement reads them within 3%,
the harness can be trusted to judge trafficrate. Also checks that source
addresses, worker discovery, keep-alive helpers and server shutdown behave as
the other tests assume, that the check of every byte (bodies.py, run
after each test by conftest.py) reports a flipped byte, and that a stall of
the test process itself is seen (PauseWatch) and its seconds not judged.
"""

import ctypes
import gzip
import hashlib
import socket
import threading
import time

import pytest

import harness

pytestmark = pytest.mark.harness

LIMIT = "128k"
LIMIT_BPS = 131072


def between_bursts(download, after):
    """Midpoint of the first gap of >= 0.5 s in arrivals after `after`.

    nginx's limit_rate sends one second's worth at once, once a second (on its
    clock's second ticks): a window must start and end between bursts.
    """
    times = [t for t in download.times if t > after]
    for prev, nxt in zip(times, times[1:]):
        if nxt - prev >= 0.5:
            return (prev + nxt) / 2
    raise AssertionError("no pause between bursts after %.2f" % after)


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile-on", "sendfile-off"])
def test_measures_nginx_limit_rate_within_3_percent(servers, sendfile):
    server = servers.nginx(workers=2, sendfile=sendfile, limit_rate=LIMIT)
    sources = ["127.0.0.2", "127.0.0.3"]
    # Long enough that a window starting at the second gap (up to ~2.5 s in)
    # still ends before the download does.
    dset = harness.DownloadSet(server.port, sources, duration=10.0).start()
    dset.join()
    report = []
    for d in dset.downloads:
        assert not d.error, d.error
        t0 = between_bursts(d, d.connected_at + 1.0)
        assert t0 + 6.0 < d.times[-1], "window past the download's end"
        rate = d.rate(t0, t0 + 6.0)
        report.append("%s %.0f B/s over %.1f..%.1f s" % (
            d.label, rate, t0 - d.start_at, t0 + 6.0 - d.start_at))
        assert harness.within(rate, LIMIT_BPS, 0.03), report
    print("\nnginx limit_rate %s, sendfile %s: %s" % (LIMIT, sendfile, "; ".join(report)))


@pytest.mark.parametrize("sendfile", [False, True], ids=["send", "sendfile"])
def test_measures_kernel_pacing_within_3_percent(servers, sendfile):
    """Static SO_MAX_PACING_RATE shaped like issue 2's target: 4 x 128000 B/s
    from 127.0.0.2 and 1 x 512000 B/s from 127.0.0.3, same window as
    test_rate.py. Kernel pacing alone wanders: single connections at
    128000 B/s were seen up to +7% over 6 s, their sum +0.3..+2.5%."""
    server = servers.python(sendfile=sendfile,
                            pace={"127.0.0.2": 128000, "127.0.0.3": 512000})
    m = harness.run_downloads(server.port, ["127.0.0.2"] * 4 + ["127.0.0.3"],
                              warmup=2.0, window=8.0, target=512000)
    report = m.report()
    print("\n%s, static pacing\n%s" % (server.title, report))
    assert not [d for d in m.downloads if d.error], report
    assert harness.within(m.source_rate("127.0.0.2"), 512000, 0.03), report
    assert harness.within(m.source_rate("127.0.0.3"), 512000, 0.03), report
    for rate in m.download_rates("127.0.0.2"):
        assert harness.within(rate, 128000, 0.10), report


def test_unlimited_download_is_fast(servers):
    server = servers.nginx(workers=2)
    m = harness.run_downloads(server.port, ["127.0.0.2"], warmup=0.5, window=1.5,
                              repeat=True)
    print("\n" + m.report())
    assert m.source_rate("127.0.0.2") > 20 * 512000, m.report()


def test_clients_appear_with_their_source_address(servers):
    server = servers.nginx(workers=2, limit_rate="64k")
    dset = harness.DownloadSet(server.port, ["127.0.0.2", "127.0.0.3"], duration=3.0)
    dset.start()
    try:
        assert dset.wait_started(5.0)
        owners = harness.wait_for(lambda: len(harness.socket_owners(server.port)) == 2
                                  and harness.socket_owners(server.port), 5.0)
        assert owners, harness.socket_owners(server.port)
        peers = sorted(o["peer"][0] for o in owners)
        assert peers == ["127.0.0.2", "127.0.0.3"]
        workers = set(server.worker_pids())
        assert all(set(o["pids"]) <= workers for o in owners), (owners, workers)
    finally:
        dset.stop()
        dset.join(5.0)


def test_nginx_workers_run_unprivileged_and_stop_with_master(servers):
    server = servers.nginx(workers=2)
    workers = server.worker_pids()
    assert len(workers) == 2
    for pid in workers:
        with open("/proc/%d/status" % pid) as f:
            uid_line = [l for l in f if l.startswith("Uid:")][0]
        assert uid_line.split()[1] != "0", uid_line
    assert server.stop() == 0, server.describe()
    assert not [pid for pid in workers if harness.pid_alive(pid)]


@pytest.mark.parametrize("mode", ["thread", "fork"])
def test_python_server_serves_and_keeps_alive(servers, mode):
    server = servers.python(mode=mode)
    sock = harness.open_keepalive(server.port, source="127.0.0.3")
    try:
        body = harness.keepalive_get(sock, server.port)
        assert body.startswith(b"trafficrate small file")
    finally:
        sock.close()
    status, headers, _ = harness.http_get(server.port, harness.BIG_FILE,
                                          source="127.0.0.2", max_body=1024)
    assert status == 200 and int(headers["content-length"]) == harness.BIG_FILE_SIZE
    assert server.stop() is not None


def test_killed_nginx_worker_is_respawned(servers):
    server = servers.nginx(workers=2)
    before = server.worker_pids()
    assert harness.kill_pid(before[0])
    after = harness.wait_for(lambda: len(server.worker_pids()) == 2
                             and before[0] not in server.worker_pids()
                             and server.worker_pids(), 5.0)
    assert after and before[1] in after, (before, server.worker_pids())
    assert server.ready()


def test_forking_server_stop_ends_its_children(servers):
    server = servers.python(mode="fork")
    sock = harness.open_keepalive(server.port, source="127.0.0.2")
    try:
        children = harness.wait_for(lambda: harness.descendants(server.pid), 5.0)
        assert children
        server.stop()
        assert not [pid for pid in children if harness.pid_alive(pid)]
    finally:
        sock.close()


def test_downloads_can_join_and_leave_a_running_set(servers):
    # 1 MB/s: on loopback the kernel paces in TSO packets of up to 64 KiB,
    # so the 0.6 s the late download's rate is measured over must hold many
    # of them (at 64 KB/s it held two or three, and one more or less is
    # 30%).
    pace = 1000000
    server = servers.python(pace=pace)
    dset = harness.DownloadSet(server.port, ["127.0.0.2"], duration=3.0).start()
    late = dset.add("127.0.0.2", start_after=1.0, stop_after=2.0)
    dset.join()
    first = dset.downloads[0]
    assert late.label == "127.0.0.2#2" and not late.error and not first.error
    assert late.connected_at - first.connected_at > 0.8
    assert late.finished_at < first.finished_at - 0.5
    assert late.bytes_at(late.connected_at + 0.1 - 10) == 0
    assert harness.within(late.rate(late.connected_at + 0.3, late.connected_at + 0.9),
                          pace, 0.25)


def test_stop_ends_workers_orphaned_by_a_killed_master(servers):
    server = servers.nginx(workers=2)
    workers = server.worker_pids()
    assert harness.kill_pid(server.pid)
    assert server.wait_exit(5.0) is not None
    server.stop()
    assert not [pid for pid in workers if harness.pid_alive(pid)]


# ------------------------------------------- the check of every byte itself

class OneShotServer(threading.Thread):
    """Answers each connection on 127.0.0.1 with one canned response (no
    library): the first N bytes of big.bin, with one byte flipped if
    `corrupt_at` is set, as Content-Length, chunked, or chunked gzip."""

    def __init__(self, n, framing, corrupt_at=None):
        super().__init__(daemon=True)
        body = bytearray(harness.BIG_CONTENT.read(0, n))
        if corrupt_at is not None:
            body[corrupt_at] ^= 0x01
        head = "HTTP/1.1 200 OK\r\nConnection: close\r\n"
        if framing == "gzip":
            body = gzip.compress(bytes(body), 1)
            head += "Content-Encoding: gzip\r\n"
        if framing == "length":
            head += "Content-Length: %d\r\n\r\n" % len(body)
            payload = bytes(body)
        else:
            head += "Transfer-Encoding: chunked\r\n\r\n"
            pieces = [bytes(body[i:i + 9000]) for i in range(0, len(body), 9000)]
            payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        self.response = head.encode() + payload
        self.listener = socket.create_server((harness.SERVER_HOST, 0))
        self.listener.settimeout(5.0)
        self.port = self.listener.getsockname()[1]

    def run(self):
        with self.listener:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.response)


def fetch_from(server):
    server.start()
    d = harness.Download(server.port, "127.0.0.2", label="corrupt-test")
    d.start()
    d.join(10.0)
    server.join(5.0)
    assert not d.error and d.eof, d.error
    return d


@pytest.mark.parametrize("framing", ["length", "chunked", "gzip"])
def test_a_flipped_byte_is_reported_with_url_bytes_and_digests(framing):
    n = 300000
    intact = fetch_from(OneShotServer(n, framing))
    found, summary = harness.body_problems([intact])
    assert found == [] and summary.startswith("1 response bodies checked (%d " % n), (
        found, summary)
    bad = fetch_from(OneShotServer(n, framing, corrupt_at=123457))
    found, summary = harness.body_problems([bad])
    print("\n%s: %s" % (framing, found))
    assert len(found) == 1, (found, summary)
    line = found[0]
    assert "http://%s:%d%s" % (harness.SERVER_HOST, bad.port, harness.BIG_FILE) in line
    assert "corrupt-test" in line and "bytes differ" in line and str(n) in line
    corrupted = bytearray(harness.BIG_CONTENT.read(0, n))
    corrupted[123457] ^= 0x01
    assert "SHA-256 of the %d bytes received %s" % (
        n, hashlib.sha256(corrupted).hexdigest()) in line  # got
    assert line.endswith(harness.BIG_CONTENT.sha256(n))  # expected


def test_unknown_content_is_a_problem_unless_skipped():
    body = harness.Body("/nowhere.bin", {"content-length": "3"}, url="/nowhere.bin")
    body.feed(b"abc")
    skipped = harness.Body("/nowhere.bin", {"content-length": "3"}, verify=False)
    skipped.feed(b"abc")
    found, summary = harness.body_problems([body, skipped])
    assert len(found) == 1 and "unknown content" in found[0], found
    assert summary.endswith("1 skipped"), summary


@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception,
                   reason="the check after the test must fail it")
def test_the_check_after_each_test_fails_a_test_with_a_corrupt_body():
    """Leaves a corrupt body to conftest.py's check after the test: it must
    fail this test (xfail strict: passing would be an error)."""
    fetch_from(OneShotServer(100000, "length", corrupt_at=99999))


def test_a_stall_of_the_test_process_is_seen_and_its_seconds_not_judged():
    """A C call that holds the GIL for 0.4 s (usleep through ctypes.PyDLL,
    which does not release it) stops every thread of the process, as the
    kernel stalls PauseWatch was made for did: the pause is recorded, and
    on_time() drops the 1 s rows it overlaps and keeps the others."""
    harness.pauses_in(0, 0)  # starts the watch
    time.sleep(0.2)
    before = time.monotonic()
    ctypes.PyDLL(None).usleep(400000)
    after = time.monotonic()
    time.sleep(0.1)
    pauses = harness.pauses_in(before, after)
    assert len(pauses) == 1 and pauses[0][1] - pauses[0][0] >= 0.35, pauses
    assert harness.paused_seconds(before - 0.5, after + 0.5) >= 0.35
    rows = [(before - 2.0, before - 1.0, 0, []), (before - 0.5, before + 0.5, 0, []),
            (after + 0.2, after + 1.2, 0, [])]
    assert harness.on_time(rows) == [rows[0], rows[2]]
