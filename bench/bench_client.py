"""The benchmark's client (bench/budget.py): a single-threaded epoll HTTP
client, Conn / Reader. Every connection records (monotonic time, cumulative
bytes received) after each recv, so rates over any window come from the
client's own byte counts. One Reader holds thousands of sockets, opens
connections at scheduled times, closes them at scheduled times, and can
read a connection slowly (a token bucket on the client side with a small
SO_RCVBUF).

drive() runs client connections against one server and measures them (a
Run); drive_parallel() runs several servers' clients at once, each in a
forked process. Standard library only (Debian's /usr/bin/python3).
"""

import array
import bisect
import errno
import heapq
import os
import pickle
import select
import socket
import threading
import time
import traceback

from bench_figures import total_rate, windows
from benchlib import BIG_FILE, SERVER_HOST, shaper_cost, worker_split

# ------------------------------------------------------------------- requests

def http_request(port, path=BIG_FILE, byte_range=None, keepalive=False):
    head = "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: trafficrate-bench\r\n" % (
        path, SERVER_HOST, port)
    if byte_range:
        head += "Range: bytes=%d-%d\r\n" % byte_range
    head += "Connection: %s\r\n\r\n" % ("keep-alive" if keepalive else "close")
    return head.encode()


# --------------------------------------------------------------------- client

class Conn:
    """One client connection of a Reader and its byte record.

    Bytes are everything received on the socket (response head + body): the
    server's kernel paces both. bytes_at() / rate() have the same meaning as
    harness.Download's, so harness.bucket_rates() works on Conns too.
    """

    __slots__ = ("source", "request", "start_at", "stop_at", "source_port",
                 "rcvbuf", "read_rate", "label", "group", "sock", "fd", "state",
                 "connected_at", "first_byte_at", "done_at", "local_port",
                 "status", "error", "eof", "total", "times", "totals", "credit",
                 "credit_at")

    def __init__(self, source, request, start_at, stop_at=None, source_port=0,
                 rcvbuf=None, read_rate=None, label=None, group=None):
        self.source, self.request = source, request
        self.start_at, self.stop_at = start_at, stop_at
        self.source_port, self.rcvbuf, self.read_rate = source_port, rcvbuf, read_rate
        self.label, self.group = label, group
        self.sock = self.fd = None
        self.state = "pending"  # -> connecting -> open -> done
        self.connected_at = self.first_byte_at = self.done_at = None
        self.local_port = self.status = self.error = None
        self.eof = False
        self.total = 0
        self.times = array.array("d")
        self.totals = array.array("q")
        self.credit = 0.0
        self.credit_at = None

    def bytes_at(self, t):
        i = bisect.bisect_right(self.times, t)
        return self.totals[i - 1] if i else 0

    def rate(self, t0, t1):
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)


class Reader:
    """Single-threaded epoll client for many HTTP connections to one port.

    add() schedules a Conn (opened at its start_at, closed at its stop_at or
    when the server closes); run(until) serves every socket until a monotonic
    time, bounded. At most max_opening connections may be between connect
    and their first response byte at once (so thousands of connections do not
    overflow the server's accept queue).
    """

    RECV_SIZE = 256 * 1024
    SLOW_CHUNK = 1024  # a slow reader reads once it has this much credit

    def __init__(self, port, host=SERVER_HOST, max_opening=256):
        self.port, self.host = port, host
        self.max_opening = max_opening
        self.ep = select.epoll()
        self.by_fd = {}
        self.pending = []  # heap (start_at, seq, conn)
        self.stops = []    # heap (stop_at, seq, conn)
        self.slow = set()
        self.conns = []
        self.opening = 0
        self.first_bytes = 0
        self.finished = 0
        self._seq = 0
        self._buf = memoryview(bytearray(self.RECV_SIZE))

    def add(self, conn):
        self._seq += 1
        heapq.heappush(self.pending, (conn.start_at, self._seq, conn))
        if conn.stop_at is not None:
            heapq.heappush(self.stops, (conn.stop_at, self._seq, conn))
        self.conns.append(conn)
        return conn

    # ---- the loop

    def run(self, until, stop_when=None):
        """Serve sockets until monotonic time `until` (or stop_when() is
        true, checked every 20 ms)."""
        ep, by_fd = self.ep, self.by_fd
        checked = 0.0
        while True:
            now = time.monotonic()
            if now >= until:
                return
            if stop_when is not None and now - checked >= 0.02:
                checked = now
                if stop_when():
                    return
            self._start_due(now)
            self._stop_due(now)
            timeout = min(until - now, 0.05)
            if self.slow:
                timeout = min(timeout, 0.01)
            if self.pending and self.opening < self.max_opening:
                timeout = min(timeout, max(0.0, self.pending[0][0] - now))
            if self.stops:
                timeout = min(timeout, max(0.0, self.stops[0][0] - now))
            for fd, _ in ep.poll(max(timeout, 0.0005)):
                c = by_fd.get(fd)
                if c is None:
                    continue
                if c.state == "connecting":
                    self._connected(c)
                else:
                    self._recv(c, self.RECV_SIZE)
            if self.slow:
                self._read_slow(time.monotonic())

    def close_all(self):
        for c in list(self.by_fd.values()):
            self._close(c)
        self.pending.clear()
        self.stops.clear()
        self.ep.close()

    # ---- internals

    def _start_due(self, now):
        while (self.pending and self.pending[0][0] <= now
               and self.opening < self.max_opening):
            c = heapq.heappop(self.pending)[2]
            if c.stop_at is not None and c.stop_at <= now:
                c.state = "done"
                continue
            self._open(c)

    def _stop_due(self, now):
        while self.stops and self.stops[0][0] <= now:
            c = heapq.heappop(self.stops)[2]
            if c.state in ("connecting", "open"):
                self._close(c)

    def _open(self, c):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if c.rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, c.rcvbuf)
            if c.source_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if c.source or c.source_port:
                sock.bind((c.source or "0.0.0.0", c.source_port))
            rc = sock.connect_ex((self.host, self.port))
            if rc not in (0, errno.EINPROGRESS):
                raise OSError(rc, os.strerror(rc))
        except OSError as e:
            sock.close()
            c.error = "connect: %s" % e
            c.state = "done"
            return
        c.sock, c.fd, c.state = sock, sock.fileno(), "connecting"
        self.by_fd[c.fd] = c
        self.ep.register(c.fd, select.EPOLLOUT)
        self.opening += 1

    def _connected(self, c):
        err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._fail(c, "connect: %s" % os.strerror(err))
            return
        c.connected_at = time.monotonic()
        c.local_port = c.sock.getsockname()[1]
        try:
            sent = c.sock.send(c.request)
        except OSError as e:
            self._fail(c, "send: %s" % e)
            return
        if sent != len(c.request):
            self._fail(c, "request only partly sent")
            return
        c.state = "open"
        c.times.append(c.connected_at)
        c.totals.append(0)
        if c.read_rate:
            self.ep.unregister(c.fd)  # read by _read_slow() on the clock
            c.credit, c.credit_at = 0.0, c.connected_at
            self.slow.add(c)
        else:
            self.ep.modify(c.fd, select.EPOLLIN)

    def _recv(self, c, size):
        try:
            n = c.sock.recv_into(self._buf, size)
        except BlockingIOError:
            return 0
        except OSError as e:
            self._fail(c, "recv: %s" % e)
            return 0
        now = time.monotonic()
        if n == 0:
            c.eof = True
            self._close(c)
            return 0
        if c.first_byte_at is None:
            c.first_byte_at = now
            self.first_bytes += 1
            self.opening -= 1
            if n >= 12:
                try:
                    c.status = int(bytes(self._buf[9:12]))
                except ValueError:
                    c.status = -1
        c.total += n
        c.times.append(now)
        c.totals.append(c.total)
        return n

    def _read_slow(self, now):
        for c in list(self.slow):
            c.credit = min(c.credit + (now - c.credit_at) * c.read_rate,
                           max(self.SLOW_CHUNK, 0.1 * c.read_rate))
            c.credit_at = now
            if c.credit >= self.SLOW_CHUNK:
                c.credit -= self._recv(c, int(c.credit))

    def _fail(self, c, text):
        c.error = text
        self._close(c)

    def _close(self, c):
        if c.state in ("connecting", "open"):
            if c.first_byte_at is None:
                self.opening -= 1
            self.slow.discard(c)
            self.by_fd.pop(c.fd, None)
            try:
                self.ep.unregister(c.fd)
            except (OSError, ValueError):
                pass  # slow readers are not registered
            c.sock.close()
            c.done_at = time.monotonic()
            self.finished += 1
        c.state = "done"
        c.sock = None


class Run:
    """What drive() measured: conns (parallel to the specs), base (the
    scheduled start), t0..t1 (the measurement window), split (connections
    per worker pid, from ss at t1), stat (the zone's entry for the first
    spec's source at t1), marks (what the hooks returned)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def rate(self, conns=None):
        return total_rate(self.conns if conns is None else conns, self.t0, self.t1)

    def windows(self, conns=None):
        return windows(self.conns if conns is None else conns, self.t0, self.t1)


def drive(bench, srv, specs, duration, warm=None, max_opening=256,
          connect_timeout=10.0, hook=None, split_at=None, ports=None):
    """Run client connections against srv and measure them.

    specs: dicts with source (client address), and optionally start / stop
    (seconds after the scheduled start; default 0 / the end), request (bytes;
    default a GET of the big file), read_rate and rcvbuf (a slow reader),
    place (default True: connections of one source alternate between the two
    nginx workers, see Bench.place), label, group.
    With warm: the window starts `warm` s after every connection with start 0
    has connected and lasts `duration` s; without: base .. base + duration.
    hook(when) with when "start" / "end" of the window returns a dict kept
    in marks (e.g. CPU times). split_at: seconds after base at which to
    record which worker serves which connection (ss, in a thread so the
    reader keeps reading); default at the end of the window. ports: the
    source ports, one per spec (placed()), if already chosen. Every wait is
    bounded.
    """
    if ports is None:
        ports = placed(bench, srv, specs)
    reader = Reader(srv.port, max_opening=max_opening)
    base = time.monotonic() + 0.05
    conns = []
    for i, spec in enumerate(specs):
        stop = spec.get("stop")
        conns.append(reader.add(Conn(
            spec["source"], spec.get("request") or http_request(srv.port),
            base + spec.get("start", 0.0),
            None if stop is None else base + stop, source_port=ports[i],
            rcvbuf=spec.get("rcvbuf"), read_rate=spec.get("read_rate"),
            label=spec.get("label") or "%s#%d" % (spec["source"], i),
            group=spec.get("group"))))
    marks = {}
    try:
        if warm is None:
            t0 = base
        else:
            initial = [c for c, s in zip(conns, specs) if not s.get("start")]
            reader.run(base + connect_timeout, stop_when=lambda: all(
                c.connected_at is not None or c.state == "done" for c in initial))
            connected = [c.connected_at for c in initial if c.connected_at]
            if len(connected) < len(initial):
                bench.warn("%d of %d connections did not connect within %.0f s"
                           % (len(initial) - len(connected), len(initial),
                              connect_timeout))
            t0 = (max(connected) if connected else time.monotonic()) + warm
        t1 = t0 + duration
        events = [(t0, 1, "start"), (t1 + 0.02, 2, "end")]
        if split_at is not None:
            events.append((base + split_at, 0, "split"))
        split, stat, helper = {}, {}, None
        for when, _, what in sorted(events):
            reader.run(when)
            if what == "split":
                # ss and stat in a thread: the reader keeps timestamping.
                open_now = [c for c in conns if c.state == "open"]

                def look(open_now=open_now):
                    split.update(worker_split(srv, open_now))
                    stat.update(bench.stat(srv, specs[0]["source"]))
                helper = threading.Thread(target=look, daemon=True)
                helper.start()
            else:
                cpu = os.times()
                marks["client_cpu_" + what] = cpu.user + cpu.system
                if hook:
                    marks[what] = hook(what)
        if helper is None:
            split = worker_split(srv, [c for c in conns if c.state == "open"])
            stat = bench.stat(srv, specs[0]["source"])
        else:
            helper.join(10.0)
        shaping = shaper_cost(srv)
        shaping["seconds"] = time.monotonic() - base
    finally:
        reader.close_all()
    # How busy the reader itself was (near 100: it may have lagged).
    client_cpu = 100.0 * (marks["client_cpu_end"] - marks["client_cpu_start"]) / (
        t1 + 0.02 - t0)
    return Run(conns=conns, specs=specs, base=base, t0=t0, t1=t1, split=split,
               stat=stat, marks=marks, errors=errors(conns), shaping=shaping,
               client_cpu_pct=round(client_cpu, 1))


def placed(bench, srv, specs):
    """Source ports for specs (0: any): the specs of one source with place
    (default True) take srv's workers in turn (Bench.place)."""
    by_source = {}
    for i, spec in enumerate(specs):
        if spec.get("place", True):
            by_source.setdefault(spec["source"], []).append(i)
    ports = [0] * len(specs)
    for source, idx in by_source.items():
        for i, port in zip(idx, bench.place(srv, source, len(idx))):
            ports[i] = port
    return ports


def drive_parallel(bench, jobs, duration, limit_s=120.0, **kw):
    """drive() for several servers at once: jobs is a list of (srv, specs);
    returns their Runs in order, or for a job that failed the exception's
    text (a str). Source ports are chosen here first, one server after the
    other (the probes must not collide); then each job's client runs in a
    process of its own, forked, so that one Python reader's work never
    delays another's timestamps. Warnings of the children reach bench.warn.
    Every child is waited for at most limit_s and killed (by pid) after."""
    ports = [placed(bench, srv, specs) for srv, specs in jobs]
    children = []
    try:
        for (srv, specs), job_ports in zip(jobs, ports):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: drive, send back the Run, exit
                os.close(r)
                try:
                    bench.warnings = []
                    run = drive(bench, srv, specs, duration, ports=job_ports, **kw)
                    for c in run.conns:
                        c.sock = None
                    data = pickle.dumps((run, bench.warnings))
                except BaseException:
                    data = pickle.dumps(("drive failed: " + traceback.format_exc(),
                                         bench.warnings))
                try:
                    with os.fdopen(w, "wb") as f:
                        f.write(data)
                finally:
                    os._exit(0)
            os.close(w)
            children.append([pid, r, bytearray(), False])
        deadline = time.monotonic() + limit_s
        while not all(ch[3] for ch in children):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            open_fds = [ch[1] for ch in children if not ch[3]]
            ready, _, _ = select.select(open_fds, [], [], min(left, 1.0))
            for ch in children:
                if ch[1] in ready:
                    chunk = os.read(ch[1], 1 << 20)
                    if chunk:
                        ch[2] += chunk
                    else:
                        ch[3] = True
    finally:
        for ch in children:
            if not ch[3]:
                os.kill(ch[0], 9)
            os.close(ch[1])
            os.waitpid(ch[0], 0)
    runs = []
    for (srv, _), ch in zip(jobs, children):
        if not ch[3]:
            runs.append("its client did not finish within %.0f s" % limit_s)
            continue
        if not ch[2]:
            runs.append("its client exited without a result")
            continue
        result, warnings = pickle.loads(bytes(ch[2]))
        for text in warnings:
            bench.warn(text)
        runs.append(result)
    return runs


def errors(conns):
    return ["%s: %s" % (c.label or c.source, c.error) for c in conns if c.error]


def bad_status(conns, ok=(200, 206)):
    return [c for c in conns if c.status is not None and c.status not in ok]
