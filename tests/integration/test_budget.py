"""Issue 7: the shared byte budget (TRAFFICRATE_SHARE=budget).

A client's connections share its rate by what actually leaves their sockets,
not by a static rate/active each: a slow reader's unused share goes to its
siblings, short connections' unpaced first segments and a closed socket's
draining queue are counted, a cap that does not bind is lifted. The static
split stays available as TRAFFICRATE_SHARE=equal.

Real nginx (2 workers, `listen ... reuseport`) under the library, rate 500k
(512000 B/s) per client IP unless a test says otherwise, real clients bound
to 127.0.0.2, in the private namespace of conftest.py (lo MTU 1500), with
net.ipv4.tcp_tso_rtt_log = 0 for the whole module (the small_gso_packets
fixture, see test_dynamics.py): the leave test checks 1 s windows, and the
fairness checks (16 and 64 connections of 8-32 KB/s each, three fast
connections within 5% of each other) would otherwise see 64 KiB TSO packets
released one at a time, i.e. whole seconds of silence per connection.

Rates are measured by the clients; windows are 8 s after a 2 s warm-up. The
tests that compare the modes (slow reader, closed with data queued) are
parametrised over TRAFFICRATE_SHARE=budget and =equal: the equal case
asserts the static split's known shortfall or excess, which shows that the
scenario tells the modes apart. Run with -s to see the figures; they are in
every assertion message too.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import harness
# The shared-budget clients (harness re-exports only PacedDownload).
from budget_clients import KeepaliveRequests, PacedDownload, RangeFetches

RATE = "500k"
TARGET = 512000  # B/s per client IP
CLIENT = "127.0.0.2"
WARMUP_S = 2.0
WINDOW_S = 8.0
SLOW_READ_RATE = 20 * 1024  # B/s, the slow reader
SHARE_VALUES = ("budget", "equal")

pytestmark = pytest.mark.usefixtures("small_gso_packets")


# -------------------------------------------------------------------- helpers

def nginx2(servers, env, **kw):
    """nginx, 2 workers, one reuseport listening socket per worker."""
    server = servers.nginx(env=env, workers=2, reuseport=True, **kw)
    workers = server.worker_pids()
    assert len(workers) == 2, server.describe()
    assert not [l for l in server.trafficrate_lines() if "TRAFFICRATE_SHARE" in l], \
        server.describe()
    return server, workers


class NginxSndbuf(harness.NginxServer):
    """NginxServer whose listening sockets have `listen ... sndbuf=SIZE`
    (SO_SNDBUF, inherited by the accepted sockets): nginx can hand a whole
    response to the kernel at once and close while it is still queued."""

    def __init__(self, *args, sndbuf="4m", **kw):
        super().__init__(*args, **kw)
        self.sndbuf = sndbuf
        self.title += ", sndbuf=%s" % sndbuf

    def conf_text(self):
        text = super().conf_text()
        assert " reuseport;" in text
        return text.replace(" reuseport;", " reuseport sndbuf=%s;" % self.sndbuf)


def nginx2_sndbuf(servers, env, sndbuf):
    server = NginxSndbuf(servers.workdir, servers.webroot, env=env, workers=2,
                         reuseport=True, sndbuf=sndbuf)
    servers.servers.append(server)  # stopped with the others
    server.start()
    workers = server.worker_pids()
    assert len(workers) == 2, server.describe()
    return server, workers


def key_entry(zone, key=CLIENT):
    """(the key's entry in stat --json or None, its connections, the whole
    document)."""
    doc = harness.stat_json(zone)
    entry = next((k for k in doc["keys"] if k["key"] == key), None)
    return entry, [c for c in doc["connections"] if c["key"] == key], doc


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


def jain(values):
    """Jain's fairness index: 1 when all equal, 1/n when one has all."""
    values = list(values)
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 0.0


def share_env(lib_env, share, rate=RATE, **kw):
    return lib_env(rate, SHARE=share, **kw)


def stop_all(*things):
    for t in things:
        t.stop()
    deadline = time.monotonic() + 10.0
    for t in things:
        t.join(max(0.0, deadline - time.monotonic()))


def window_of(dset):
    """Waits until dset's downloads started; returns the measuring window
    (t0, t1): from WARMUP_S after the start, WINDOW_S long."""
    started = dset.wait_started(10.0)
    assert started, dset.errors()
    return started + WARMUP_S, started + WARMUP_S + WINDOW_S


def run_window(dset, zone):
    """Waits until dset's downloads started, then WARMUP_S; notes which pids
    serve them and the key's stat at that moment; waits out WINDOW_S; stops
    dset. Returns (t0, t1, pids by label, key_entry() at t0)."""
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0)
        seen = dset.pids_by_label()
        stat = key_entry(zone)
        sleep_until(t1 + 0.05)
    finally:
        stop_all(dset)
    return t0, t1, seen, stat


def start_slow_reader_set(server, zone, w0, w1):
    """Starts 3 downloads of CLIENT read flat out and one read at
    SLOW_READ_RATE, 2 on each worker (the slow one on w0); returns (the
    DownloadSet, the slow one)."""
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 2, w1: 2})
    duration = WARMUP_S + WINDOW_S + 1.0
    dset = harness.DownloadSet(server.port, [CLIENT] * 3, duration=duration,
                               source_ports=[ports[w0][1], ports[w1][0], ports[w1][1]])
    slow = PacedDownload(server.port, CLIENT, read_rate=SLOW_READ_RATE,
                         label="%s#slow" % CLIENT, start_at=dset.start_at,
                         stop_at=dset.stop_at, source_port=ports[w0][0])
    dset.downloads.append(slow)
    dset.start()
    return dset, slow


def ratio_text(rate, target=TARGET):
    return "%.0f B/s = %.4f x target" % (rate, rate / target)


# --------------------------------------------------------- 1. a slow reader

@pytest.mark.parametrize("share", SHARE_VALUES)
def test_slow_reader_leaves_its_unused_share_to_its_siblings(servers, lib_env, zone,
                                                              share):
    """4 downloads of one client, 2 on each worker; one is read at 20 KiB/s
    (small SO_RCVBUF, paced reads), three flat out.
    budget: the client total is >= 0.95x (<= 1.05x) the rate and the three
    fast ones are within 5% of each other. equal: the static split leaves the
    slow reader's unused share unused: each fast one gets rate/4 (+-10%) and
    the client total stays <= 0.90x (expected ~0.80x)."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, share))
    dset, slow = start_slow_reader_set(server, zone, w0, w1)
    t0, t1, seen, (entry, _, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    fast = [r for d, r in m.per_download if d is not slow]
    slow_rate = slow.rate(t0, t1)
    spread = max(fast) / min(fast) - 1.0 if min(fast) > 0 else float("inf")
    report = ("%s, TRAFFICRATE_SHARE=%s, client %s: 3 fast downloads + 1 read at "
              "%d B/s\n%s\nclient total %s; fast ones spread %.1f%%; slow one %.0f B/s\n"
              "owners: %s\nstat at warm-up end: %s\n%s"
              % (server.title, share, CLIENT, SLOW_READ_RATE, m.report(),
                 ratio_text(total), 100 * spread, slow_rate,
                 {l: sorted(p) for l, p in seen.items()}, entry,
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    # The scenario is what it says: both workers, a slow reader that is slow
    # and still counted as sending.
    assert sorted(min(p) for p in seen.values()) == sorted([w0, w0, w1, w1]), report
    assert entry is not None and entry["connections"] == 4, report
    assert harness.within(slow_rate, SLOW_READ_RATE, 0.15), report
    if share == "budget":
        assert 0.95 * TARGET <= total <= 1.05 * TARGET, report
        assert spread <= 0.05, report
    else:
        # The slow reader has data queued, so it keeps a full share.
        assert entry["active"] == 4, report
        for rate in fast:
            assert harness.within(rate, TARGET / 4, 0.10), report
        assert total <= 0.90 * TARGET, report


def test_a_worker_that_stands_still_for_half_a_second_costs_no_rate(servers, lib_env,
                                                                    zone):
    """The slow-reader scenario (budget), and twice in the window one nginx
    worker (the slow reader's and one fast download's) is stopped for
    0.5 s (SIGSTOP): as its watcher is when the machine gives it no CPU
    for that long. Its connections go on sending what they hold, and the
    other worker's watcher decides the client's level meanwhile: it must
    wait for the stopped one's count (BudgetInput::count_late_ns), not take
    the missing bytes for unused and their arrival for a burst, nor take
    the stopped worker's connections for idle (Governor::NoteWatcherLate),
    nor decide on the resumed watcher's first count (TickBudget's
    recount). Before, the client got 0.936x over the window and
    0.80-0.86x in the seconds after each stop (0.79-0.88 in 4 of 20 runs
    with only the first); now the total is >= 0.965x (0.985-0.993) and the
    seconds after the stops 0.95x or more in 36 runs. A second elsewhere
    in the window dipped to 0.83-0.90x in about 1 run of 10, stops or not:
    the slow reader took a lump when its window opened, and BudgetTick's
    burst rule gave the equal share for it. That rule now needs a boost
    over 1.5 (none in 26 runs since); the bound stays 0.85x until more
    runs say so."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "budget"))
    dset, _ = start_slow_reader_set(server, zone, w0, w1)
    stops = []
    try:
        t0, t1 = window_of(dset)
        for at in (t0 + 2.3, t0 + 5.1):
            sleep_until(at)
            os.kill(w0, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                time.sleep(0.5)
            finally:
                os.kill(w0, signal.SIGCONT)
            stops.append((stopped - t0, time.monotonic() - t0))
        sleep_until(t1 + 0.05)
    finally:
        os.kill(w0, signal.SIGCONT)
        stop_all(dset)
    m = dset.measure(t0, t1, TARGET)
    rows = harness.bucket_rates(dset.downloads, t0, t1)
    report = ("%s, TRAFFICRATE_SHARE=budget, client %s: 3 downloads + 1 read at %d B/s, "
              "2 per worker; worker %d stopped at %s s\n%s\n1 s windows:\n%s\n%s"
              % (server.title, CLIENT, SLOW_READ_RATE, w0,
                 ", ".join("%.2f-%.2f" % s for s in stops), m.report(),
                 harness.bucket_text(rows, t0, TARGET),
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    on_time = harness.on_time(rows)
    harness.require_on_time(len(rows), len(on_time), report)
    total = sum(r[2] for r in on_time) / len(on_time)
    assert total >= 0.965 * TARGET, "%s\n%s" % (ratio_text(total), report)
    low = [r for r in on_time if r[2] < 0.85 * TARGET]
    assert not low, "1 s windows under 0.85x: %s\n%s" % (
        ["%.3f" % (r[2] / TARGET) for r in low], report)


# -------------------------------------------------- 2. short connections

def test_short_connections_next_to_long_ones_keep_the_client_total(servers, lib_env,
                                                                   zone):
    """4 long downloads plus 10 new connections a second, each a 64 KiB
    Range request with Connection: close, all from one client: the client's
    total over 8 s, short ones' bytes included, is within 5% of the rate.
    The short ones alone ask for 640 KiB/s, more than the rate; each sends
    its first 10 segments unpaced, and nginx queues its whole 64 KiB at once
    and closes, so under the static split it leaves the key while the kernel
    still sends it: measured 2.2x (each short one paced at the rate/active
    of its join, ~6 of them in flight, none counted as active)."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    duration = WARMUP_S + WINDOW_S + 1.0
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=duration)
    shorts = RangeFetches(server.port, CLIENT, size=64 * 1024, interval=0.1,
                          start_at=dset.start_at, stop_at=dset.stop_at,
                          max_fetches=int(duration * 10) + 1)
    dset.start()
    shorts.start()
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0 + WINDOW_S / 2)
        entry, _, _ = key_entry(zone)
        sleep_until(t1 + 0.05)
        in_flight = [shorts.in_flight(t) for t in (t0, (t0 + t1) / 2, t1)]
    finally:
        stop_all(dset, shorts)
    longs = dset.measure(t0, t1, TARGET)
    long_rate = longs.source_rate(CLIENT)
    short_rate = shorts.rate(t0, t1)
    total = long_rate + short_rate
    n_window = sum(1 for f in shorts.fetches if t0 <= f.started_at < t1)
    report = ("%s, client %s: 4 long downloads + 64 KiB Range requests, 10/s, "
              "each on a new connection\n%s\nshort ones %.0f B/s (%d started in "
              "the window; in flight at window start/middle/end %s)\n%s\n"
              "client total %s\nstat mid-window: %s\n%s"
              % (server.title, CLIENT, longs.report(), short_rate, n_window, in_flight,
                 shorts.summary(), ratio_text(total), entry,
                 "\n".join(dset.errors() + [shorts.error or ""])))
    print("\n" + report)
    assert not dset.errors() and not shorts.error, report
    assert n_window >= 0.9 * WINDOW_S * 10, report  # the client kept its pace
    # Whole 64 KiB bodies arrive (the client is overloading the key, so most
    # are still in flight at the end under a budget).
    assert sum(1 for f in shorts.fetches if f.complete) >= 5, report
    assert 0.95 * TARGET <= total <= 1.05 * TARGET, report


# ------------------------------------ 3. closed with data still queued

@pytest.mark.parametrize("share", SHARE_VALUES)
def test_a_closed_connection_still_draining_keeps_its_place(servers, lib_env, zone,
                                                            share):
    """3 long downloads plus, back to back, 256 KiB Range requests with
    Connection: close, read flat out, all from one client. nginx listens with
    sndbuf=4m, so it hands each 256 KiB response to the kernel at once and
    closes the socket right away, while the kernel sends it for ~2 s more (at
    the pacing of the socket's last share). The client total over 8 s, the
    256 KiB ones included:
    budget: the closed socket's bytes are still counted against the key, so
    the total stays within 5% of the rate.
    equal: the close is a leave: the 3 long ones go up to rate/3 while the
    orphaned socket drains at rate/4, so the total is >= 1.10x (measured
    1.26x). (With nginx's default, autotuned send buffer only the tail of
    each response is queued at the close: 1.11x with 256 KiB responses,
    1.04x with 1 MiB ones, too close to 1 to tell the modes apart.)"""
    server, _ = nginx2_sndbuf(servers, share_env(lib_env, share), "4m")
    duration = WARMUP_S + WINDOW_S + 1.0
    dset = harness.DownloadSet(server.port, [CLIENT] * 3, duration=duration)
    closing = RangeFetches(server.port, CLIENT, size=256 * 1024, interval=None,
                           start_at=dset.start_at, stop_at=dset.stop_at,
                           max_fetches=100)
    dset.start()
    closing.start()
    try:
        t0, t1 = window_of(dset)
        samples = []
        while time.monotonic() < t1:
            entry, _, _ = key_entry(zone)
            samples.append((entry or {}).get("active"))
            time.sleep(0.5)
        sleep_until(t1 + 0.05)
    finally:
        stop_all(dset, closing)
    longs = dset.measure(t0, t1, TARGET)
    long_rate = longs.source_rate(CLIENT)
    closing_rate = closing.rate(t0, t1)
    total = long_rate + closing_rate
    report = ("%s, TRAFFICRATE_SHARE=%s, client %s: 3 long downloads + 256 KiB "
              "Connection: close responses back to back\n%s\n256 KiB ones %.0f B/s; %s\n"
              "client total %s\nstat active counts every 0.5 s: %s\n%s"
              % (server.title, share, CLIENT, longs.report(), closing_rate,
                 closing.summary(), ratio_text(total), samples,
                 "\n".join(dset.errors() + [closing.error or ""])))
    print("\n" + report)
    assert not dset.errors() and not closing.error, report
    assert sum(1 for f in closing.fetches if f.complete) >= 2, report
    if share == "budget":
        assert 0.95 * TARGET <= total <= 1.05 * TARGET, report
    else:
        assert total >= 1.10 * TARGET, report


def fetch_closing(port, size, rate_change=None, timeout=30.0):
    """One Range request for the first `size` bytes of the big file with
    Connection: close from CLIENT, read flat out to the server's FIN.
    rate_change: (seconds after the first body byte, callable) run once then.
    Returns (body bytes, seconds from the first body byte to the FIN, times
    of (monotonic, body bytes so far) after each recv, FIN seen)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.bind((CLIENT, 0))
        sock.connect((harness.SERVER_HOST, port))
        sock.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nRange: bytes=0-%d\r\n"
                      "Connection: close\r\n\r\n" % (harness.BIG_FILE, size - 1)
                      ).encode())
        head, body, first, marks, fin = b"", 0, None, [], False
        checked = None  # the body's bodies.Body: every byte checked
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = sock.recv(1 << 16)
            except socket.timeout:
                data = None
            now = time.monotonic()
            if data == b"":
                fin = True
                if checked:
                    checked.end()
                break
            if data:
                if head is not None:
                    head += data
                    if b"\r\n\r\n" not in head:
                        continue
                    head, data = head.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    checked = harness.Body(
                        harness.BIG_FILE, {
                            name.strip().lower(): value.strip()
                            for name, _, value in (l.partition(":")
                                                   for l in lines[1:])},
                        int(lines[0].split()[1]), label=CLIENT)
                    head = None
                checked.feed(data)
                body += len(data)
                if first is None and body:
                    first = now
                marks.append((now, body))
            if rate_change and first is not None and now - first >= rate_change[0]:
                rate_change[1]()
                rate_change = None
        return body, (marks[-1][0] - first) if first else None, marks, fin
    finally:
        sock.close()


@pytest.mark.parametrize("share", SHARE_VALUES)
def test_a_response_handed_whole_to_the_kernel_follows_a_rate_change(
        servers, lib_env, zone, share):
    """nginx (sndbuf=4m) hands a whole 256 KiB response to the kernel and
    closes the socket at once, Connection: close. The rate is 100k; 0.5 s
    into the response it is lowered to 25k (`trafficrate set`).
    budget: the library keeps the closed socket open and paces it at the
    level, so the rest (~200 KB) arrives at 25 KB/s: the response takes
    about 8 s. Every byte arrives, then the FIN.
    equal: the orphaned socket keeps the 100 KB/s it had at the close; the
    response is done in about 2.6 s."""
    server, _ = nginx2_sndbuf(servers, share_env(lib_env, share, rate="100k"),
                              "4m")
    size = 256 * 1024

    def lower():
        proc = harness.run_cli("set", "--zone", zone, "25k")
        assert proc.returncode == 0, proc.stderr

    body, seconds, marks, fin = fetch_closing(server.port, size, (0.5, lower))
    # The rate of the last part (from 1.5 s on, once the change is in force).
    late = [(t, b) for t, b in marks if t - marks[0][0] >= 1.5]
    late_rate = ((late[-1][1] - late[0][1]) / (late[-1][0] - late[0][0])
                 if len(late) >= 2 and late[-1][0] > late[0][0] else None)
    report = ("%s, TRAFFICRATE_SHARE=%s: 256 KiB with Connection: close, rate "
              "100k lowered to 25k after 0.5 s: %d body bytes in %s s, FIN %s; "
              "from 1.5 s on %s B/s"
              % (server.title, share, body, seconds, fin, late_rate))
    print("\n" + report)
    assert body == size and fin, report
    if share == "budget":
        assert seconds >= 6.0, report
        assert late_rate is not None and harness.within(late_rate, 25 * 1024, 0.15), report
    else:
        assert seconds <= 4.0, report
    # Nothing is left behind in the zone once the response is done.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and key_entry(zone)[1]:
        time.sleep(0.1)
    assert not key_entry(zone)[1], harness.stat_json(zone)


# A process under the library (budget mode, 100k) that accepts a connection
# from CLIENT, registers it in an epoll set (edge-triggered, as servers do),
# queues 150 kB with a 1 MB send buffer and closes it at once; the client
# then writes a byte. It prints which fds above 100 it holds after the close
# and what the epoll set reports for the closed fd.
EPOLL_AFTER_CLOSE = r"""
import json, os, select, socket, sys
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen()
c = socket.socket(); c.bind((sys.argv[1], 0)); c.connect(ls.getsockname())
s, _ = ls.accept()
ep = select.epoll()
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
s.sendall(b"x" * 150000)
s.close()
high = sorted(int(f) for f in os.listdir("/proc/self/fd") if int(f) > 100
              and os.readlink("/proc/self/fd/" + f).startswith("socket:"))
c.send(b"y")
events = ep.poll(1.0)
got, reset = 0, False
c.settimeout(10)
try:
    while True:
        d = c.recv(65536)
        if not d:
            break
        got += len(d)
except ConnectionResetError:
    reset = True  # the host never read the byte: its close resets
print(json.dumps({"kept": high, "events": events, "received": got,
                  "reset": reset}))
"""


@pytest.mark.parametrize("share", SHARE_VALUES)
def test_a_kept_socket_is_taken_out_of_the_hosts_epoll_set(lib_env, share):
    """Through the real interposers (epoll_create1, close): budget mode keeps
    the closed socket open through an fd of its own, and the host's epoll
    set, which the socket was taken out of before the close, reports
    nothing for the fd the host closed when the client writes to it. The
    byte is never read, so the connection ends in a reset, as it does
    without the library (there at once, here once the queue is sent).
    equal mode keeps nothing."""
    env = harness.server_environment(lib_env("100k", SHARE=share))
    proc = subprocess.run([harness.PYTHON, "-c", EPOLL_AFTER_CLOSE, CLIENT],
                          capture_output=True, text=True, timeout=60, env=env)
    report = "TRAFFICRATE_SHARE=%s: rc %d, %s %s" % (share, proc.returncode,
                                                     proc.stdout, proc.stderr)
    assert proc.returncode == 0, report
    out = json.loads(proc.stdout)
    assert out["events"] == [], report
    if share == "budget":
        assert len(out["kept"]) == 1, report
        assert out["received"] > 0, report
    else:
        assert out["kept"] == [], report


# --------------------------------------------------- 4. many connections

@pytest.mark.parametrize("n, tolerance", [
    pytest.param(16, 0.05, id="16"),
    pytest.param(64, 0.08, id="64"),
])
def test_many_connections_of_one_client_share_the_rate_fairly(servers, lib_env, zone,
                                                              n, tolerance):
    """16 and 64 downloads of one client (the kernel spreads them over both
    workers): total within 5% (8% at 64) of the rate over 8 s, Jain index of
    the connections' rates >= 0.98."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * n,
                               duration=WARMUP_S + WINDOW_S + 3.0).start()
    t0, t1, seen, (entry, _, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    rates = [r for _, r in m.per_download]
    total = m.source_rate(CLIENT)
    index = jain(rates)
    per_pid = {}
    for pids in seen.values():
        for p in pids:
            per_pid[p] = per_pid.get(p, 0) + 1
    report = ("%s, client %s: %d downloads\nclient total %s; Jain %.4f; "
              "connections min %.0f median %.0f max %.0f B/s (rate/n %.0f)\n"
              "per worker %s\nstat: %s\n%s"
              % (server.title, CLIENT, n, ratio_text(total), index, min(rates),
                 statistics.median(rates), max(rates), TARGET / n, per_pid, entry,
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    assert entry is not None and entry["connections"] == n, report
    assert harness.within(total, TARGET, tolerance), report
    assert index >= 0.98, report


# ------------------------------------------------ 5. a cap that does not bind

def test_level_is_the_whole_rate_while_the_client_is_far_below_it(servers, lib_env,
                                                                  zone):
    """Rate 1000m; 4 keep-alive connections of one client, each doing
    sequential 4 KiB requests as fast as it can (~100 MB/s in all): stat
    shows the key's level equal to the whole rate, not rate/active, each
    sending connection paced at it, and the measured rate far below it."""
    rate = harness.parse_rate("1000m")
    # nginx closes a keep-alive connection after 1000 requests by default.
    server, _ = nginx2(servers, share_env(lib_env, "budget", rate="1000m"),
                       extra_http="  keepalive_requests 1000000;")
    start = time.monotonic() + 0.05
    loops = [KeepaliveRequests(server.port, CLIENT, size=4096, start_at=start,
                               stop_at=start + 5.0, max_requests=200000)
             for _ in range(4)]
    for loop in loops:
        loop.start()
    samples = []
    try:
        sleep_until(start + 1.5)
        deadline = start + 4.5
        while time.monotonic() < deadline and len(samples) < 20:
            entry, conns, _ = key_entry(zone)
            if entry is not None:
                samples.append((entry, [c for c in conns if c["active"]]))
            time.sleep(0.2)
    finally:
        stop_all(*loops)
    busy = [(e, c) for e, c in samples if e["active"] >= 2]
    lines = ["  active %d level %s measured %s debt %s share %d; sending connections' "
             "shares %s" % (e["active"], e.get("level"), e.get("measured"), e.get("debt"),
                            e["share"], sorted({x["share"] for x in c}))
             for e, c in samples]
    report = ("%s, rate %d B/s, client %s: 4 keep-alive connections of sequential "
              "4 KiB requests\nrequests %s in 5 s; errors %s\nstat samples:\n%s"
              % (server.title, rate, CLIENT, [l.requests for l in loops],
                 [l.error for l in loops if l.error], "\n".join(lines)))
    print("\n" + report)
    assert not [l for l in loops if l.error], report
    assert all(l.requests >= 100 for l in loops), report
    # rate/active would differ from the rate: more than one was sending.
    assert len(busy) >= 5, report
    for e, conns in busy:
        assert "level" in e and "measured" in e, report
        assert e["level"] == rate, report
        # This client manages ~0.1x of 1000m here (~26 MB/s a connection);
        # a quarter is what rate/active would allow each of 4.
        assert 0 < e["measured"] < rate / 4, report
        assert all(c["share"] == rate for c in conns), report


def test_level_is_a_quarter_of_the_rate_with_four_downloads(servers, lib_env, zone):
    """Rate 500k, 4 downloads of one client: sampled over 8 s after the
    warm-up, stat's level is rate/4 (+-10%, median), its measured rate within
    5% of the rate (median), its debt never negative, and the client's own
    total within 5%."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * 4,
                               duration=WARMUP_S + WINDOW_S + 1.0).start()
    samples = []
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0)
        while time.monotonic() < t1 and len(samples) < 40:
            entry, _, _ = key_entry(zone)
            if entry is not None:
                samples.append(entry)
            time.sleep(0.4)
        sleep_until(t1 + 0.05)
    finally:
        stop_all(dset)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    report = ("%s, client %s: 4 downloads\n%s\nclient total %s\nstat samples "
              "(active, level, measured, debt):\n%s"
              % (server.title, CLIENT, m.report(), ratio_text(total),
                 "\n".join("  %s %s %s %s" % (e["active"], e.get("level"),
                                             e.get("measured"), e.get("debt"))
                           for e in samples)))
    print("\n" + report)
    assert not dset.errors(), report
    assert len(samples) >= 10 and all(e["active"] == 4 for e in samples), report
    assert all("level" in e and "measured" in e and "debt" in e for e in samples), report
    level = statistics.median(e["level"] for e in samples)
    measured = statistics.median(e["measured"] for e in samples)
    assert harness.within(level, TARGET / 4, 0.10), report
    assert harness.within(measured, TARGET, 0.05), report
    assert all(e["debt"] >= 0 for e in samples), report
    assert harness.within(total, TARGET, 0.05), report


# ----------------------------------------------- 6. equal works as before

def test_equal_share_splits_the_rate_statically(servers, lib_env, zone):
    """TRAFFICRATE_SHARE=equal, 4 downloads of one client over both workers:
    total within 5% of the rate, each connection within 10% of rate/4, and
    stat shows share rate/4 for the key and each of its connections."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "equal"))
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 2, w1: 2})
    dset = harness.DownloadSet(server.port, [CLIENT] * 4,
                               duration=WARMUP_S + WINDOW_S + 1.0,
                               source_ports=ports[w0] + ports[w1]).start()
    t0, t1, seen, (entry, conns, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    report = ("%s, TRAFFICRATE_SHARE=equal, client %s: 4 downloads\n%s\nclient total "
              "%s\nowners %s\nstat: %s\nconnections' shares %s"
              % (server.title, CLIENT, m.report(), ratio_text(total),
                 {l: sorted(p) for l, p in seen.items()}, entry,
                 [c["share"] for c in conns]))
    print("\n" + report)
    assert not dset.errors(), report
    assert sorted(min(p) for p in seen.values()) == sorted([w0, w0, w1, w1]), report
    assert harness.within(total, TARGET, 0.05), report
    for rate in m.download_rates(CLIENT):
        assert harness.within(rate, TARGET / 4, 0.10), report
    assert entry is not None and (entry["active"], entry["share"]) == (4, TARGET // 4), \
        report
    assert [c["share"] for c in conns] == [TARGET // 4] * 4, report


# ------------------------------------------ 7. configuration and the CLI

def share_complaints(server):
    return [l for l in server.trafficrate_lines() if "TRAFFICRATE_SHARE" in l]


def check_share_complaint(lines, ending):
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("trafficrate: TRAFFICRATE_SHARE: "), line
    assert "budget" in line and "equal" in line, line
    assert line.endswith(ending), line


def test_bad_share_is_reported_and_nginx_serves_unpaced(servers, lib_env):
    server = servers.nginx(env=share_env(lib_env, "fair"), workers=2)
    check_share_complaint(share_complaints(server), "the server runs unpaced")
    m = harness.run_downloads(server.port, [CLIENT], warmup=0.5, window=2.0,
                              repeat=True)
    report = "%s\n%s" % (server.title, m.report())
    print("\n" + report)
    assert not [d for d in m.downloads if d.error], report
    assert m.source_rate(CLIENT) > 20 * TARGET, report


def test_strict_bad_share_stops_nginx_at_startup(servers, lib_env):
    server = servers.nginx(env=share_env(lib_env, "fair", STRICT=1), workers=2,
                           start=False)
    server.start(wait_ready=False)
    rc = server.wait_exit(10.0)
    assert rc == 1, server.describe()
    check_share_complaint(share_complaints(server), "exiting (TRAFFICRATE_STRICT=1)")


def share_lines(out):
    """Lines of `trafficrate check` output whose first word is `share`."""
    return [l.strip() for l in out.splitlines() if l.split()[:1] == ["share"]]


def test_check_prints_the_share_mode(cli):
    cp = harness.run_cli("check", "--rate", "500k")
    assert cp.returncode == 0, cp.stderr
    lines = share_lines(cp.stdout)
    # The default is budget (issue 33), equal stays for comparison.
    assert len(lines) == 1 and "budget" in lines[0], cp.stdout
    for args, env in ((["--share", "equal"], None), ([], {"TRAFFICRATE_SHARE": "equal"}),
                      (["--share", "budget"], {"TRAFFICRATE_SHARE": "equal"}),
                      (["--share", "equal"], {"TRAFFICRATE_SHARE": "budget"})):
        cp = harness.run_cli("check", "--rate", "500k", *args, env=env)
        assert cp.returncode == 0, (args, env, cp.stderr)
        lines = share_lines(cp.stdout)
        mode = args[1] if args else env["TRAFFICRATE_SHARE"]
        assert len(lines) == 1 and mode in lines[0], (args, env, cp.stdout)
    for args, env in ((["--share", "fair"], None), ([], {"TRAFFICRATE_SHARE": "fair"})):
        cp = harness.run_cli("check", "--rate", "500k", *args, env=env)
        assert cp.returncode == 1, (args, env, cp.stdout, cp.stderr)
        assert cp.stderr.count("\n") == 1, cp.stderr
        assert cp.stderr.startswith("trafficrate: TRAFFICRATE_SHARE: "), cp.stderr
        assert "budget" in cp.stderr and "equal" in cp.stderr, cp.stderr


def test_run_share_sets_the_variable(zone, cli):
    """`trafficrate run --share MODE -- env` execs env with
    TRAFFICRATE_SHARE=MODE (overriding the environment's); a bad mode is a
    usage error (2) and nothing runs."""
    for mode in SHARE_VALUES:
        other = "equal" if mode == "budget" else "budget"
        cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--share", mode,
                             "--", "/usr/bin/env", env={"TRAFFICRATE_SHARE": other})
        assert cp.returncode == 0, (mode, cp.stderr)
        assert "TRAFFICRATE_SHARE=%s" % mode in cp.stdout.splitlines(), cp.stdout
        assert not [l for l in cp.stderr.splitlines() if "TRAFFICRATE_SHARE" in l], \
            cp.stderr
    cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--share", "fair",
                         "--", "/usr/bin/env")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert cp.stdout == "", cp.stdout
    assert cp.stderr.count("\n") == 1, cp.stderr
    assert cp.stderr.startswith("trafficrate: run: --share: "), cp.stderr
    assert "budget" in cp.stderr and "equal" in cp.stderr, cp.stderr


def test_stat_shows_measured_level_and_debt_in_every_format(servers, lib_env, zone,
                                                            cli):
    """4 downloads: stat --json's key has measured, level and debt (numbers;
    level within (0, rate], debt >= 0, measured > 0); the table has MEASURED,
    LEVEL and DEBT columns; Prometheus has the key's measured, level and debt
    metrics. Each worker's watcher shows its CPU (under 1% of a core for 4
    connections) and stretch (1: nothing spaced out) in every format."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=12.0).start()
    try:
        assert dset.wait_started(10.0), dset.errors()
        counted = harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["active"] == 4, 5.0)
        time.sleep(2.0)
        entry, _, doc = key_entry(zone)
        table = harness.run_cli("stat", "--zone", zone)
        prom = harness.run_cli("stat", "--zone", zone, "--prometheus")
    finally:
        stop_all(dset)
    report = "json: %s\ntable:\n%s%s\nprometheus:\n%s%s" % (
        doc, table.stdout, table.stderr, prom.stdout, prom.stderr)
    print("\n" + report)
    assert counted and entry is not None, report
    for field in ("measured", "level", "debt"):
        assert isinstance(entry.get(field), (int, float)), (field, report)
    assert 0 < entry["level"] <= TARGET, report
    assert entry["debt"] >= 0 and entry["measured"] > 0, report
    assert table.returncode == 0, report
    header = next((l for l in table.stdout.splitlines() if l.startswith("CLIENT")), "")
    assert all(col in header.split() for col in ("MEASURED", "LEVEL", "DEBT")), report
    assert prom.returncode == 0, report
    samples = {}
    for family in text_string_to_metric_families(prom.stdout):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("key"))] = sample.value
    for name in ("trafficrate_key_measured_bytes_per_second",
                 "trafficrate_key_level_bytes_per_second", "trafficrate_key_debt_bytes"):
        assert (name, CLIENT) in samples, (name, report)
    assert samples[("trafficrate_key_debt_bytes", CLIENT)] >= 0, report
    # The watchers of the workers that serve the downloads (nginx may give
    # all 4 to one): in JSON and Prometheus, and a line in the table.
    procs = [p for p in doc["processes"] if p["connections"] > 0]
    assert procs, report
    for p in procs:
        assert p["watcher_stretch"] == 1.0, report
        assert 0 <= p["watcher_cpu_pct"] < 1.0, report
    watchers = {}
    for family in text_string_to_metric_families(prom.stdout):
        for sample in family.samples:
            if sample.name in ("trafficrate_watcher_cpu_percent",
                               "trafficrate_watcher_stretch"):
                watchers[(sample.name, int(sample.labels["pid"]))] = sample.value
    for p in procs:
        assert watchers.get(("trafficrate_watcher_stretch", p["pid"])) == 1.0, report
        assert ("trafficrate_watcher_cpu_percent", p["pid"]) in watchers, report
    assert any(l.startswith("watchers use ") and "% of a core" in l
               for l in table.stdout.splitlines()), report


# ------------------------------------------ 8. a leave, 1 s windows (last)

def test_after_a_leave_every_second_holds_the_rate(servers, lib_env, zone):
    """8 downloads, 4 on each worker; 6 of them (3 on each) close at 5 s:
    from 1 s after the leave (6 s to 14 s) the client's total is within 5%
    of the rate, and every 1 s window within 15% (the survivors must not
    wait out their old pacing gaps: that read 0.70 in the second after such
    a leave). The per-second target itself (5%) is the benchmark's
    (joinleave): on this host single 1 s windows right after the leave
    read 1.05-1.13 at the last landed commit too, so a timed test of it
    measures the host."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "budget"))
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 4, w1: 4})
    sports = ports[w0] + ports[w1]
    dset = harness.DownloadSet(server.port, [CLIENT] * 2, duration=14.3,
                               source_ports=[ports[w0][0], ports[w1][0]])
    dset.start()
    leavers = [dset.add(CLIENT, start_after=0.0, stop_after=5.0, source_port=p)
               for p in ports[w0][1:] + ports[w1][1:]]
    try:
        base = dset.start_at
        sleep_until(base + 3.0)
        seen = dset.pids_by_label()
        entry8, _, _ = key_entry(zone)
        sleep_until(base + 8.0)
        entry2, _, _ = key_entry(zone)
        sleep_until(base + 14.1)
    finally:
        stop_all(dset)
    rows = []  # (from, to, B/s, x target, read on time: harness.on_time)
    for a, b, total, _ in harness.bucket_rates(dset.downloads, base + 2.0, base + 14.0):
        rows.append((a - base, b - base, total, total / TARGET,
                     not harness.pauses_in(a, b)))
    table = "\n".join("  [%4.1f,%4.1f) %10.0f B/s %8.4f x%s" % (
        a, b, r, x, "" if a < 6.0 else "  checked" if on_time else
        "  not judged: the test client stood still") for a, b, r, x, on_time in rows)
    report = ("%s, client %s: 8 downloads (4 per worker), 6 close at 5 s\n%s\n"
              "owners %s\nstat at 3 s: %s\nstat at 8 s: %s\n%s"
              % (server.title, CLIENT, table, {l: sorted(p) for l, p in seen.items()},
                 entry8, entry2, "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    assert len(leavers) == 6 and len(sports) == 8
    assert sorted(min(p) for p in seen.values()) == sorted([w0] * 4 + [w1] * 4), report
    assert entry8 is not None and entry8["active"] == 8, report
    assert entry2 is not None and entry2["active"] == 2, report
    after = [r for r in rows if r[0] >= 6.0]
    assert len(after) == 8, report
    after = [r for r in after if r[4]]
    harness.require_on_time(8, len(after), report)
    total = sum(r[3] for r in after) / len(after)
    assert abs(total - 1.0) <= 0.05, "total %.4f x over 6-14 s\n%s" % (total, report)
    bad = [r for r in after if abs(r[3] - 1.0) > 0.15]
    assert not bad, "1 s windows off by more than 15%%: %s\n%s" % (bad, report)
